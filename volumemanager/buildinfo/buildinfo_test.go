package buildinfo

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestBuildInfoGauge: csi_volmgr_build_info is 1 with the build's fields
// as labels.
func TestBuildInfoGauge(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector())
	info := Get()
	want := `# HELP csi_volmgr_build_info A metric with a constant '1' value labeled by the git version, commit and tree state, build date, Go version, compiler and platform csi-volmgr was built from.
# TYPE csi_volmgr_build_info gauge
csi_volmgr_build_info{build_date="` + info.BuildDate + `",compiler="` + info.Compiler + `",git_commit="",git_tree_state="",git_version="` + info.GitVersion + `",go_version="` + info.GoVersion + `",platform="` + info.Platform + `"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "csi_volmgr_build_info"); err != nil {
		t.Error(err)
	}
}
