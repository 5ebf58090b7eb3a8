package volumemanager_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/reconciler"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// clusterNode is a volume manager on a real API server with the real
// plugin, a driver that needs no attach (the attach/detach controller does
// not run here), and one volume bound to the claim "data".
type clusterNode struct {
	vm     *volumemanager.VolumeManager
	plugin *plugintest.Plugin
	handle string
	// root is the agent's root directory.
	root string
	// logs holds what the agent logged, every start of it.
	logs ktesting.Buffer
	// logger is the agent's logger (logs is its buffer).
	logger klog.Logger
	// cfg is the volume manager's Config, for restart; stop stops the
	// volume manager and waits for it (more than once is fine).
	cfg  volumemanager.Config
	stop func()
}

// startClusterNode starts it with the Config that configure changes.
func startClusterNode(t *testing.T, f *k8stest.Fixture, configure func(*volumemanager.Config)) *clusterNode {
	t.Helper()
	return startClusterNodeWith(t, f, clusterNodeOptions{Configure: configure})
}

// clusterNodeOptions change what startClusterNodeWith makes; each field
// may be nil.
type clusterNodeOptions struct {
	// Configure changes the volume manager's Config.
	Configure func(*volumemanager.Config)
	// Driver changes the CSIDriver object of the plugin.
	Driver func(*storagev1.CSIDriverSpec)
	// PV changes the PersistentVolume of the claim "data".
	PV func(*corev1.PersistentVolume)
	// NoNode leaves the Node to the test; otherwise a Node with the owner
	// label is created unless one exists or the agent registers it.
	NoNode bool
}

// startClusterNodeWith starts a clusterNode as opts say.
func startClusterNodeWith(t *testing.T, f *k8stest.Fixture, opts clusterNodeOptions) *clusterNode {
	t.Helper()
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	ctx := klog.NewContext(t.Context(), logger)
	base, err := os.MkdirTemp("", "cn")
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(base, "r")
	regDir := filepath.Join(root, "plugins_registry")
	if err := os.MkdirAll(regDir, 0o750); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if mps := mountsUnder(t, base); len(mps) > 0 {
			t.Errorf("mounts left under %s: %v", base, mps)
			return
		}
		_ = os.RemoveAll(base)
	})
	driver := "d" + utilrand.String(6) + ".cn.csi-volmgr.io"
	spec := storagev1.CSIDriverSpec{AttachRequired: ptr.To(false)}
	if opts.Driver != nil {
		opts.Driver(&spec)
	}
	if _, err := f.Client.StorageV1().CSIDrivers().Create(ctx, &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: driver}, Spec: spec,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = f.Client.StorageV1().CSIDrivers().Delete(context.WithoutCancel(t.Context()), driver, metav1.DeleteOptions{})
	})
	n := &clusterNode{root: root, logger: logger, logs: logger.GetSink().(ktesting.Underlier).GetBuffer(), plugin: plugintest.Start(t, plugintest.Options{Name: driver, RegistrationDir: regDir, Capabilities: &plugin.Capabilities{StageUnstage: true}})}
	n.handle = createVolume(t, n.plugin)
	var changePV []func(*corev1.PersistentVolume)
	if opts.PV != nil {
		changePV = append(changePV, opts.PV)
	}
	createBound(t, f, driver, n.handle, "data", "pv-"+f.Namespace, changePV...)

	cfg := volumemanager.Config{
		NodeName: f.NodeName, RootDir: root, KubeClient: f.Client,
		Tuning: volumemanager.Tuning{
			Reconciler:             reconciler.Config{RetryBaseDelay: 50 * time.Millisecond, RetryMaxDelay: time.Second, ShutdownGrace: 5 * time.Second},
			RegistryRetryBaseDelay: 50 * time.Millisecond, RegistryRetryMaxDelay: time.Second,
		},
	}
	if opts.Configure != nil {
		opts.Configure(&cfg)
	}
	if _, err := f.Client.CoreV1().Nodes().Get(ctx, f.NodeName, metav1.GetOptions{}); apierrors.IsNotFound(err) && !cfg.RegisterNode && !opts.NoNode {
		// The agent acts only on a Node that carries the owner label.
		f.CreateNode(t)
	}
	n.cfg = cfg
	n.start(t)
	return n
}

// start starts a volume manager with n.cfg until the test ends or n.stop.
func (n *clusterNode) start(t *testing.T) {
	t.Helper()
	// Not t.Context(): it ends before the cleanups, and the agent must stop
	// before the plugin's cleanup.
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	ctx = klog.NewContext(ctx, n.logger.WithName("agent"))
	vm, err := volumemanager.New(ctx, n.cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	n.vm = vm
	errs := make(chan error, 1)
	go func() { errs <- vm.Run(ctx) }()
	n.stop = sync.OnceFunc(func() {
		cancel()
		if err := <-errs; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("agent stopped with an error: %v", err)
		}
	})
	t.Cleanup(n.stop)
}

// restart stops the volume manager and starts a new one on the same root
// with the same plugin: an agent restart.
func (n *clusterNode) restart(t *testing.T) {
	t.Helper()
	n.stop()
	n.start(t)
}

// okCalls returns the methods of the plugin's successful calls on the
// node's volume, in order.
func (n *clusterNode) okCalls(t *testing.T) []string {
	t.Helper()
	entries, err := n.plugin.ReadJournal()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if e.Event == plugin.EventEnd && e.Code == "OK" && e.VolumeID == n.handle {
			out = append(out, e.Method)
		}
	}
	return out
}
