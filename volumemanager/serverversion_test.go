package volumemanager

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/apimachinery/pkg/version"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/csi-volmgr/csi-volmgr/driver/nodeinfo"
)

// detect runs detectServer against a fake API server of the given minor
// ("" for one whose version cannot be read) and returns what it logged.
func detect(t *testing.T, minor string) (*VolumeManager, string) {
	t.Helper()
	client := fake.NewClientset()
	client.Discovery().(*fakediscovery.FakeDiscovery).FakedServerVersion = &version.Info{
		Major: "1", Minor: minor, GitVersion: "v1." + minor + ".0"}
	vm := &VolumeManager{cfg: Config{KubeClient: client}, serverKnown: make(chan struct{})}
	var buf bytes.Buffer
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&buf), textlogger.Verbosity(0)))
	vm.detectServer(klog.NewContext(t.Context(), logger))
	return vm, buf.String()
}

// TestServerVersion: the API server's minor decides how the agent mounts
// with SELinux and whether it refreshes allocatable counts; each feature
// the minor lacks is said once in the log, and a version the agent cannot
// read falls back to the oldest supported minor's behaviour.
func TestServerVersion(t *testing.T) {
	for _, tc := range []struct {
		minor            string
		rwopOnly         bool
		mutable          bool
		logs, wantAbsent []string
	}{
		{minor: "34", rwopOnly: true, mutable: false, logs: []string{`feature="MutableCSINodeAllocatableCount"`, `feature="SELinuxMount"`}},
		{minor: "35", rwopOnly: true, mutable: true, logs: []string{`feature="SELinuxMount"`}, wantAbsent: []string{"MutableCSINodeAllocatableCount"}},
		{minor: "37", rwopOnly: false, mutable: true, wantAbsent: []string{"feature="}},
		{minor: "31", rwopOnly: true, mutable: false, logs: []string{"older than csi-volmgr supports", `supported="v1.34 to v1.37"`}},
		{minor: "", rwopOnly: true, mutable: false, logs: []string{"Could not read the API server's version"}},
	} {
		t.Run("1."+tc.minor, func(t *testing.T) {
			vm, out := detect(t, tc.minor)
			if got := vm.seLinuxMountReadWriteOncePodOnly(); got != tc.rwopOnly {
				t.Errorf("SELinux mount for ReadWriteOncePod only = %v, want %v", got, tc.rwopOnly)
			}
			f, ok := vm.serverFeatures(t.Context())
			if !ok || f.MutableCSINodeAllocatableCount != tc.mutable {
				t.Errorf("features %+v (known %v), want MutableCSINodeAllocatableCount %v", f, ok, tc.mutable)
			}
			for _, want := range tc.logs {
				if !strings.Contains(out, want) {
					t.Errorf("log lacks %q:\n%s", want, out)
				}
			}
			for _, absent := range tc.wantAbsent {
				if strings.Contains(out, absent) {
					t.Errorf("log has %q:\n%s", absent, out)
				}
			}
		})
	}
}

// countingNodeInfo counts the allocatable writes the refresher makes.
type countingNodeInfo struct{ writes chan string }

func (c countingNodeInfo) UpdateAllocatable(_ context.Context, driver string, _ int64) error {
	c.writes <- driver
	return nil
}

type fixedInfo struct{}

func (fixedInfo) NodeGetInfo(context.Context) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{MaxVolumesPerNode: 9}, nil
}

// TestAllocatableRefresherOnlyWhereMutable: against an API server of 1.34
// (CSINode allocatable counts immutable) the refresher never runs, so an
// attach-limit refresh writes nothing the API server would refuse; from
// 1.35 it writes the driver's new count.
func TestAllocatableRefresherOnlyWhereMutable(t *testing.T) {
	for minor, wantWrite := range map[string]bool{"34": false, "35": true} {
		t.Run("1."+minor, func(t *testing.T) {
			vm, _ := detect(t, minor)
			writes := make(chan string, 1)
			r, err := nodeinfo.NewAllocatableRefresher(nodeinfo.AllocatableConfig{
				NodeInfo: countingNodeInfo{writes},
				Client:   func(string) (nodeinfo.InfoClient, bool) { return fixedInfo{}, true },
				Period:   func(string) time.Duration { return 0 },
			})
			if err != nil {
				t.Fatal(err)
			}
			vm.allocatable = r
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan struct{})
			go func() { defer close(done); vm.runAllocatable(ctx) }()
			attachLimits{r}.ResourceExhausted("d")
			select {
			case <-writes:
				if !wantWrite {
					t.Error("the refresher wrote the CSINode's allocatable count; want no write on 1.34")
				}
			case <-time.After(time.Second):
				if wantWrite {
					t.Error("no allocatable count written within 1s; want the refresh on 1.35")
				}
			}
			cancel()
			<-done
		})
	}
}
