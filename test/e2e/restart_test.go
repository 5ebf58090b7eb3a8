package e2e_test

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/mount-utils"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

// createVolumeWith creates a filesystem volume with CreateVolume parameters.
func createVolumeWith(t *testing.T, p *plugintest.Plugin, name string, params map[string]string) plugin.Volume {
	t.Helper()
	conn, err := p.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := csi.NewControllerClient(conn).CreateVolume(t.Context(), &csi.CreateVolumeRequest{
		Name: name, Parameters: params,
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}},
	})
	if err != nil {
		t.Fatalf("CreateVolume %s: %v", name, err)
	}
	vols, err := p.Volumes()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vols {
		if v.ID == resp.GetVolume().GetVolumeId() {
			return v
		}
	}
	t.Fatalf("volume %s not in the plugin's state", resp.GetVolume().GetVolumeId())
	return plugin.Volume{}
}

// callsAfter returns the plugin's node calls for handle made by processes
// other than the one with pid (the plugin after its restart).
func callsAfter(t *testing.T, p *plugintest.Plugin, handle string, pid int) []plugin.Call {
	t.Helper()
	var out []plugin.Call
	for _, c := range volumeCalls(t, p, handle) {
		if c.PID != pid {
			out = append(out, c)
		}
	}
	return out
}

// TestDriverRestartRepairsBrokenMounts kills the plugin with three pods
// running on it: one volume is FUSE-backed (its mounts die with the
// plugin: ENOTCONN), one pod's target is lazily unmounted behind the
// agent's back, one volume is left healthy. When the plugin is back and
// registers again, the agent repairs the FUSE volume (its target
// unpublished, the staging path unstaged, then staged and published again)
// and the lost target (unpublished, then published again); the pods see
// their data through the mounts, the healthy neighbour gets no call, the
// recoveries are counted and reported on the pods, and once the pods are
// gone every volume is unstaged.
func TestDriverRestartRepairsBrokenMounts(t *testing.T) {
	t.Parallel()
	driverRestartRepairs(t, false)
}

// TestDriverRestartRepairsBrokenMountsStrictDriver is the same against the
// plugin in strict mode, as stock drivers behave: a NodePublishVolume over
// a broken target fails (a FUSE driver's stat of its target), and a target
// published over without an unpublish is recorded twice and then blocks
// every NodeUnstageVolume (csi-driver-host-path).
func TestDriverRestartRepairsBrokenMountsStrictDriver(t *testing.T) {
	t.Parallel()
	driverRestartRepairs(t, true)
}

func driverRestartRepairs(t *testing.T, strict bool) {
	f := k8stest.New(t)
	f.CreateNode(t)
	a := startAgent(t, f, agentOptions{})
	driver := uniqueDriverName()
	createCSIDriver(t, f, driver, false)
	p := startPlugin(t, a, driver, nodeCaps())
	if strict {
		if err := p.SetControl(plugin.FaultConfig{Strict: true}); err != nil {
			t.Fatal(err)
		}
	}

	type use struct {
		vol    plugin.Volume
		pvName string
		pod    *corev1.Pod
	}
	uses := map[string]*use{}
	for _, name := range []string{"fuse", "lost", "healthy"} {
		params := map[string]string{}
		if name == "fuse" {
			params[plugin.FuseParameter] = "true"
		}
		u := &use{vol: createVolumeWith(t, p, name, params), pvName: "pv-" + name + "-" + f.Namespace}
		createBoundClaim(t, f, claim{PVName: u.pvName, PVCName: name, Driver: driver, Handle: u.vol.ID})
		u.pod = createPod(t, f, "app-"+name, podVolume{Name: "data", ClaimName: name})
		uses[name] = u
	}
	for name, u := range uses {
		waitReady(t, f, u.pod)
		target := publishPaths(a, u.pod, u.pvName).Target
		if err := os.WriteFile(filepath.Join(target, "data"), []byte(name), 0o644); err != nil {
			t.Fatalf("writing through %s: %v", target, err)
		}
	}
	fuseStaging := stagingPaths(a, driver, uses["fuse"].vol.ID).Path
	if _, err := os.Stat(fuseStaging); err != nil {
		t.Fatal(err)
	}

	oldPID := p.PID()
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	lost := publishPaths(a, uses["lost"].pod, uses["lost"].pvName).Target
	if err := unix.Unmount(lost, unix.MNT_DETACH); err != nil {
		t.Fatalf("lazily unmounting %s: %v", lost, err)
	}
	if _, err := os.Stat(publishPaths(a, uses["fuse"].pod, uses["fuse"].pvName).Target); !errors.Is(err, unix.ENOTCONN) {
		t.Fatalf("the FUSE volume's target after the plugin died: %v, want ENOTCONN", err)
	}
	if err := p.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}

	mounter := mount.New("")
	for name, u := range uses {
		target := publishPaths(a, u.pod, u.pvName).Target
		eventually(t, "the "+name+" volume's data through its target", func() (bool, error) {
			got, err := os.ReadFile(filepath.Join(target, "data"))
			if err != nil || string(got) != name {
				return false, fmt.Errorf("read %q: %w", got, err)
			}
			ok, err := mounter.IsMountPoint(target)
			return ok, err
		})
		waitReady(t, f, u.pod)
	}
	for _, name := range []string{"fuse", "lost"} {
		waitPodEvent(t, f, uses[name].pod, corev1.EventTypeNormal, status.EventVolumeRecovered, "set up again")
	}

	methodsAfter := func(name string) []string { return methods(callsAfter(t, p, uses[name].vol.ID, oldPID)) }
	if got := methodsAfter("healthy"); len(got) != 0 {
		t.Errorf("the healthy neighbour got calls after the restart: %q", got)
	}
	if got, want := methodsAfter("lost"), []string{nodeUnpublish + "=OK", nodePublish + "=OK"}; !slices.Equal(got, want) {
		t.Errorf("calls for the lost target after the restart = %q, want %q", got, want)
	}
	if got, want := methodsAfter("fuse"), []string{nodeUnpublish + "=OK", nodeUnstage + "=OK", nodeStage + "=OK", nodePublish + "=OK"}; !slices.Equal(got, want) {
		t.Errorf("calls for the FUSE volume after the restart = %q, want %q", got, want)
	}
	for _, c := range []struct {
		path string
		want float64
	}{{"staging", 1}, {"target", 2}} {
		labels := map[string]string{"driver": driver, "path": c.path}
		if got := a.counter(t, "csi_volmgr_mount_recoveries_total", labels); got != c.want {
			t.Errorf("csi_volmgr_mount_recoveries_total%v = %v, want %v", labels, got, c.want)
		}
	}

	for _, u := range uses {
		deletePod(t, f, u.pod)
	}
	eventually(t, "every volume unstaged in the plugin once the pods are gone", func() (bool, error) {
		vols, err := p.Volumes()
		if err != nil {
			return false, err
		}
		for _, v := range vols {
			if v.Staged != nil || len(v.Published) > 0 {
				return false, fmt.Errorf("volume %s: staged %v, published at %v", v.Name, v.Staged != nil, slices.Collect(maps.Keys(v.Published)))
			}
		}
		return true, nil
	})
}

// waitPodEvent waits for an Event of eventType and reason on the pod whose
// message contains msgPart.
func waitPodEvent(t *testing.T, f *k8stest.Fixture, pod *corev1.Pod, eventType, reason, msgPart string) {
	t.Helper()
	eventually(t, fmt.Sprintf("%s Event on pod %s", reason, pod.Name), func() (bool, error) {
		evs, err := f.Client.CoreV1().Events(pod.Namespace).List(t.Context(), metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("involvedObject.uid", string(pod.UID)).String(),
		})
		if err != nil {
			return false, err
		}
		var seen []string
		for _, e := range evs.Items {
			if e.Reason == reason && e.Type == eventType && strings.Contains(e.Message, msgPart) {
				return true, nil
			}
			seen = append(seen, e.Type+" "+e.Reason+": "+e.Message)
		}
		return false, fmt.Errorf("events: %q", seen)
	})
}

// TestDriverRestartWithoutRegistrationRepairsMount is kubernetes#96361 as it
// happens in a real node plugin pod: the driver container restarts while
// its registrar keeps running, so no new registration arrives. The plugin
// is SIGKILLed, the pod's target is unmounted behind the agent's back and
// the plugin starts again on the same socket, with the registrar (served
// here by the test) untouched. The agent notices the restart from its
// connection to the driver, checks the driver's mounts, takes the pod's
// VolumesReady away while the target is broken, and publishes it again.
func TestDriverRestartWithoutRegistrationRepairsMount(t *testing.T) {
	t.Parallel()
	f := k8stest.New(t)
	f.CreateNode(t)
	a := startAgent(t, f, agentOptions{})
	driver := uniqueDriverName()
	createCSIDriver(t, f, driver, false)
	caps := nodeCaps()
	p := plugintest.Start(t, plugintest.Options{Name: driver, NodeID: "node-" + a.f.NodeName, Capabilities: &caps})
	reg := plugintest.StartRegistrar(t, a.RegDir, p)

	vol := createVolume(t, p, "data", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	pvName := "pv-data-" + f.Namespace
	createBoundClaim(t, f, claim{PVName: pvName, PVCName: "data", Driver: driver, Handle: vol.ID})
	pod := createPod(t, f, "app", podVolume{Name: "data", ClaimName: "data"})
	waitReady(t, f, pod)
	target := publishPaths(a, pod, pvName).Target
	if err := os.WriteFile(filepath.Join(target, "data"), []byte("kept"), 0o644); err != nil {
		t.Fatalf("writing through %s: %v", target, err)
	}
	registrations := reg.GetInfoCalls()

	oldPID := p.PID()
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Unmount(target, unix.MNT_DETACH); err != nil {
		t.Fatalf("lazily unmounting %s: %v", target, err)
	}
	// The publish after the restart fails until the condition was seen
	// False: the pod must not stay ready over the broken target.
	if err := p.SetFaults(plugin.FaultRule{Method: nodePublish, VolumeID: vol.ID, Code: codes.Internal, Message: "held by the test"}); err != nil {
		t.Fatal(err)
	}
	if err := p.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, f, pod, "VolumesReady not True over the broken target", func(c *corev1.PodCondition) bool {
		return c.Status != corev1.ConditionTrue
	})
	if err := p.ClearFaults(); err != nil {
		t.Fatal(err)
	}

	mounter := mount.New("")
	eventually(t, "the volume's data through its target again", func() (bool, error) {
		got, err := os.ReadFile(filepath.Join(target, "data"))
		if err != nil || string(got) != "kept" {
			return false, fmt.Errorf("read %q: %w", got, err)
		}
		return mounter.IsMountPoint(target)
	})
	waitReady(t, f, pod)
	waitPodEvent(t, f, pod, corev1.EventTypeNormal, status.EventVolumeRecovered, "set up again")

	if got := reg.GetInfoCalls(); got != registrations {
		t.Errorf("the registrar was asked GetInfo %d times after the restart, want none: the test must not register the driver again", got-registrations)
	}
	// The broken target is unpublished first, then published until the
	// test lets the publish through.
	if got := methods(callsAfter(t, p, vol.ID, oldPID)); len(got) < 2 || got[0] != nodeUnpublish+"=OK" || got[len(got)-1] != nodePublish+"=OK" ||
		slices.ContainsFunc(got[1:], func(m string) bool { return !strings.HasPrefix(m, nodePublish+"=") }) {
		t.Errorf("calls for the volume after the restart = %q, want NodeUnpublishVolume, then NodePublishVolume only, the last one OK", got)
	}
}
