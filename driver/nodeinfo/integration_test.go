package nodeinfo_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/driver/nodeinfo"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

func TestMain(m *testing.M) {
	k8stest.Main(m, k8stest.Options{})
}

// setup returns a fixture with a Node, a Manager for it and a context that
// carries a test logger. The context is t.Context(), canceled when t ends.
func setup(t *testing.T, mutate ...func(*corev1.Node)) (*k8stest.Fixture, *corev1.Node, *nodeinfo.Manager, context.Context) {
	t.Helper()
	fx := k8stest.New(t)
	node := fx.CreateNode(t, mutate...)
	m, err := nodeinfo.New(nodeinfo.Config{Client: fx.Client, NodeName: fx.NodeName})
	if err != nil {
		t.Fatalf("nodeinfo.New() error: %v", err)
	}
	t.Cleanup(func() {
		_ = fx.Client.StorageV1().CSINodes().Delete(context.WithoutCancel(t.Context()), fx.NodeName, metav1.DeleteOptions{})
	})
	ctx := klog.NewContext(t.Context(), ktesting.NewLogger(t, ktesting.NewConfig()))
	return fx, node, m, ctx
}

func readNode(ctx context.Context, t *testing.T, fx *k8stest.Fixture) (*corev1.Node, map[string]string) {
	t.Helper()
	node, err := fx.Client.CoreV1().Nodes().Get(ctx, fx.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("getting Node: %v", err)
	}
	var ids map[string]string
	if value, ok := node.Annotations[nodeinfo.AnnotationNodeID]; ok {
		if err := json.Unmarshal([]byte(value), &ids); err != nil {
			t.Fatalf("annotation %s=%q is not a JSON map: %v", nodeinfo.AnnotationNodeID, value, err)
		}
	}
	return node, ids
}

func readCSINode(ctx context.Context, t *testing.T, fx *k8stest.Fixture) *storagev1.CSINode {
	t.Helper()
	csiNode, err := fx.Client.StorageV1().CSINodes().Get(ctx, fx.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("getting CSINode: %v", err)
	}
	return csiNode
}

func TestInstallAndUninstallAgainstAPIServer(t *testing.T) {
	fx, node, m, ctx := setup(t)
	a := nodeinfo.DriverInfo{
		Name: "a.csi.example.com", NodeID: "id-a", MaxVolumes: 16,
		Topology: map[string]string{"topology.a.example.com/zone": "z1", "topology.a.example.com/rack": "r1"},
	}
	b := nodeinfo.DriverInfo{
		Name: "b.csi.example.com", NodeID: "id-b",
		Topology: map[string]string{"topology.b.example.com/pool": "p1"},
	}

	if err := m.Install(ctx, a); err != nil {
		t.Fatalf("Install(a) error: %v", err)
	}
	csiNode := readCSINode(ctx, t, fx)
	wantOwners := []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: fx.NodeName, UID: node.UID}}
	if diff := cmp.Diff(wantOwners, csiNode.OwnerReferences); diff != "" {
		t.Errorf("CSINode ownerReferences mismatch (-want +got):\n%s", diff)
	}
	entryA := storagev1.CSINodeDriver{
		Name: a.Name, NodeID: "id-a",
		TopologyKeys: []string{"topology.a.example.com/rack", "topology.a.example.com/zone"},
		Allocatable:  &storagev1.VolumeNodeResources{Count: ptr.To[int32](16)},
	}
	if diff := cmp.Diff([]storagev1.CSINodeDriver{entryA}, csiNode.Spec.Drivers); diff != "" {
		t.Errorf("CSINode drivers after Install(a) mismatch (-want +got):\n%s", diff)
	}
	gotNode, ids := readNode(ctx, t, fx)
	if diff := cmp.Diff(map[string]string{a.Name: "id-a"}, ids); diff != "" {
		t.Errorf("node ID annotation mismatch (-want +got):\n%s", diff)
	}
	for k, v := range a.Topology {
		if gotNode.Labels[k] != v {
			t.Errorf("Node label %s = %q, want %q", k, gotNode.Labels[k], v)
		}
	}

	if err := m.Install(ctx, b); err != nil {
		t.Fatalf("Install(b) error: %v", err)
	}
	entryB := storagev1.CSINodeDriver{Name: b.Name, NodeID: "id-b", TopologyKeys: []string{"topology.b.example.com/pool"}}
	if diff := cmp.Diff([]storagev1.CSINodeDriver{entryA, entryB}, readCSINode(ctx, t, fx).Spec.Drivers); diff != "" {
		t.Errorf("CSINode drivers after Install(b) mismatch (-want +got):\n%s", diff)
	}
	gotNode, ids = readNode(ctx, t, fx)
	if diff := cmp.Diff(map[string]string{a.Name: "id-a", b.Name: "id-b"}, ids); diff != "" {
		t.Errorf("merged node ID annotation mismatch (-want +got):\n%s", diff)
	}
	if gotNode.Labels["topology.b.example.com/pool"] != "p1" {
		t.Errorf("Node labels = %v, want driver b's pool label", gotNode.Labels)
	}

	if err := m.Uninstall(ctx, a.Name); err != nil {
		t.Fatalf("Uninstall(a) error: %v", err)
	}
	if diff := cmp.Diff([]storagev1.CSINodeDriver{entryB}, readCSINode(ctx, t, fx).Spec.Drivers); diff != "" {
		t.Errorf("CSINode drivers after Uninstall(a) mismatch (-want +got):\n%s", diff)
	}
	gotNode, ids = readNode(ctx, t, fx)
	if diff := cmp.Diff(map[string]string{b.Name: "id-b"}, ids); diff != "" {
		t.Errorf("node ID annotation after Uninstall(a) mismatch (-want +got):\n%s", diff)
	}
	if _, ok := gotNode.Labels["topology.a.example.com/zone"]; ok || gotNode.Labels["topology.b.example.com/pool"] != "p1" {
		t.Errorf("Node labels after Uninstall(a) = %v, want a's zone label removed and b's pool label kept", gotNode.Labels)
	}

	if err := m.Uninstall(ctx, b.Name); err != nil {
		t.Fatalf("Uninstall(b) error: %v", err)
	}
	if gotNode, _ = readNode(ctx, t, fx); gotNode.Annotations[nodeinfo.AnnotationNodeID] != "" {
		t.Errorf("annotation %s = %q after the last Uninstall, want it removed",
			nodeinfo.AnnotationNodeID, gotNode.Annotations[nodeinfo.AnnotationNodeID])
	}
	if drivers := readCSINode(ctx, t, fx).Spec.Drivers; len(drivers) != 0 {
		t.Errorf("CSINode drivers after the last Uninstall = %+v, want none", drivers)
	}
}

func TestTopologyConflictChangesNothing(t *testing.T) {
	fx, _, m, ctx := setup(t, func(n *corev1.Node) { n.Labels["topology.example.com/zone"] = "z1" })
	before, _ := readNode(ctx, t, fx)

	err := m.Install(ctx, nodeinfo.DriverInfo{
		Name: "c.csi.example.com", NodeID: "id-c",
		Topology: map[string]string{"topology.example.com/zone": "z2", "topology.example.com/rack": "r1"},
	})
	var conflict *nodeinfo.TopologyConflictError
	if !errors.As(err, &conflict) || len(conflict.Conflicts) != 1 || conflict.Conflicts[0].Key != "topology.example.com/zone" {
		t.Fatalf("Install() = %v, want a TopologyConflictError for topology.example.com/zone", err)
	}
	after, _ := readNode(ctx, t, fx)
	if after.ResourceVersion != before.ResourceVersion {
		t.Errorf("Node changed (resourceVersion %s → %s) although Install was rejected; labels %v",
			before.ResourceVersion, after.ResourceVersion, after.Labels)
	}
	if _, err := fx.Client.StorageV1().CSINodes().Get(ctx, fx.NodeName, metav1.GetOptions{}); err == nil {
		t.Error("CSINode was created although Install was rejected")
	}
}

func TestNodeNotFoundAgainstAPIServer(t *testing.T) {
	fx := k8stest.New(t) // NodeName is unique and no Node is created
	m, err := nodeinfo.New(nodeinfo.Config{Client: fx.Client, NodeName: fx.NodeName})
	if err != nil {
		t.Fatalf("nodeinfo.New() error: %v", err)
	}
	err = m.Install(t.Context(), nodeinfo.DriverInfo{Name: "d.csi.example.com", NodeID: "id-d"})
	if !errors.Is(err, nodeinfo.ErrNodeNotFound) {
		t.Fatalf("Install() without a Node = %v, want ErrNodeNotFound", err)
	}
}

// TestConcurrentInstallsLoseNothing runs several Managers for the same node
// at once, as separate agent processes would, and checks that the
// resourceVersion preconditions keep every driver's annotation entry and
// CSINode entry.
func TestConcurrentInstallsLoseNothing(t *testing.T) {
	fx, _, _, ctx := setup(t)
	const n = 5
	backoff := wait.Backoff{Steps: 30, Duration: 5 * time.Millisecond, Factor: 1.2, Jitter: 1}

	var wg sync.WaitGroup
	errs := make([]error, n)
	want := map[string]string{}
	for i := range n {
		info := nodeinfo.DriverInfo{Name: fmt.Sprintf("c%d.csi.example.com", i), NodeID: fmt.Sprintf("id-%d", i),
			Topology: map[string]string{fmt.Sprintf("topology.c%d.example.com/zone", i): "z"}}
		want[info.Name] = info.NodeID
		m, err := nodeinfo.New(nodeinfo.Config{Client: fx.Client, NodeName: fx.NodeName, Backoff: backoff})
		if err != nil {
			t.Fatalf("nodeinfo.New() error: %v", err)
		}
		wg.Go(func() { errs[i] = m.Install(ctx, info) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("concurrent Install() errors: %v", err)
	}

	_, ids := readNode(ctx, t, fx)
	if diff := cmp.Diff(want, ids); diff != "" {
		t.Errorf("node ID annotation lost entries (-want +got):\n%s", diff)
	}
	got := map[string]string{}
	for _, d := range readCSINode(ctx, t, fx).Spec.Drivers {
		got[d.Name] = d.NodeID
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("CSINode lost driver entries (-want +got):\n%s", diff)
	}
}

func TestStaleCSINodeIsReplacedAgainstAPIServer(t *testing.T) {
	fx, node, m, ctx := setup(t)
	stale := &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: fx.NodeName, OwnerReferences: []metav1.OwnerReference{
			{APIVersion: "v1", Kind: "Node", Name: fx.NodeName, UID: "00000000-0000-0000-0000-000000000001"},
		}},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: "old.csi.example.com", NodeID: "old"}}},
	}
	if _, err := fx.Client.StorageV1().CSINodes().Create(ctx, stale, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating stale CSINode: %v", err)
	}

	if err := m.EnsureCSINode(ctx); err != nil {
		t.Fatalf("EnsureCSINode() error: %v", err)
	}
	csiNode := readCSINode(ctx, t, fx)
	if len(csiNode.OwnerReferences) != 1 || csiNode.OwnerReferences[0].UID != node.UID {
		t.Errorf("CSINode ownerReferences = %+v, want the current Node (uid %s)", csiNode.OwnerReferences, node.UID)
	}
	if len(csiNode.Spec.Drivers) != 0 {
		t.Errorf("CSINode drivers = %+v, want the stale entries gone", csiNode.Spec.Drivers)
	}
}

// TestMigratedPluginsAnnotation: a registered CSI driver that took over an
// in-tree plugin puts that plugin into the CSINode's
// storage.alpha.kubernetes.io/migrated-plugins annotation, which the
// attach/detach controller and the scheduler read; the annotation goes
// with the last such driver.
func TestMigratedPluginsAnnotation(t *testing.T) {
	fx, _, m, ctx := setup(t)
	annotation := func() (string, bool) {
		v, ok := readCSINode(ctx, t, fx).Annotations[corev1.MigratedPluginsAnnotationKey]
		return v, ok
	}
	other := nodeinfo.DriverInfo{Name: "other.csi.example.com", NodeID: "id"}
	if err := m.Install(ctx, other); err != nil {
		t.Fatal(err)
	}
	if v, ok := annotation(); ok {
		t.Errorf("annotation with no migrated driver = %q, want none", v)
	}
	for _, d := range []string{"ebs.csi.aws.com", "pd.csi.storage.gke.io"} {
		if err := m.Install(ctx, nodeinfo.DriverInfo{Name: d, NodeID: "id"}); err != nil {
			t.Fatal(err)
		}
	}
	if v, _ := annotation(); v != "kubernetes.io/aws-ebs,kubernetes.io/gce-pd" {
		t.Errorf("annotation = %q, want kubernetes.io/aws-ebs,kubernetes.io/gce-pd", v)
	}
	if err := m.Uninstall(ctx, "pd.csi.storage.gke.io"); err != nil {
		t.Fatal(err)
	}
	if v, _ := annotation(); v != "kubernetes.io/aws-ebs" {
		t.Errorf("annotation after the GCE driver went = %q, want kubernetes.io/aws-ebs", v)
	}
	if err := m.Uninstall(ctx, "ebs.csi.aws.com"); err != nil {
		t.Fatal(err)
	}
	if v, ok := annotation(); ok {
		t.Errorf("annotation after the last migrated driver went = %q, want none", v)
	}
}
