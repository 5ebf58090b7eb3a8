// Package kubeversion says which Kubernetes versions csi-volmgr supports
// and what the API server of a version serves of the features the agent
// uses: the agent asks the API server its version at start (discovery's
// /version), warns when it is outside the supported range, and tells in
// one log line per feature what behaves as the kubelet of that version
// does rather than as the newest (docs/operations.md, "Supported
// Kubernetes versions").
//
// The range follows the kubelet's skew policy: the newest minor csi-volmgr
// is built and tested against and the three minors before it, each tested
// by `make test-skew`.
package kubeversion

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/version"
	"k8s.io/klog/v2"
)

// The supported minors of Kubernetes 1.x, both included.
const (
	// OldestMinor is the oldest supported minor (1.34).
	OldestMinor = 34
	// NewestMinor is the newest supported minor (1.37), the one the
	// Go modules, the test binaries and the kind node image are of.
	NewestMinor = 37
)

// Range is the supported range as the documentation names it.
var Range = fmt.Sprintf("v1.%d to v1.%d", OldestMinor, NewestMinor)

// Version is an API server's Kubernetes version, major.minor.
type Version struct {
	Major, Minor int
	// GitVersion is the server's full version, e.g. v1.34.4 or
	// v1.35.2-gke.1000, for messages.
	GitVersion string
}

// Parse reads a discovery /version answer. Providers append to the minor
// ("34+" on GKE and EKS): the leading digits count.
func Parse(info *version.Info) (Version, error) {
	if info == nil {
		return Version{}, errors.New("no version info")
	}
	major, err := leadingInt(info.Major)
	if err != nil {
		return Version{}, fmt.Errorf("major version %q of %q: %w", info.Major, info.GitVersion, err)
	}
	minor, err := leadingInt(info.Minor)
	if err != nil {
		return Version{}, fmt.Errorf("minor version %q of %q: %w", info.Minor, info.GitVersion, err)
	}
	return Version{Major: major, Minor: minor, GitVersion: info.GitVersion}, nil
}

// leadingInt parses the digits s starts with; there must be some.
func leadingInt(s string) (int, error) {
	end := strings.IndexFunc(s, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(s)
	}
	if end == 0 {
		return 0, errors.New("not a number")
	}
	return strconv.Atoi(s[:end])
}

// String is major.minor with the full version, e.g. "1.34 (v1.34.4)"; a
// binary built without version stamps (v0.0.0-master+$Format:%H$) says
// its minor only.
func (v Version) String() string {
	if v.GitVersion == "" || strings.HasPrefix(v.GitVersion, "v0.0.0") {
		return fmt.Sprintf("%d.%d", v.Major, v.Minor)
	}
	return fmt.Sprintf("%d.%d (%s)", v.Major, v.Minor, v.GitVersion)
}

// AtLeast tells whether v is 1.minor or newer.
func (v Version) AtLeast(minor int) bool {
	return v.Major > 1 || (v.Major == 1 && v.Minor >= minor)
}

// Supported tells whether v is in the supported range.
func (v Version) Supported() bool {
	return v.Major == 1 && v.Minor >= OldestMinor && v.Minor <= NewestMinor
}

// Features are the behaviours of the agent that depend on the API
// server's version. The zero value is what the agent does when it cannot
// tell the version: the oldest supported minor's behaviour, the cautious
// one (it never writes what an older API server refuses, and never mounts
// with an SELinux context where the kubelet of that version would not).
type Features struct {
	// MutableCSINodeAllocatableCount: the API server keeps CSIDriver's
	// nodeAllocatableUpdatePeriodSeconds and VolumeAttachment's
	// attachError.errorCode, and lets a CSINode's allocatable count change
	// (KEP-4876; on by default from 1.35, GA in 1.36). Without it the
	// agent writes a driver's count at registration only, as the kubelet
	// of 1.34 does, and an attach that failed for the limit is an
	// AttachFailed like any other.
	MutableCSINodeAllocatableCount bool
	// SELinuxMountAllAccessModes: the kubelet of this minor mounts volumes
	// of every access mode with -o context (SELinuxMount, GA and on by
	// default in 1.37). Before, only ReadWriteOncePod volumes are
	// (SELinuxMountReadWriteOncePod), and the others are relabelled by the
	// container runtime as before.
	SELinuxMountAllAccessModes bool
}

// Features returns what v serves with its default feature gates.
func (v Version) Features() Features {
	return Features{
		MutableCSINodeAllocatableCount: v.AtLeast(35),
		SELinuxMountAllAccessModes:     v.AtLeast(37),
	}
}

// Newest returns the features of the newest supported minor: everything on.
func Newest() Features { return Version{Major: 1, Minor: NewestMinor}.Features() }

// Server is what Detect asks:
// discovery.ServerVersionInterfaceWithContext.
type Server interface {
	ServerVersionWithContext(ctx context.Context) (*version.Info, error)
}

// Detect asks the API server its version, trying again every second until
// it answers or timeout passes (the agent may start before its API
// server).
func Detect(ctx context.Context, server Server, timeout time.Duration) (Version, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		info, err := server.ServerVersionWithContext(ctx)
		if err == nil {
			return Parse(info)
		}
		select {
		case <-ctx.Done():
			return Version{}, fmt.Errorf("asking the API server its version: %w", err)
		case <-time.After(time.Second):
		}
	}
}

// Report logs, once at start, what the agent makes of the API server's
// version (err: it could not be read): a warning outside the supported
// range, and one line per feature the server's minor lacks, saying how the
// agent behaves instead. It returns the features to run with.
func Report(logger klog.Logger, v Version, err error) Features {
	if err != nil {
		logger.Error(err, "Could not read the API server's version; running as with the oldest supported minor (features of newer minors off)",
			"supported", Range)
		f := Features{}
		logDegraded(logger, f)
		return f
	}
	switch {
	case !v.Supported() && v.AtLeast(NewestMinor+1):
		logger.Error(nil, "The API server is newer than csi-volmgr supports; it runs as with the newest supported minor, features of newer minors are not used",
			"serverVersion", v.String(), "supported", Range)
	case !v.Supported():
		logger.Error(nil, "The API server is older than csi-volmgr supports; volumes may fail to mount, upgrade the control plane",
			"serverVersion", v.String(), "supported", Range)
	default:
		logger.V(2).Info("The API server's version is supported", "serverVersion", v.String(), "supported", Range)
	}
	f := v.Features()
	logDegraded(logger, f)
	return f
}

// logDegraded logs one line per feature that is off.
func logDegraded(logger klog.Logger, f Features) {
	if !f.MutableCSINodeAllocatableCount {
		logger.Info("The API server does not serve mutable CSINode allocatable counts (MutableCSINodeAllocatableCount, on by default from v1.35): "+
			"drivers' allocatable counts are written at registration only, nodeAllocatableUpdatePeriodSeconds is not refreshed, "+
			"and an attach that failed for the node's limit shows as AttachFailed, not VolumeAttachmentLimitExceeded",
			"feature", "MutableCSINodeAllocatableCount")
	}
	if !f.SELinuxMountAllAccessModes {
		logger.Info("The API server's minor mounts only ReadWriteOncePod volumes with an SELinux context (SELinuxMount, on by default from v1.37): "+
			"volumes of other access modes of drivers with seLinuxMount are mounted without -o context and relabelled by the container runtime, as the kubelet of that minor does",
			"feature", "SELinuxMount")
	}
}
