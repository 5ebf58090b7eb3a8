package operations

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/mount-utils"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/loopdev"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

// pluginHarness runs the real test plugin and Operations over a root
// directory, with the plugin registered under its name.
type pluginHarness struct {
	*harness
	p      *plugintest.Plugin
	client *csiclient.Client
}

func startPlugin(t *testing.T, caps plugin.Capabilities) *pluginHarness {
	t.Helper()
	// The root exists before the plugin starts, so the plugin's cleanup
	// (unmount everything) runs before the root is removed.
	root := t.TempDir()
	p := plugintest.Start(t, plugintest.Options{Capabilities: &caps})
	client, err := csiclient.New(testContext(t), csiclient.Config{DriverName: p.Name, Endpoint: p.Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	h := newHarness(t, harnessOptions{root: root})
	h.mu.Lock()
	h.drivers[p.Name] = client
	h.mu.Unlock()
	pol := volume.DefaultPolicy()
	pol.AttachRequired = caps.ControllerPublish
	h.policies.set(p.Name, pol)
	return &pluginHarness{harness: h, p: p, client: client}
}

// createVolume creates a volume in the plugin and returns its Source.
func (ph *pluginHarness) createVolume(t *testing.T, pvName string, access volume.AccessType) volume.Source {
	t.Helper()
	c := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER}}
	if access == volume.Block {
		c.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
	} else {
		c.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}
	}
	resp, err := ph.client.Controller().CreateVolume(testContext(t), &csi.CreateVolumeRequest{
		Name: pvName, VolumeCapabilities: []*csi.VolumeCapability{c},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 16 << 20},
	})
	if err != nil {
		t.Fatalf("CreateVolume: %v", err)
	}
	return volume.Source{
		ID:          volume.ID{Driver: ph.p.Name, Handle: resp.GetVolume().GetVolumeId(), PVName: pvName, AccessType: access},
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
	}
}

// calls returns the methods of the plugin's journal, in the order the calls began.
func (ph *pluginHarness) calls(t *testing.T, methods ...string) []plugin.Call {
	t.Helper()
	entries, err := ph.p.ReadJournal()
	if err != nil {
		t.Fatal(err)
	}
	var out []plugin.Call
	for _, c := range plugin.Calls(entries) {
		if slices.Contains(methods, c.Begin.Method) {
			out = append(out, c)
		}
	}
	return out
}

func methodsOf(calls []plugin.Call) []string {
	var out []string
	for _, c := range calls {
		out = append(out, c.Begin.Method+":"+c.Code().String())
	}
	return out
}

// mountsUnder lists the mount points below root.
func mountsUnder(t *testing.T, root string) []string {
	t.Helper()
	mps, err := mount.New("").List()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mp := range mps {
		if strings.HasPrefix(mp.Path, root+"/") {
			out = append(out, mp.Path)
		}
	}
	return out
}

// assertClean checks that nothing the volume used is left under the root.
func (ph *pluginHarness) assertClean(t *testing.T) {
	t.Helper()
	if m := mountsUnder(t, ph.root); len(m) != 0 {
		t.Errorf("mounts left under the root: %v", m)
	}
	for _, p := range treeOf(t, ph.root) {
		if strings.Contains(p, "vol_data.json") || strings.Contains(p, "globalmount") || strings.HasPrefix(p, "/pods/") ||
			strings.Contains(p, "/volumeDevices/") {
			t.Errorf("left under the root: %s", p)
		}
	}
	if n := len(ph.world.VolumeNames()); n != 0 {
		t.Errorf("%d volumes left in the actual state", n)
	}
}

func TestRealPluginFilesystemLifecycle(t *testing.T) {
	ph := startPlugin(t, plugin.DefaultCapabilities())
	ctx := testContext(t)
	src := ph.createVolume(t, "pv-fs", volume.Filesystem)
	name := volume.PersistentName(src.Driver, src.Handle)
	a, b := keyOf(src, "uid-a"), keyOf(src, "uid-b")
	pvA, pvB := podVolume("uid-a", "pod-a"), podVolume("uid-b", "pod-b")
	pvA.ReadOnly, pvB.ReadOnly, pvA.FSGroup, pvB.FSGroup = false, false, nil, nil

	if err := ph.ops.WaitForAttach(ctx, name, src); err != nil {
		t.Fatal(err)
	}
	if err := ph.ops.Stage(ctx, name, src, nil); err != nil {
		t.Fatalf("Stage: %v", err)
	}
	for _, c := range []struct {
		key volume.PodKey
		pv  volume.PodVolume
	}{{a, pvA}, {b, pvB}} {
		if err := ph.ops.Publish(ctx, c.key, src, c.pv); err != nil {
			t.Fatalf("Publish %s: %v", c.key, err)
		}
	}
	pubA, _ := ph.ops.Layout().Publishing("uid-a", "pv-fs", volume.Filesystem)
	pubB, _ := ph.ops.Layout().Publishing("uid-b", "pv-fs", volume.Filesystem)
	for _, target := range []string{pubA.Target, pubB.Target} {
		if ok, err := mount.New("").IsMountPoint(target); err != nil || !ok {
			t.Fatalf("target %s is not a mount point: %v, %v", target, ok, err)
		}
	}
	// A file written through pod a's mount is the volume's data: pod b and
	// the plugin's backing directory see it.
	if err := os.WriteFile(filepath.Join(pubA.Target, "hello"), []byte("from pod a"), 0o600); err != nil {
		t.Fatalf("writing through the target: %v", err)
	}
	if data, err := os.ReadFile(filepath.Join(pubB.Target, "hello")); err != nil || string(data) != "from pod a" {
		t.Errorf("pod b reads %q, %v", data, err)
	}
	vols, err := ph.p.Volumes()
	if err != nil || len(vols) != 1 {
		t.Fatalf("plugin volumes: %v, %v", vols, err)
	}
	if data, err := os.ReadFile(filepath.Join(vols[0].Path, "hello")); err != nil || string(data) != "from pod a" {
		t.Errorf("the volume's directory holds %q, %v", data, err)
	}

	if err := ph.ops.Unstage(ctx, name); !errors.Is(err, volume.ErrInUse) {
		t.Errorf("Unstage while published = %v, want ErrInUse", err)
	}
	for _, key := range []volume.PodKey{a, b} {
		if err := ph.ops.Unpublish(ctx, key); err != nil {
			t.Fatalf("Unpublish %s: %v", key, err)
		}
	}
	if err := ph.ops.Unstage(ctx, name); err != nil {
		t.Fatalf("Unstage: %v", err)
	}
	ph.assertClean(t)
	if data, err := os.ReadFile(filepath.Join(vols[0].Path, "hello")); err != nil || string(data) != "from pod a" {
		t.Errorf("the volume's data after teardown: %q, %v", data, err)
	}
	got := methodsOf(ph.calls(t, "NodeStageVolume", "NodePublishVolume", "NodeUnpublishVolume", "NodeUnstageVolume"))
	want := []string{"NodeStageVolume:OK", "NodePublishVolume:OK", "NodePublishVolume:OK",
		"NodeUnpublishVolume:OK", "NodeUnpublishVolume:OK", "NodeUnstageVolume:OK"}
	if !slices.Equal(got, want) {
		t.Errorf("journal = %v, want %v", got, want)
	}
}

func TestRealPluginPublishesOverlap(t *testing.T) {
	ph := startPlugin(t, plugin.DefaultCapabilities())
	ctx := testContext(t)
	src := ph.createVolume(t, "pv-overlap", volume.Filesystem)
	if err := ph.ops.Stage(ctx, volume.PersistentName(src.Driver, src.Handle), src, nil); err != nil {
		t.Fatal(err)
	}
	if err := ph.p.SetFaults(plugin.FaultRule{Method: "NodePublishVolume", Delay: 500 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	var chans []<-chan error
	for _, uid := range []string{"uid-a", "uid-b", "uid-c"} {
		pv := podVolume(uid, "pod")
		pv.FSGroup = nil
		chans = append(chans, goErr(func() error { return ph.ops.Publish(ctx, keyOf(src, uid), src, pv) }))
	}
	for _, ch := range chans {
		if err := <-ch; err != nil {
			t.Fatalf("Publish: %v", err)
		}
	}
	calls := ph.calls(t, "NodePublishVolume")
	if len(calls) != 3 {
		t.Fatalf("journal has %d publishes", len(calls))
	}
	if !calls[0].Overlaps(calls[1]) || !calls[1].Overlaps(calls[2]) {
		t.Errorf("the publishes of three pods did not run concurrently in the plugin: %+v", calls)
	}
}

// TestRealPluginPublishesWithoutStageOneAtATime: a driver without
// STAGE_UNSTAGE_VOLUME mounts the volume itself in NodePublishVolume (most
// FUSE drivers), and relies on the kubelet's one mount step of a volume at a
// time: the publishes of three pods, and their unpublishes, never overlap in
// the plugin.
func TestRealPluginPublishesWithoutStageOneAtATime(t *testing.T) {
	caps := plugin.DefaultCapabilities()
	caps.StageUnstage = false
	ph := startPlugin(t, caps)
	ctx := testContext(t)
	src := ph.createVolume(t, "pv-serial", volume.Filesystem)
	if err := ph.ops.Stage(ctx, volume.PersistentName(src.Driver, src.Handle), src, nil); err != nil {
		t.Fatal(err)
	}
	if err := ph.p.SetFaults(plugin.FaultRule{Method: "NodePublishVolume", Delay: 300 * time.Millisecond},
		plugin.FaultRule{Method: "NodeUnpublishVolume", Delay: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	uids := []string{"uid-a", "uid-b", "uid-c"}
	var chans []<-chan error
	for _, uid := range uids {
		pv := podVolume(uid, "pod")
		pv.FSGroup = nil
		chans = append(chans, goErr(func() error { return ph.ops.Publish(ctx, keyOf(src, uid), src, pv) }))
	}
	for _, ch := range chans {
		if err := <-ch; err != nil {
			t.Fatalf("Publish: %v", err)
		}
	}
	chans = nil
	for _, uid := range uids {
		chans = append(chans, goErr(func() error { return ph.ops.Unpublish(ctx, keyOf(src, uid)) }))
	}
	for _, ch := range chans {
		if err := <-ch; err != nil {
			t.Fatalf("Unpublish: %v", err)
		}
	}
	for _, method := range []string{"NodePublishVolume", "NodeUnpublishVolume"} {
		calls := ph.calls(t, method)
		if len(calls) != 3 {
			t.Fatalf("journal has %d calls of %s", len(calls), method)
		}
		for i := range calls {
			for j := i + 1; j < len(calls); j++ {
				if calls[i].Overlaps(calls[j]) {
					t.Errorf("two %s calls of one volume ran at once, for a driver without STAGE_UNSTAGE_VOLUME: %+v and %+v", method, calls[i], calls[j])
				}
			}
		}
	}
}

func TestRealPluginBlockVolume(t *testing.T) {
	ph := startPlugin(t, plugin.DefaultCapabilities())
	ctx := testContext(t)
	src := ph.createVolume(t, "pv-block", volume.Block)
	name := volume.PersistentName(src.Driver, src.Handle)
	key := keyOf(src, "uid-a")
	pv := podVolume("uid-a", "pod-a")
	pv.ReadOnly = false

	if err := ph.ops.Stage(ctx, name, src, nil); err != nil {
		t.Fatalf("Stage: %v", err)
	}
	st, _ := ph.ops.Layout().Staging(src.ID)
	if st.Path != filepath.Join(ph.root, "plugins/kubernetes.io/csi/volumeDevices/staging/pv-block") {
		t.Errorf("block staging path = %s", st.Path)
	}
	if err := ph.ops.Publish(ctx, key, src, pv); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	pub, _ := ph.ops.Layout().Publishing("uid-a", "pv-block", volume.Block)
	fi, err := os.Stat(pub.Target)
	if err != nil || fi.Mode()&os.ModeDevice == 0 {
		t.Fatalf("block target %s: %v, %v; want the loop device bind-mounted on a file", pub.Target, fi, err)
	}
	if ok, err := mount.New("").IsMountPoint(pub.Target); err != nil || !ok {
		t.Errorf("block target is not a mount point: %v, %v", ok, err)
	}
	if !exists(t, pub.Record) {
		t.Error("no publish record for the block volume")
	}
	// The kubelet's layout: the pod's device is a link to the published
	// device, the global map a bind mount of it held open by a loop device.
	if to, err := os.Readlink(pub.DeviceLink); err != nil || to != pub.Target {
		t.Errorf("pod device %s -> %q (%v), want a link to %s", pub.DeviceLink, to, err, pub.Target)
	}
	if fi, err := os.Stat(pub.DeviceLink); err != nil || fi.Mode()&os.ModeDevice == 0 {
		t.Errorf("the pod's device does not lead to a device: %v, %v", fi, err)
	}
	if fi, err := os.Lstat(pub.MapFile); err != nil || fi.Mode()&os.ModeDevice == 0 {
		t.Errorf("global map %s: %v, %v; want the device bind-mounted", pub.MapFile, fi, err)
	}
	if _, err := loopdev.Find(pub.MapFile); err != nil {
		t.Errorf("no loop device holds the device open: %v", err)
	}
	if p, _ := ph.world.Pod(key); p.Presentation.DevicePath != pub.DeviceLink {
		t.Errorf("presented device path = %q, want %q", p.Presentation.DevicePath, pub.DeviceLink)
	}
	// Unstaging waits while a pod is mapped, even without its publish.
	if _, err := os.Stat(st.MapDir); err != nil {
		t.Fatal(err)
	}
	if err := ph.ops.Unpublish(ctx, key); err != nil {
		t.Fatalf("Unpublish: %v", err)
	}
	if _, err := loopdev.Find(pub.MapFile); !errors.Is(err, loopdev.ErrNotFound) {
		t.Errorf("loop device left after the unpublish: %v", err)
	}
	for _, p := range []string{pub.DeviceLink, pub.MapFile, pub.Record} {
		if exists(t, p) {
			t.Errorf("%s left after the unpublish", p)
		}
	}
	if err := ph.ops.Unstage(ctx, name); err != nil {
		t.Fatalf("Unstage: %v", err)
	}
	ph.assertClean(t)
	// Every step is observed as a block volume's, so that its metric
	// carries the kubelet's map_volume, unmap_volume and unmap_device.
	var steps []volume.Step
	for _, o := range ph.obs.list() {
		steps = append(steps, o.step)
		if o.access != volume.Block || o.err != nil {
			t.Errorf("observed %+v, want a successful step of a block volume", o)
		}
	}
	if want := []volume.Step{volume.StepStage, volume.StepPublish, volume.StepUnpublish, volume.StepUnstage}; !slices.Equal(steps, want) {
		t.Errorf("observed steps %v, want %v", steps, want)
	}
}

// TestBlockUnstageWaitsForMappedDevices: a device left in the global map
// (an unmap that failed) keeps the volume staged, as the kubelet's
// GetDeviceBindMountRefs check.
func TestBlockUnstageWaitsForMappedDevices(t *testing.T) {
	ph := startPlugin(t, plugin.DefaultCapabilities())
	ctx := testContext(t)
	src := ph.createVolume(t, "pv-mapped", volume.Block)
	name := volume.PersistentName(src.Driver, src.Handle)
	key := keyOf(src, "uid-a")
	pv := podVolume("uid-a", "pod-a")
	if err := ph.ops.Stage(ctx, name, src, nil); err != nil {
		t.Fatal(err)
	}
	if err := ph.ops.Publish(ctx, key, src, pv); err != nil {
		t.Fatal(err)
	}
	pub, _ := ph.ops.Layout().Publishing("uid-a", "pv-mapped", volume.Block)
	// A stray bind mount of the device in the global map.
	stray := filepath.Join(filepath.Dir(pub.MapFile), "uid-gone")
	if err := os.WriteFile(stray, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(pub.Target, stray, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(stray, unix.MNT_DETACH); _ = os.Remove(stray) })
	if err := ph.ops.Unpublish(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := ph.ops.Unstage(ctx, name); !errors.Is(err, volume.ErrInUse) || !strings.Contains(err.Error(), "uid-gone") {
		t.Fatalf("Unstage with a device left in the global map = %v, want ErrInUse naming it", err)
	}
	if n := len(ph.calls(t, "NodeUnstageVolume")); n != 0 {
		t.Errorf("NodeUnstageVolume called %d times while a device is mapped", n)
	}
	if err := unix.Unmount(stray, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(stray); err != nil {
		t.Fatal(err)
	}
	if err := ph.ops.Unstage(ctx, name); err != nil {
		t.Fatalf("Unstage once the global map is empty: %v", err)
	}
	ph.assertClean(t)
}

func TestRealPluginUncertainCodesAreTornDown(t *testing.T) {
	ph := startPlugin(t, plugin.DefaultCapabilities())
	ctx := testContext(t)
	for i, code := range []codes.Code{codes.DeadlineExceeded, codes.Unavailable, codes.Canceled, codes.ResourceExhausted, codes.Aborted} {
		t.Run(code.String(), func(t *testing.T) {
			src := ph.createVolume(t, "pv-"+strings.ToLower(code.String()), volume.Filesystem)
			name := volume.PersistentName(src.Driver, src.Handle)
			key := keyOf(src, "uid-"+string(rune('a'+i)))
			pv := podVolume(string(key.Pod), "pod")
			pv.FSGroup = nil

			// An uncertain stage is torn down when no pod wants the volume.
			if err := ph.p.SetFaults(plugin.FaultRule{Method: "NodeStageVolume", VolumeID: src.Handle, Code: code, Times: 1}); err != nil {
				t.Fatal(err)
			}
			if err := ph.ops.Stage(ctx, name, src, nil); !errors.Is(err, csiclient.ErrUncertain) {
				t.Fatalf("Stage = %v, want uncertain", err)
			}
			if v, _ := ph.world.Volume(name); v.Stage != volume.StageUncertain {
				t.Fatalf("stage state = %v", v.Stage)
			}
			if err := ph.ops.Unstage(ctx, name); err != nil {
				t.Fatalf("Unstage of the uncertain stage: %v", err)
			}

			// An uncertain publish is not ready, and is torn down when the pod goes.
			if err := ph.ops.Stage(ctx, name, src, nil); err != nil {
				t.Fatal(err)
			}
			if err := ph.p.SetFaults(plugin.FaultRule{Method: "NodePublishVolume", VolumeID: src.Handle, Code: code, Times: 1}); err != nil {
				t.Fatal(err)
			}
			if err := ph.ops.Publish(ctx, key, src, pv); !errors.Is(err, csiclient.ErrUncertain) {
				t.Fatalf("Publish = %v, want uncertain", err)
			}
			if published(ph.world, key) || ph.world.MayUnstage(name) == nil {
				t.Fatal("an uncertain publish is ready, or does not block unstage")
			}
			if err := ph.ops.Unpublish(ctx, key); err != nil {
				t.Fatalf("Unpublish of the uncertain publish: %v", err)
			}
			if err := ph.ops.Unstage(ctx, name); err != nil {
				t.Fatalf("Unstage: %v", err)
			}
			want := []string{"NodeStageVolume:" + code.String(), "NodeUnstageVolume:OK", "NodeStageVolume:OK",
				"NodePublishVolume:" + code.String(), "NodeUnpublishVolume:OK", "NodeUnstageVolume:OK"}
			var got []string
			for _, c := range ph.calls(t, "NodeStageVolume", "NodePublishVolume", "NodeUnpublishVolume", "NodeUnstageVolume") {
				if c.Begin.VolumeID == src.Handle {
					got = append(got, c.Begin.Method+":"+c.Code().String())
				}
			}
			if !slices.Equal(got, want) {
				t.Errorf("journal = %v, want %v", got, want)
			}
		})
	}
	ph.assertClean(t)
}

func TestRealPluginControllerPublishContext(t *testing.T) {
	caps := plugin.DefaultCapabilities()
	caps.ControllerPublish = true
	ph := startPlugin(t, caps)
	ctx := testContext(t)
	src := ph.createVolume(t, "pv-attached", volume.Filesystem)
	name := volume.PersistentName(src.Driver, src.Handle)
	key := keyOf(src, "uid-a")
	pv := podVolume("uid-a", "pod-a")
	pv.FSGroup = nil

	if err := ph.ops.Stage(ctx, name, src, nil); !errors.Is(err, volume.ErrNotAttached) {
		t.Fatalf("Stage before attach = %v, want ErrNotAttached", err)
	}
	// The external-attacher's part: ControllerPublishVolume, then the
	// VolumeAttachment's status.
	resp, err := ph.client.Controller().ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{
		VolumeId: src.Handle, NodeId: ph.p.NodeID,
		VolumeCapability: &csi.VolumeCapability{
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER},
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		},
	})
	if err != nil {
		t.Fatalf("ControllerPublishVolume: %v", err)
	}
	pc := resp.GetPublishContext()
	if len(pc) == 0 {
		t.Fatal("ControllerPublishVolume returned no publish_context")
	}
	ph.vas.set(attached(src, pc))
	if err := ph.ops.WaitForAttach(ctx, name, src); err != nil {
		t.Fatal(err)
	}
	if err := ph.ops.Stage(ctx, name, src, nil); err != nil {
		t.Fatalf("Stage: %v", err)
	}
	if err := ph.ops.Publish(ctx, key, src, pv); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	for _, c := range ph.calls(t, "NodeStageVolume", "NodePublishVolume") {
		if c.Code() == codes.OK && !maps.Equal(c.Begin.PublishContext, pc) {
			t.Errorf("%s received publish_context %v, want %v", c.Begin.Method, c.Begin.PublishContext, pc)
		}
	}
	if err := ph.ops.Unpublish(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := ph.ops.Unstage(ctx, name); err != nil {
		t.Fatal(err)
	}
	ph.assertClean(t)
}
