// Package buildinfo says which build of csi-volmgr is running: the fields
// of the Kubernetes components' version (k8s.io/apimachinery/pkg/version
// Info), set by the Makefile's -ldflags, as `csi-volmgr version`, the
// csi_volmgr_build_info gauge and the API's VersionPath report them.
//
// The variables are csi-volmgr's own, not k8s.io/component-base/version's:
// that one also feeds the Kubernetes libraries' notion of their own
// version (metric deprecation, emulation versions), which must stay theirs.
package buildinfo

import (
	"fmt"
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/version"
)

// Set with -ldflags "-X github.com/csi-volmgr/csi-volmgr/volumemanager/buildinfo.gitVersion=..." (see the Makefile).
var (
	// gitVersion is `git describe --tags --always --dirty`, e.g. v0.1.0 or
	// v0.1.0-3-gabcdef0-dirty.
	gitVersion = "v0.0.0-dev"
	// gitCommit is `git rev-parse HEAD`.
	gitCommit = ""
	// gitTreeState is "clean" or "dirty".
	gitTreeState = ""
	// buildDate is the commit's date in ISO 8601 (the build's input, not
	// its time: two builds of one commit are the same).
	buildDate = "1970-01-01T00:00:00Z"
)

// Get returns the build's version.
func Get() version.Info {
	return version.Info{
		GitVersion:   gitVersion,
		GitCommit:    gitCommit,
		GitTreeState: gitTreeState,
		BuildDate:    buildDate,
		GoVersion:    runtime.Version(),
		Compiler:     runtime.Compiler,
		Platform:     fmt.Sprintf("%s/%s", runtime.GOOS, runtime.GOARCH),
	}
}

// NewCollector returns the gauge csi_volmgr_build_info, always 1, whose
// labels are the build's version fields, as the Kubernetes components'
// kubernetes_build_info.
func NewCollector() prometheus.Collector {
	info := Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "csi_volmgr_build_info",
		Help: "A metric with a constant '1' value labeled by the git version, commit and tree state, build date, Go version, compiler and platform csi-volmgr was built from.",
		ConstLabels: prometheus.Labels{
			"git_version": info.GitVersion, "git_commit": info.GitCommit, "git_tree_state": info.GitTreeState,
			"build_date": info.BuildDate, "go_version": info.GoVersion, "compiler": info.Compiler, "platform": info.Platform,
		},
	})
	g.Set(1)
	return g
}
