package volumemanager_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/mount-utils"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/reconciler"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

const standaloneTimeout = 60 * time.Second

// standaloneNode is a standalone volume manager (csi-volmgr run
// --manifests) in the test process, with the real CSI test plugin
// registered through its registration directory.
type standaloneNode struct {
	t         *testing.T
	root      string
	manifests string
	plugin    *plugintest.Plugin
	vm        *volumemanager.VolumeManager
	handle    string
	// configure changes the agent's Config; httpEndpoint is the
	// HTTPEndpoint it set.
	configure    func(*volumemanager.Config)
	httpEndpoint string
	// stop stops the running agent and waits for it.
	stop func()
}

func (n *standaloneNode) pvName() string { return "pv-demo" }

// startStandalone starts the plugin with caps, creates a volume on it and
// writes its PersistentVolume and claim (and extra manifests) into the
// manifest directory, then starts the agent on it.
func startStandalone(t *testing.T, caps plugin.Capabilities, extra map[string]string) *standaloneNode {
	t.Helper()
	return startStandaloneConfigured(t, caps, extra, nil)
}

// startStandaloneWith starts a standalone node whose agent's Config
// configure changes.
func startStandaloneWith(t *testing.T, configure func(*volumemanager.Config)) *standaloneNode {
	t.Helper()
	return startStandaloneConfigured(t, plugin.Capabilities{StageUnstage: true}, nil, configure)
}

func startStandaloneConfigured(t *testing.T, caps plugin.Capabilities, extra map[string]string, configure func(*volumemanager.Config)) *standaloneNode {
	t.Helper()
	base, err := os.MkdirTemp("", "sa")
	if err != nil {
		t.Fatal(err)
	}
	n := &standaloneNode{t: t, root: filepath.Join(base, "r"), manifests: filepath.Join(base, "m"), configure: configure}
	regDir := filepath.Join(n.root, "plugins_registry")
	for _, d := range []string{regDir, n.manifests} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if mps := mountsUnder(t, base); len(mps) > 0 {
			t.Errorf("mounts left under %s: %v (directory kept)", base, mps)
			return
		}
		if err := os.RemoveAll(base); err != nil {
			t.Error(err)
		}
	})
	n.plugin = plugintest.Start(t, plugintest.Options{RegistrationDir: regDir, Capabilities: &caps})
	n.handle = createVolume(t, n.plugin)

	n.write("volume.yaml", fmt.Sprintf(`apiVersion: v1
kind: PersistentVolume
metadata:
  name: %s
spec:
  capacity:
    storage: 1Gi
  accessModes: [ReadWriteOnce]
  csi:
    driver: %s
    volumeHandle: %s
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: data
spec:
  accessModes: [ReadWriteOnce]
  volumeName: %s
  resources:
    requests:
      storage: 1Gi
`, n.pvName(), plugin.DefaultName, n.handle, n.pvName()))
	for name, content := range extra {
		n.write(name, content)
	}

	n.start()
	t.Cleanup(func() { n.stop() })
	return n
}

// start starts an agent on the node's directories, as csi-volmgr run
// --manifests does, and waits until it is ready.
func (n *standaloneNode) start() {
	t := n.t
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	ctx = klog.NewContext(ctx, klog.FromContext(ctx).WithName("agent"))
	cfg := volumemanager.Config{
		NodeName: "standalone-node", RootDir: n.root, Manifests: n.manifests,
		Tuning: volumemanager.Tuning{
			Reconciler:             reconciler.Config{RetryBaseDelay: 50 * time.Millisecond, RetryMaxDelay: time.Second, ShutdownGrace: 5 * time.Second},
			RegistryRetryBaseDelay: 50 * time.Millisecond, RegistryRetryMaxDelay: time.Second,
			ManifestsDebounce: 10 * time.Millisecond,
		},
	}
	if n.configure != nil {
		n.configure(&cfg)
	}
	n.httpEndpoint = cfg.HTTPEndpoint
	vm, err := volumemanager.New(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	n.vm = vm
	errs := make(chan error, 1)
	go func() { errs <- vm.Run(ctx) }()
	stopped := false
	n.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-errs; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("agent stopped with an error: %v", err)
		}
	}
	n.until("agent ready", func() bool { return n.vm.Ready() })
}

func (n *standaloneNode) write(name, content string) {
	n.t.Helper()
	if err := os.WriteFile(filepath.Join(n.manifests, name), []byte(content), 0o600); err != nil {
		n.t.Fatal(err)
	}
}

func (n *standaloneNode) until(what string, cond func() bool) {
	n.t.Helper()
	if err := wait.PollUntilContextTimeout(n.t.Context(), 20*time.Millisecond, standaloneTimeout, true,
		func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		n.t.Fatalf("waiting for %s: %v; volumes: %+v", what, err, n.vm.Volumes())
	}
}

// published returns the target path of the demo volume's only publish once
// it is Published.
func (n *standaloneNode) published() (string, bool) {
	for _, v := range n.vm.Volumes() {
		if v.Handle == n.handle && v.Stage == volume.Staged && len(v.Pods) == 1 && v.Pods[0].State == volume.Published {
			return v.Pods[0].TargetPath, true
		}
	}
	return "", false
}

// csiCalls returns the methods of the plugin's successful calls, in order.
func (n *standaloneNode) csiCalls() []string {
	n.t.Helper()
	entries, err := n.plugin.ReadJournal()
	if err != nil {
		n.t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if e.Event == plugin.EventEnd && e.Code == "OK" && e.VolumeID == n.handle {
			out = append(out, e.Method)
		}
	}
	return out
}

const podManifest = `apiVersion: v1
kind: Pod
metadata:
  name: app
spec:
  containers:
  - name: app
    image: busybox
    volumeMounts:
    - name: data
      mountPath: /data
  volumes:
  - name: data
    persistentVolumeClaim:
      claimName: data
`

func TestStandalonePodFileMountsAndItsRemovalTearsDown(t *testing.T) {
	caps := plugin.Capabilities{StageUnstage: true, ControllerPublish: true}
	n := startStandalone(t, caps, nil)
	if vols := n.vm.Volumes(); len(vols) != 0 {
		t.Fatalf("volumes before any pod: %+v", vols)
	}

	n.write("pod.yaml", podManifest)
	var target string
	n.until("the volume to be published", func() bool {
		var ok bool
		target, ok = n.published()
		return ok
	})
	if isMnt, err := mount.New("").IsMountPoint(target); err != nil || !isMnt {
		t.Fatalf("target %s is not a mount point (%v)", target, err)
	}
	// Write through the pod's mount: it lands in the plugin's volume.
	if err := os.WriteFile(filepath.Join(target, "hello"), []byte("hi"), 0o600); err != nil {
		t.Fatal(err)
	}
	vols, err := n.plugin.Volumes()
	if err != nil {
		t.Fatal(err)
	}
	if len(vols) != 1 || len(vols[0].Attachments) != 1 {
		t.Fatalf("plugin volumes %+v: want one volume attached to one node", vols)
	}
	if data, err := os.ReadFile(filepath.Join(vols[0].Path, "hello")); err != nil || string(data) != "hi" {
		t.Errorf("file written through the mount: %q, %v", data, err)
	}
	wantSetup := []string{"ControllerPublishVolume", "NodeStageVolume", "NodePublishVolume"}
	if calls := n.csiCalls(); !slices.Equal(calls, wantSetup) {
		t.Errorf("CSI calls %v, want %v", calls, wantSetup)
	}

	if err := os.Remove(filepath.Join(n.manifests, "pod.yaml")); err != nil {
		t.Fatal(err)
	}
	wantAll := append(wantSetup, "NodeUnpublishVolume", "NodeUnstageVolume", "ControllerUnpublishVolume")
	n.until("unpublish, unstage and detach", func() bool {
		return len(n.vm.Volumes()) == 0 && slices.Equal(n.csiCalls(), wantAll)
	})
	if isMnt, err := mount.New("").IsMountPoint(target); err == nil && isMnt {
		t.Errorf("target %s is still a mount point", target)
	}
	vols, err = n.plugin.Volumes()
	if err != nil {
		t.Fatal(err)
	}
	if v := vols[0]; len(v.Attachments) != 0 || v.Staged != nil || len(v.Published) != 0 {
		t.Errorf("plugin still holds the volume: %+v", v)
	}
	if entries, err := os.ReadDir(filepath.Join(n.root, "standalone", "attachments")); err != nil || len(entries) != 0 {
		t.Errorf("attachment records left: %v, %v", entries, err)
	}
}

func TestStandaloneDriverWithoutAttachNeedsNoControllerPublish(t *testing.T) {
	driver := fmt.Sprintf("apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata:\n  name: %s\nspec:\n  attachRequired: false\n", plugin.DefaultName)
	n := startStandalone(t, plugin.DefaultCapabilities(), map[string]string{"driver.yaml": driver})
	n.write("pod.yaml", podManifest)
	n.until("the volume to be published", func() bool { _, ok := n.published(); return ok })
	if calls := n.csiCalls(); !slices.Equal(calls, []string{"NodeStageVolume", "NodePublishVolume"}) {
		t.Errorf("CSI calls %v, want NodeStageVolume, NodePublishVolume", calls)
	}
	if err := os.Remove(filepath.Join(n.manifests, "pod.yaml")); err != nil {
		t.Fatal(err)
	}
	n.until("teardown", func() bool { return len(n.vm.Volumes()) == 0 })
	want := []string{"NodeStageVolume", "NodePublishVolume", "NodeUnpublishVolume", "NodeUnstageVolume"}
	if calls := n.csiCalls(); !slices.Equal(calls, want) {
		t.Errorf("CSI calls %v, want %v", calls, want)
	}
}

// createVolume creates a 1 GiB filesystem volume on the plugin and returns
// its handle.
func createVolume(t *testing.T, p *plugintest.Plugin) string {
	t.Helper()
	conn, err := p.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := csi.NewControllerClient(conn).CreateVolume(t.Context(), &csi.CreateVolumeRequest{
		Name: "demo",
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30},
	})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetVolume().GetVolumeId()
}

// mountsUnder returns the mount points at or below dir.
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	mps, err := mount.New("").List()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mp := range mps {
		if mp.Path == dir || len(mp.Path) > len(dir) && mp.Path[:len(dir)+1] == dir+"/" {
			out = append(out, mp.Path)
		}
	}
	return out
}

// TestStandaloneRestartKeepsTheVolume: the agent stops and starts again on
// the same manifests and root directory: the pod (same UID, from its name)
// keeps its volume, nothing is torn down, and removing the pod afterwards
// still tears everything down, detach included.
func TestStandaloneRestartKeepsTheVolume(t *testing.T) {
	n := startStandalone(t, plugin.Capabilities{StageUnstage: true, ControllerPublish: true}, nil)
	n.write("pod.yaml", podManifest)
	var target string
	n.until("the volume to be published", func() bool {
		var ok bool
		target, ok = n.published()
		return ok
	})

	n.stop()
	if isMnt, err := mount.New("").IsMountPoint(target); err != nil || !isMnt {
		t.Fatalf("target %s unmounted when the agent stopped (%v)", target, err)
	}
	n.start()
	n.until("the volume to be published again", func() bool {
		again, ok := n.published()
		return ok && again == target
	})
	for _, call := range n.csiCalls() {
		if call == "NodeUnpublishVolume" || call == "NodeUnstageVolume" || call == "ControllerUnpublishVolume" {
			t.Fatalf("the restart tore the volume down: CSI calls %v", n.csiCalls())
		}
	}

	if err := os.Remove(filepath.Join(n.manifests, "pod.yaml")); err != nil {
		t.Fatal(err)
	}
	n.until("unpublish, unstage and detach", func() bool {
		calls := n.csiCalls()
		return len(n.vm.Volumes()) == 0 && len(calls) > 2 &&
			slices.Equal(calls[len(calls)-3:], []string{"NodeUnpublishVolume", "NodeUnstageVolume", "ControllerUnpublishVolume"})
	})
}
