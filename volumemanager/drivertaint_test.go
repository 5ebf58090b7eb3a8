package volumemanager_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// TestExpectedDriversTaint: with RegisterNode and ExpectedDrivers, the Node
// the agent registers carries the NoSchedule taint
// csi-volmgr.io/drivers-not-ready until the expected driver has registered,
// loses it then, and gets it back when the driver goes away; the Node stays
// Ready throughout (no NoExecute eviction of running pods).
func TestExpectedDriversTaint(t *testing.T) {
	f := k8stest.New(t)
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	ctx = klog.NewContext(ctx, klog.FromContext(ctx).WithName("agent"))
	t.Cleanup(func() {
		_ = f.Client.CoreV1().Nodes().Delete(context.WithoutCancel(t.Context()), f.NodeName, metav1.DeleteOptions{})
	})
	base, err := os.MkdirTemp("", "dt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	root := filepath.Join(base, "r")
	regDir := filepath.Join(root, "plugins_registry")
	if err := os.MkdirAll(regDir, 0o750); err != nil {
		t.Fatal(err)
	}
	driver := "d" + utilrand.String(6) + ".dt.csi-volmgr.io"
	vm, err := volumemanager.New(ctx, volumemanager.Config{
		NodeName: f.NodeName, RootDir: root, KubeClient: f.Client, RegisterNode: true, ExpectedDrivers: []string{driver},
		Tuning: volumemanager.Tuning{RegistryRetryBaseDelay: 50 * time.Millisecond, RegistryRetryMaxDelay: time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 1)
	go func() { errs <- vm.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errs; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("agent stopped with an error: %v", err)
		}
	})
	tainted := func(want bool) func(context.Context) (bool, error) {
		return func(ctx context.Context) (bool, error) {
			node, err := f.Client.CoreV1().Nodes().Get(ctx, f.NodeName, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			has := slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool {
				return t.Key == volumemanager.TaintDriversNotReady && t.Effect == corev1.TaintEffectNoSchedule
			})
			ready := slices.ContainsFunc(node.Status.Conditions, func(c corev1.NodeCondition) bool {
				return c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue
			})
			return has == want && ready, nil
		}
	}
	poll(t, "the Node registered with the drivers taint", tainted(true))
	p := plugintest.Start(t, plugintest.Options{Name: driver, RegistrationDir: regDir})
	poll(t, "the taint removed once the driver registered", tainted(false))
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	poll(t, "the taint back once the driver went away", tainted(true))
}
