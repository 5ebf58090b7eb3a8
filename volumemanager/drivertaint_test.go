package volumemanager_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// startExpectingDriver runs an agent that registers the Node name with
// client and expects one driver, whose name it returns with the agent's
// plugin registration directory. The agent logs into ctx's logger and
// stops when the test ends.
func startExpectingDriver(ctx context.Context, t *testing.T, client kubernetes.Interface, name string, nodeIdentity bool) (driver, regDir string, vm *volumemanager.VolumeManager) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	ctx = klog.NewContext(ctx, klog.FromContext(ctx).WithName("agent"))
	// A short path: the registration sockets live below it.
	base, err := os.MkdirTemp("", "dt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	root := filepath.Join(base, "r")
	regDir = filepath.Join(root, "plugins_registry")
	if err := os.MkdirAll(regDir, 0o750); err != nil {
		t.Fatal(err)
	}
	driver = "d" + utilrand.String(6) + ".dt.csi-volmgr.io"
	vm, err = volumemanager.New(ctx, volumemanager.Config{
		NodeName: name, RootDir: root, KubeClient: client, RegisterNode: true, ExpectedDrivers: []string{driver},
		NodeIdentity: nodeIdentity,
		Tuning:       volumemanager.Tuning{RegistryRetryBaseDelay: 50 * time.Millisecond, RegistryRetryMaxDelay: time.Second},
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
	return driver, regDir, vm
}

// nodeReady returns the Node's Ready condition, nil without one.
func nodeReady(node *corev1.Node) *corev1.NodeCondition {
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == corev1.NodeReady {
			return &node.Status.Conditions[i]
		}
	}
	return nil
}

// TestExpectedDriversTaint: with RegisterNode and ExpectedDrivers, the Node
// the agent registers carries the NoSchedule taint
// csi-volmgr.io/drivers-not-ready until the expected driver has registered,
// loses it then, and gets it back when the driver goes away; the Node stays
// Ready throughout (no NoExecute eviction of running pods).
func TestExpectedDriversTaint(t *testing.T) {
	f := k8stest.New(t)
	_, ctx := ktesting.NewTestContext(t)
	t.Cleanup(func() {
		_ = f.Client.CoreV1().Nodes().Delete(context.WithoutCancel(t.Context()), f.NodeName, metav1.DeleteOptions{})
	})
	driver, regDir, vm := startExpectingDriver(ctx, t, f.Client, f.NodeName, false)
	tainted := func(want bool) func(context.Context) (bool, error) {
		return func(ctx context.Context) (bool, error) {
			node, err := f.Client.CoreV1().Nodes().Get(ctx, f.NodeName, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			has := slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool {
				return t.Key == volumemanager.TaintDriversNotReady && t.Effect == corev1.TaintEffectNoSchedule
			})
			ready := nodeReady(node)
			return has == want && ready != nil && ready.Status == corev1.ConditionTrue, nil
		}
	}
	poll(t, "the Node registered with the drivers taint", tainted(true))
	p := plugintest.Start(t, plugintest.Options{Name: driver, RegistrationDir: regDir})
	poll(t, "the taint removed once the driver registered", tainted(false))
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	poll(t, "the taint back once the driver went away", tainted(true))

	// An operator takes the Node from the agent: the agent no longer
	// changes its taints, whatever its drivers do.
	p = plugintest.Start(t, plugintest.Options{Name: driver, RegistrationDir: regDir})
	poll(t, "the taint removed once the driver registered again", tainted(false))
	setOwnerLabel(t, f, false)
	poll(t, "the agent to see the label go (/readyz fails)", func(context.Context) (bool, error) {
		rec := httptest.NewRecorder()
		vm.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		return rec.Code != http.StatusOK, nil
	})
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	quiet(t, 5*time.Second, func() string {
		if ok, _ := tainted(false)(t.Context()); !ok {
			return "the drivers taint changed on a Node the agent no longer serves"
		}
		return ""
	})
}

// TestExpectedDriversAsNode: acting as its Node (NodeIdentity, under the
// Node authorizer and NodeRestriction, which forbids a node to change its
// taints), the agent registers its Node without the drivers taint and
// posts Ready=False, reason CSIVolmgrDriversNotRegistered, naming the
// missing driver — the node lifecycle controller then taints the Node
// not-ready, as for a kubelet whose network plugin is not ready — and
// Ready=True once the driver registered, False again when it went away;
// nothing it writes is refused.
func TestExpectedDriversAsNode(t *testing.T) {
	env, err := k8stest.Start(k8stest.Options{
		NodeClientSigner: true,
		APIServerFlags: map[string][]string{
			"authorization-mode":       {"Node,RBAC"},
			"enable-admission-plugins": {"NodeRestriction"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Error(err)
		}
	})
	name := k8stest.UniqueName(t.Name())
	cfg, err := env.NodeConfig(name)
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	logs := logger.GetSink().(ktesting.Underlier).GetBuffer()
	driver, regDir, _ := startExpectingDriver(klog.NewContext(t.Context(), logger), t, client, name, true)

	var last *corev1.Node
	ready := func(want corev1.ConditionStatus) func(context.Context) (bool, error) {
		return func(ctx context.Context) (bool, error) {
			node, err := env.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			last = node
			c := nodeReady(node)
			if c == nil || c.Status != want {
				return false, nil
			}
			if want == corev1.ConditionTrue {
				return c.Reason == volumemanager.NodeReadyReason, nil
			}
			return c.Reason == volumemanager.NodeDriversNotRegisteredReason && strings.Contains(c.Message, driver), nil
		}
	}
	poll(t, "the Node registered NotReady, naming the driver", ready(corev1.ConditionFalse))
	if slices.ContainsFunc(last.Spec.Taints, func(t corev1.Taint) bool { return t.Key == volumemanager.TaintDriversNotReady }) {
		t.Errorf("the Node was registered with the taint %s, which it may never remove: %v", volumemanager.TaintDriversNotReady, last.Spec.Taints)
	}
	p := plugintest.Start(t, plugintest.Options{Name: driver, RegistrationDir: regDir})
	poll(t, "Ready once the driver registered", ready(corev1.ConditionTrue))
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	poll(t, "NotReady again once the driver went away", ready(corev1.ConditionFalse))
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(strings.ToLower(line), "forbidden") {
			t.Errorf("refused: %s", line)
		}
	}
}
