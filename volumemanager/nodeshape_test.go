package volumemanager

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

var (
	shapeCapacity = corev1.ResourceList{
		corev1.ResourcePods: resource.MustParse("110"), corev1.ResourceCPU: resource.MustParse("8"),
		corev1.ResourceMemory: resource.MustParse("16Gi"),
	}
	shapeLabels = map[string]string{"type": "virtual-kubelet", "example.com/pool": "edge"}
	shapeTaint  = corev1.Taint{Key: "csi-volmgr.io/virtual", Value: "true", Effect: corev1.TaintEffectNoSchedule}
)

// hasShape tells what of the configured capacity, labels and taint node
// lacks; empty when it has them all.
func hasShape(node *corev1.Node) []string {
	var lacks []string
	for name, want := range shapeCapacity {
		if got := node.Status.Capacity[name]; got.Cmp(want) != 0 {
			lacks = append(lacks, "capacity "+string(name)+"="+got.String())
		}
		if got := node.Status.Allocatable[name]; got.Cmp(want) != 0 {
			lacks = append(lacks, "allocatable "+string(name)+"="+got.String())
		}
	}
	for k, v := range shapeLabels {
		if node.Labels[k] != v {
			lacks = append(lacks, "label "+k)
		}
	}
	if !slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.MatchTaint(&shapeTaint) && t.Value == shapeTaint.Value }) {
		lacks = append(lacks, "taint "+shapeTaint.ToString())
	}
	return lacks
}

// registerAndRun registers the keeper's Node and keeps it until the test
// ends.
func registerAndRun(ctx context.Context, t *testing.T, n *nodeKeeper) {
	t.Helper()
	if err := n.Register(ctx); err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { n.Run(runCtx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// TestRegisteredNodeTakesPods: the Node the keeper registers has the
// configured capacity (as allocatable too), labels and taints besides its
// own owner label, and keeps them across the keeper's status updates: a
// changed capacity and a removed label are put back, the taints are left
// alone by the status patches.
func TestRegisteredNodeTakesPods(t *testing.T) {
	f := k8stest.New(t)
	_, ctx := ktesting.NewTestContext(t)
	cleanupNode(t, f.Client, f.NodeName)
	n := newNodeKeeper(f.Client, f.NodeName, 4*time.Second, 200*time.Millisecond)
	n.shape(shapeCapacity, shapeLabels, []corev1.Taint{shapeTaint})
	registerAndRun(ctx, t, n)
	nodes := f.Client.CoreV1().Nodes()
	node, err := nodes.Get(ctx, f.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if lacks := hasShape(node); len(lacks) > 0 {
		t.Fatalf("registered Node lacks %v", lacks)
	}
	if node.Labels[OwnerLabel] != OwnerLabelValue {
		t.Errorf("owner label %q, want %q", node.Labels[OwnerLabel], OwnerLabelValue)
	}

	// Someone shrinks the capacity and removes a label: the next status
	// update puts both back, and the taint is still there.
	if _, err := nodes.PatchStatus(ctx, f.NodeName, []byte(`{"status":{"capacity":{"pods":"1"},"allocatable":{"pods":"1"}}}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := nodes.Patch(ctx, f.NodeName, types.MergePatchType, []byte(`{"metadata":{"labels":{"type":null}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	untilNode(t, "the capacity and the label again", func(ctx context.Context) (bool, error) {
		node, err = nodes.Get(ctx, f.NodeName, metav1.GetOptions{})
		return err == nil && len(hasShape(node)) == 0, err
	})
	// A few more status updates (every 200ms) change none of it.
	heartbeat := readyCondition(node).LastHeartbeatTime
	untilNode(t, "two more status updates", func(ctx context.Context) (bool, error) {
		node, err = nodes.Get(ctx, f.NodeName, metav1.GetOptions{})
		return err == nil && readyCondition(node).LastHeartbeatTime.After(heartbeat.Add(time.Second)), err
	})
	if lacks := hasShape(node); len(lacks) > 0 {
		t.Errorf("after status updates the Node lacks %v", lacks)
	}
}

// TestRegisterAddsTaintsToAKeptNode: a Node the keeper keeps (owner label)
// that lacks a configured taint gets it at registration, next to the
// taints it has; a taint it has already is not added twice.
func TestRegisterAddsTaintsToAKeptNode(t *testing.T) {
	f := k8stest.New(t)
	_, ctx := ktesting.NewTestContext(t)
	other := corev1.Taint{Key: "example.com/other", Effect: corev1.TaintEffectNoExecute}
	f.CreateNode(t, func(n *corev1.Node) { n.Spec.Taints = []corev1.Taint{other} })
	n := newNodeKeeper(f.Client, f.NodeName, 0, 0)
	second := corev1.Taint{Key: "example.com/other", Effect: corev1.TaintEffectNoExecute, Value: "ignored"}
	n.shape(nil, nil, []corev1.Taint{shapeTaint, second})
	registerAndRun(ctx, t, n)
	node, err := f.Client.CoreV1().Nodes().Get(ctx, f.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The API server adds node.kubernetes.io/not-ready to a new Node
	// (TaintNodesByCondition); the rest are ours.
	got := slices.DeleteFunc(slices.Clone(node.Spec.Taints), func(t corev1.Taint) bool { return t.Key == corev1.TaintNodeNotReady })
	want := []corev1.Taint{other, shapeTaint}
	if !slices.EqualFunc(got, want, func(a, b corev1.Taint) bool { return a.MatchTaint(&b) && a.Value == b.Value }) {
		t.Errorf("taints %v, want %v", node.Spec.Taints, want)
	}
}

// TestConfigValidateNodeShape: capacity, labels and taints only with
// RegisterNode, and each valid.
func TestConfigValidateNodeShape(t *testing.T) {
	for name, tc := range map[string]struct {
		mutate    func(*Config)
		wantField string
		wantText  string
	}{
		"valid": {mutate: func(*Config) {}},
		"capacity without RegisterNode": {
			mutate: func(c *Config) { c.RegisterNode = false; c.NodeLabels = nil; c.NodeTaints = nil }, wantField: "NodeCapacity", wantText: "needs RegisterNode",
		},
		"negative capacity": {
			mutate: func(c *Config) { c.NodeCapacity[corev1.ResourceCPU] = resource.MustParse("-1") }, wantField: "NodeCapacity", wantText: "cpu=-1 must not be negative",
		},
		"bad label key":   {mutate: func(c *Config) { c.NodeLabels["a b"] = "x" }, wantField: "NodeLabels", wantText: "a b"},
		"bad label value": {mutate: func(c *Config) { c.NodeLabels["ok"] = "not ok" }, wantField: "NodeLabels", wantText: "not ok"},
		"owner label": {
			mutate: func(c *Config) { c.NodeLabels[OwnerLabel] = "someone" }, wantField: "NodeLabels", wantText: OwnerLabel + ": the agent sets this label",
		},
		"bad taint effect": {
			mutate:    func(c *Config) { c.NodeTaints = append(c.NodeTaints, corev1.Taint{Key: "k", Effect: "Sometimes"}) },
			wantField: "NodeTaints", wantText: `effect "Sometimes"`,
		},
		"bad taint key": {
			mutate: func(c *Config) {
				c.NodeTaints = append(c.NodeTaints, corev1.Taint{Key: "-k", Effect: corev1.TaintEffectNoSchedule})
			},
			wantField: "NodeTaints", wantText: "key",
		},
		"taint twice": {
			mutate: func(c *Config) { c.NodeTaints = append(c.NodeTaints, shapeTaint) }, wantField: "NodeTaints", wantText: "given twice",
		},
		"drivers taint": {
			mutate: func(c *Config) {
				c.NodeTaints = append(c.NodeTaints, corev1.Taint{Key: TaintDriversNotReady, Effect: corev1.TaintEffectNoSchedule})
			},
			wantField: "NodeTaints", wantText: "sets this taint itself",
		},
	} {
		t.Run(name, func(t *testing.T) {
			c := Config{
				NodeName: "n", RootDir: "/var/lib/csi-volmgr", KubeClient: fake.NewClientset(), RegisterNode: true,
				NodeCapacity: shapeCapacity.DeepCopy(), NodeLabels: map[string]string{"type": "virtual-kubelet"},
				NodeTaints: []corev1.Taint{shapeTaint},
			}
			tc.mutate(&c)
			err := c.validate()
			if tc.wantField == "" {
				if err != nil {
					t.Fatalf("validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("validate accepted it")
			}
			if !strings.Contains(err.Error(), tc.wantField+" ") || !strings.Contains(err.Error(), tc.wantText) {
				t.Errorf("validate = %q, want field %s and %q", err, tc.wantField, tc.wantText)
			}
		})
	}
}
