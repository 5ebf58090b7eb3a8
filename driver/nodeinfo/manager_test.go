package nodeinfo

import (
	"encoding/json"
	"errors"
	"maps"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
)

const testNode = "node-1"

var testBackoff = wait.Backoff{Steps: 4, Duration: time.Millisecond, Factor: 2}

func newNode(mutate func(*corev1.Node)) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:            testNode,
		UID:             "node-uid-1",
		ResourceVersion: "10",
		Labels:          map[string]string{"kubernetes.io/hostname": testNode},
	}}
	if mutate != nil {
		mutate(n)
	}
	return n
}

func newManager(t *testing.T, objects ...runtime.Object) (*Manager, *fake.Clientset) {
	t.Helper()
	client := fake.NewClientset(objects...)
	m, err := New(Config{Client: client, NodeName: testNode, Backoff: testBackoff})
	if err != nil {
		t.Fatalf("New() error: %v", err)
	}
	return m, client
}

func getNode(t *testing.T, client *fake.Clientset) *corev1.Node {
	t.Helper()
	n, err := client.CoreV1().Nodes().Get(t.Context(), testNode, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("getting Node: %v", err)
	}
	return n
}

func getCSINode(t *testing.T, client *fake.Clientset) *storagev1.CSINode {
	t.Helper()
	n, err := client.StorageV1().CSINodes().Get(t.Context(), testNode, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("getting CSINode: %v", err)
	}
	return n
}

func nodeIDAnnotation(t *testing.T, node *corev1.Node) map[string]string {
	t.Helper()
	value, ok := node.Annotations[AnnotationNodeID]
	if !ok {
		return nil
	}
	ids := map[string]string{}
	if err := json.Unmarshal([]byte(value), &ids); err != nil {
		t.Fatalf("annotation %s=%q is not a JSON map: %v", AnnotationNodeID, value, err)
	}
	return ids
}

// writes returns the create, update, patch and delete actions recorded by
// client.
func writes(client *fake.Clientset) []k8stesting.Action {
	var out []k8stesting.Action
	for _, a := range client.Actions() {
		switch a.GetVerb() {
		case "create", "update", "patch", "delete":
			out = append(out, a)
		}
	}
	return out
}

var driverA = DriverInfo{
	Name:       "a.csi.example.com",
	NodeID:     "id-a",
	MaxVolumes: 10,
	Topology:   map[string]string{"topology.a.example.com/zone": "z1", "topology.a.example.com/rack": "r1"},
}

var driverB = DriverInfo{
	Name:     "b.csi.example.com",
	NodeID:   "id-b",
	Topology: map[string]string{"topology.b.example.com/pool": "p1"},
}

func TestDriverInfoValidate(t *testing.T) {
	tests := map[string]struct {
		info    DriverInfo
		wantErr string
	}{
		"valid":                {info: driverA},
		"valid, no topology":   {info: DriverInfo{Name: "x.example.com", NodeID: "n"}},
		"upper case name":      {info: DriverInfo{Name: "X.Example.COM", NodeID: "n"}},
		"empty name":           {info: DriverInfo{NodeID: "n"}, wantErr: "driver name must not be empty"},
		"name too long":        {info: DriverInfo{Name: strings.Repeat("a", 64), NodeID: "n"}, wantErr: "at most 63"},
		"name not a subdomain": {info: DriverInfo{Name: "bad_name", NodeID: "n"}, wantErr: "driver name \"bad_name\""},
		"empty node ID":        {info: DriverInfo{Name: "x.example.com"}, wantErr: "node ID must not be empty"},
		"node ID too long": {
			info:    DriverInfo{Name: "x.example.com", NodeID: strings.Repeat("n", 257)},
			wantErr: "at most 256",
		},
		"negative max volumes": {
			info:    DriverInfo{Name: "x.example.com", NodeID: "n", MaxVolumes: -1},
			wantErr: "must not be negative",
		},
		"invalid topology key": {
			info:    DriverInfo{Name: "x.example.com", NodeID: "n", Topology: map[string]string{"a/b/c": "v"}},
			wantErr: "topology key \"a/b/c\"",
		},
		"invalid topology value": {
			info:    DriverInfo{Name: "x.example.com", NodeID: "n", Topology: map[string]string{"zone": "-bad-"}},
			wantErr: "topology value \"-bad-\"",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := tc.info.Validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate() error: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidDriverInfo) {
				t.Fatalf("Validate() = %v, want ErrInvalidDriverInfo", err)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Validate() = %q, want it to mention %q", err, tc.wantErr)
			}

			// Install and Uninstall reject it before any API call.
			_, ctx := ktesting.NewTestContext(t)
			m, client := newManager(t, newNode(nil))
			if err := m.Install(ctx, tc.info); !errors.Is(err, ErrInvalidDriverInfo) {
				t.Errorf("Install() = %v, want ErrInvalidDriverInfo", err)
			}
			if got := client.Actions(); len(got) != 0 {
				t.Errorf("Install() of invalid info called the API: %v", got)
			}
		})
	}
}

func TestNewValidatesConfig(t *testing.T) {
	client := fake.NewClientset()
	tests := map[string]Config{
		"no client":        {NodeName: testNode},
		"no node name":     {Client: client},
		"invalid nodeName": {Client: client, NodeName: "Node_1"},
	}
	for name, cfg := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := New(cfg); err == nil {
				t.Errorf("New(%+v) succeeded, want an error", cfg)
			}
		})
	}
	m, err := New(Config{Client: client, NodeName: testNode})
	if err != nil {
		t.Fatalf("New() error: %v", err)
	}
	if m.backoff != DefaultBackoff {
		t.Errorf("backoff = %+v, want DefaultBackoff", m.backoff)
	}
}

func TestInstallCreatesCSINodeAnnotationAndLabels(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	m, client := newManager(t, newNode(nil))

	if err := m.Install(ctx, driverA); err != nil {
		t.Fatalf("Install() error: %v", err)
	}

	node := getNode(t, client)
	if diff := cmp.Diff(map[string]string{driverA.Name: "id-a"}, nodeIDAnnotation(t, node)); diff != "" {
		t.Errorf("node ID annotation mismatch (-want +got):\n%s", diff)
	}
	wantLabels := map[string]string{
		"kubernetes.io/hostname":      testNode,
		"topology.a.example.com/zone": "z1",
		"topology.a.example.com/rack": "r1",
	}
	if diff := cmp.Diff(wantLabels, node.Labels); diff != "" {
		t.Errorf("Node labels mismatch (-want +got):\n%s", diff)
	}

	csiNode := getCSINode(t, client)
	wantOwners := []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: testNode, UID: "node-uid-1"}}
	if diff := cmp.Diff(wantOwners, csiNode.OwnerReferences); diff != "" {
		t.Errorf("CSINode ownerReferences mismatch (-want +got):\n%s", diff)
	}
	wantDrivers := []storagev1.CSINodeDriver{{
		Name:         driverA.Name,
		NodeID:       "id-a",
		TopologyKeys: []string{"topology.a.example.com/rack", "topology.a.example.com/zone"},
		Allocatable:  &storagev1.VolumeNodeResources{Count: ptr.To[int32](10)},
	}}
	if diff := cmp.Diff(wantDrivers, csiNode.Spec.Drivers); diff != "" {
		t.Errorf("CSINode drivers mismatch (-want +got):\n%s", diff)
	}

	// Every patch carries the resourceVersion it was computed from.
	for _, a := range writes(client) {
		if p, ok := a.(k8stesting.PatchAction); ok {
			if p.GetPatchType() != types.StrategicMergePatchType {
				t.Errorf("%s patch type = %s, want strategic merge", p.GetResource().Resource, p.GetPatchType())
			}
			if !strings.Contains(string(p.GetPatch()), `"resourceVersion":"10"`) {
				t.Errorf("%s patch %s carries no resourceVersion precondition", p.GetResource().Resource, p.GetPatch())
			}
		}
	}

	// A second Install of the same info writes nothing.
	client.ClearActions()
	if err := m.Install(ctx, driverA); err != nil {
		t.Fatalf("second Install() error: %v", err)
	}
	if got := writes(client); len(got) != 0 {
		t.Errorf("repeated Install() wrote to the API: %v", got)
	}
}

func TestInstallTwoDriversAndUninstall(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	m, client := newManager(t, newNode(nil))

	for _, info := range []DriverInfo{driverA, driverB} {
		if err := m.Install(ctx, info); err != nil {
			t.Fatalf("Install(%s) error: %v", info.Name, err)
		}
	}
	node := getNode(t, client)
	wantIDs := map[string]string{driverA.Name: "id-a", driverB.Name: "id-b"}
	if diff := cmp.Diff(wantIDs, nodeIDAnnotation(t, node)); diff != "" {
		t.Errorf("merged annotation mismatch (-want +got):\n%s", diff)
	}
	if got := node.Labels["topology.b.example.com/pool"]; got != "p1" {
		t.Errorf("label of driver B = %q, want p1", got)
	}
	csiNode := getCSINode(t, client)
	if len(csiNode.Spec.Drivers) != 2 || csiNode.Spec.Drivers[1].Name != driverB.Name ||
		csiNode.Spec.Drivers[1].Allocatable != nil {
		t.Errorf("CSINode drivers = %+v, want A then B (B without allocatable)", csiNode.Spec.Drivers)
	}

	if err := m.Uninstall(ctx, driverA.Name); err != nil {
		t.Fatalf("Uninstall(A) error: %v", err)
	}
	node = getNode(t, client)
	if diff := cmp.Diff(map[string]string{driverB.Name: "id-b"}, nodeIDAnnotation(t, node)); diff != "" {
		t.Errorf("annotation after Uninstall(A) mismatch (-want +got):\n%s", diff)
	}
	if got, ok := node.Labels["topology.a.example.com/zone"]; ok {
		t.Errorf("topology label of A = %q after Uninstall, want it removed", got)
	}
	if got := node.Labels["topology.b.example.com/pool"]; got != "p1" {
		t.Errorf("label of driver B = %q after Uninstall(A), want p1 kept", got)
	}
	csiNode = getCSINode(t, client)
	if len(csiNode.Spec.Drivers) != 1 || csiNode.Spec.Drivers[0].Name != driverB.Name {
		t.Errorf("CSINode drivers after Uninstall(A) = %+v, want only B", csiNode.Spec.Drivers)
	}

	if err := m.Uninstall(ctx, driverB.Name); err != nil {
		t.Fatalf("Uninstall(B) error: %v", err)
	}
	node = getNode(t, client)
	if _, ok := node.Annotations[AnnotationNodeID]; ok {
		t.Errorf("annotation %s still present after the last driver was uninstalled: %q",
			AnnotationNodeID, node.Annotations[AnnotationNodeID])
	}
	if csiNode := getCSINode(t, client); len(csiNode.Spec.Drivers) != 0 {
		t.Errorf("CSINode drivers after uninstalling all = %+v, want none", csiNode.Spec.Drivers)
	}

	// Uninstalling again is a no-op.
	client.ClearActions()
	if err := m.Uninstall(ctx, driverB.Name); err != nil {
		t.Fatalf("repeated Uninstall() error: %v", err)
	}
	if got := writes(client); len(got) != 0 {
		t.Errorf("repeated Uninstall() wrote to the API: %v", got)
	}
}

func TestInstallReplacesEntry(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	m, client := newManager(t, newNode(nil))
	if err := m.Install(ctx, driverA); err != nil {
		t.Fatalf("Install() error: %v", err)
	}
	if err := m.Install(ctx, driverB); err != nil {
		t.Fatalf("Install() error: %v", err)
	}

	changed := DriverInfo{Name: driverA.Name, NodeID: "id-a2", MaxVolumes: math.MaxInt64,
		Topology: map[string]string{"topology.a.example.com/zone": "z1"}}
	if err := m.Install(ctx, changed); err != nil {
		t.Fatalf("Install(changed) error: %v", err)
	}
	want := []storagev1.CSINodeDriver{
		{
			Name:         driverA.Name,
			NodeID:       "id-a2",
			TopologyKeys: []string{"topology.a.example.com/zone"},
			Allocatable:  &storagev1.VolumeNodeResources{Count: ptr.To[int32](math.MaxInt32)},
		},
		{Name: driverB.Name, NodeID: "id-b", TopologyKeys: []string{"topology.b.example.com/pool"}},
	}
	if diff := cmp.Diff(want, getCSINode(t, client).Spec.Drivers); diff != "" {
		t.Errorf("CSINode drivers mismatch (-want +got):\n%s", diff)
	}
	wantIDs := map[string]string{driverA.Name: "id-a2", driverB.Name: "id-b"}
	if diff := cmp.Diff(wantIDs, nodeIDAnnotation(t, getNode(t, client))); diff != "" {
		t.Errorf("annotation mismatch (-want +got):\n%s", diff)
	}

	noLimit := changed
	noLimit.MaxVolumes = 0
	if err := m.Install(ctx, noLimit); err != nil {
		t.Fatalf("Install(no limit) error: %v", err)
	}
	if got := getCSINode(t, client).Spec.Drivers[0].Allocatable; got != nil {
		t.Errorf("allocatable = %+v for max volumes 0, want nil (no limit)", got)
	}
}

func TestInstallTopologyConflict(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	node := newNode(func(n *corev1.Node) {
		n.Labels["topology.a.example.com/zone"] = "other"
		n.Labels["topology.a.example.com/rack"] = "r1" // same value: no conflict
	})
	m, client := newManager(t, node)

	err := m.Install(ctx, driverA)
	var conflict *TopologyConflictError
	if !errors.As(err, &conflict) {
		t.Fatalf("Install() = %v, want a *TopologyConflictError", err)
	}
	want := []LabelConflict{{Key: "topology.a.example.com/zone", DriverValue: "z1", NodeValue: "other"}}
	if diff := cmp.Diff(want, conflict.Conflicts); diff != "" {
		t.Errorf("conflicts mismatch (-want +got):\n%s", diff)
	}
	for _, s := range []string{driverA.Name, testNode, `topology.a.example.com/zone="z1"`, `"other"`} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %s", err, s)
		}
	}
	if got := writes(client); len(got) != 0 {
		t.Errorf("rejected Install() wrote to the API: %v", got)
	}
}

func TestInstallNodeNotFound(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	m, client := newManager(t)
	err := m.Install(ctx, driverA)
	if !errors.Is(err, ErrNodeNotFound) || !apierrors.IsNotFound(err) {
		t.Fatalf("Install() = %v, want ErrNodeNotFound wrapping the API's NotFound", err)
	}
	if !strings.Contains(err.Error(), testNode) {
		t.Errorf("error %q does not name the node", err)
	}
	if got := writes(client); len(got) != 0 {
		t.Errorf("Install() without a Node wrote to the API: %v", got)
	}
	if err := m.EnsureCSINode(ctx); !errors.Is(err, ErrNodeNotFound) {
		t.Errorf("EnsureCSINode() = %v, want ErrNodeNotFound", err)
	}
	// Nothing to remove: Uninstall succeeds.
	if err := m.Uninstall(ctx, driverA.Name); err != nil {
		t.Errorf("Uninstall() without Node and CSINode = %v, want nil", err)
	}
}

func TestInvalidNodeIDAnnotation(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	m, client := newManager(t, newNode(func(n *corev1.Node) {
		n.Annotations = map[string]string{AnnotationNodeID: "{not json"}
	}))
	if err := m.Install(ctx, driverA); err == nil || !strings.Contains(err.Error(), AnnotationNodeID) {
		t.Errorf("Install() = %v, want an error about the unparsable annotation", err)
	}
	if got := writes(client); len(got) != 0 {
		t.Errorf("Install() wrote to the API despite the unparsable annotation: %v", got)
	}
}

// failOnce returns a reactor that fails the first matching call with err and
// counts all matching calls.
func failOnce(err error, calls *int) k8stesting.ReactionFunc {
	return func(k8stesting.Action) (bool, runtime.Object, error) {
		*calls++
		if *calls == 1 {
			return true, nil, err
		}
		return false, nil, nil
	}
}

func TestConflictsAreRetried(t *testing.T) {
	nodeGR := schema.GroupResource{Resource: "nodes"}
	csiNodeGR := schema.GroupResource{Group: "storage.k8s.io", Resource: "csinodes"}
	existingCSINode := &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: testNode, OwnerReferences: []metav1.OwnerReference{
			{APIVersion: "v1", Kind: "Node", Name: testNode, UID: "node-uid-1"},
		}},
	}
	tests := map[string]struct {
		verb, resource string
		err            error
		objects        []runtime.Object
	}{
		"Node patch conflict": {
			verb: "patch", resource: "nodes", err: apierrors.NewConflict(nodeGR, testNode, errors.New("changed")),
			objects: []runtime.Object{newNode(nil)},
		},
		"CSINode patch conflict": {
			verb: "patch", resource: "csinodes", err: apierrors.NewConflict(csiNodeGR, testNode, errors.New("changed")),
			objects: []runtime.Object{newNode(nil), existingCSINode},
		},
		"CSINode created concurrently": {
			verb: "create", resource: "csinodes", err: apierrors.NewAlreadyExists(csiNodeGR, testNode),
			objects: []runtime.Object{newNode(nil)},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			m, client := newManager(t, tc.objects...)
			calls := 0
			client.PrependReactor(tc.verb, tc.resource, failOnce(tc.err, &calls))

			if err := m.Install(ctx, driverA); err != nil {
				t.Fatalf("Install() error: %v", err)
			}
			if calls != 2 {
				t.Errorf("%s %s was called %d times, want 2 (one failure, one retry)", tc.verb, tc.resource, calls)
			}
			if got := nodeIDAnnotation(t, getNode(t, client)); got[driverA.Name] != "id-a" {
				t.Errorf("annotation after retry = %v, want driver A's node ID", got)
			}
			if got := getCSINode(t, client).Spec.Drivers; len(got) != 1 || got[0].NodeID != "id-a" {
				t.Errorf("CSINode drivers after retry = %+v, want driver A", got)
			}
		})
	}
}

func TestPersistentConflictGivesUp(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	m, client := newManager(t, newNode(nil))
	calls := 0
	client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		calls++
		return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "nodes"}, testNode, errors.New("changed"))
	})
	err := m.Install(ctx, driverA)
	if !apierrors.IsConflict(err) {
		t.Fatalf("Install() = %v, want the Conflict after retries are exhausted", err)
	}
	if calls != testBackoff.Steps {
		t.Errorf("Node patch attempts = %d, want %d (Backoff.Steps)", calls, testBackoff.Steps)
	}
}

func TestStaleCSINodeIsReplaced(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	stale := &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: testNode, UID: "csinode-old", OwnerReferences: []metav1.OwnerReference{
			{APIVersion: "v1", Kind: "Node", Name: testNode, UID: "node-uid-old"},
		}},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: "gone.example.com", NodeID: "x"}}},
	}
	m, client := newManager(t, newNode(nil), stale)

	if err := m.EnsureCSINode(ctx); err != nil {
		t.Fatalf("EnsureCSINode() error: %v", err)
	}
	csiNode := getCSINode(t, client)
	if len(csiNode.OwnerReferences) != 1 || csiNode.OwnerReferences[0].UID != "node-uid-1" {
		t.Errorf("ownerReferences = %+v, want the current Node's UID", csiNode.OwnerReferences)
	}
	if len(csiNode.Spec.Drivers) != 0 {
		t.Errorf("drivers = %+v, want the stale entries gone", csiNode.Spec.Drivers)
	}
	var deleted bool
	for _, a := range writes(client) {
		if d, ok := a.(k8stesting.DeleteAction); ok && d.GetName() == testNode {
			deleted = true
			if pre := d.GetDeleteOptions().Preconditions; pre == nil || pre.UID == nil || *pre.UID != "csinode-old" {
				t.Errorf("stale CSINode deleted without a UID precondition: %+v", d.GetDeleteOptions())
			}
		}
	}
	if !deleted {
		t.Error("stale CSINode was not deleted")
	}

	// EnsureCSINode on an owned CSINode writes nothing.
	client.ClearActions()
	if err := m.EnsureCSINode(ctx); err != nil {
		t.Fatalf("second EnsureCSINode() error: %v", err)
	}
	if got := writes(client); len(got) != 0 {
		t.Errorf("EnsureCSINode() on an owned CSINode wrote to the API: %v", got)
	}
}

// TestTopologyLabelOwnership: a driver's Uninstall removes the topology
// labels it added, keeps labels that existed before it and labels another
// registered driver still reports, and drops labels it stopped reporting.
func TestTopologyLabelOwnership(t *testing.T) {
	const zone, rack, shared = "topology.example.com/zone", "topology.example.com/rack", "topology.kubernetes.io/region"
	a := DriverInfo{Name: "a.example.com", NodeID: "id-a", Topology: map[string]string{zone: "z1", shared: "r1"}}
	b := DriverInfo{Name: "b.example.com", NodeID: "id-b", Topology: map[string]string{shared: "r1"}}
	preexisting := DriverInfo{Name: "c.example.com", NodeID: "id-c", Topology: map[string]string{corev1.LabelHostname: testNode}}

	type step struct {
		install   *DriverInfo
		uninstall string
		want      map[string]string // labels besides the hostname label
	}
	tests := map[string][]step{
		"added label goes with its driver": {
			{install: &a, want: map[string]string{zone: "z1", shared: "r1"}},
			{uninstall: a.Name, want: map[string]string{}},
		},
		"shared label stays while another driver reports it": {
			{install: &a, want: map[string]string{zone: "z1", shared: "r1"}},
			{install: &b, want: map[string]string{zone: "z1", shared: "r1"}},
			{uninstall: a.Name, want: map[string]string{shared: "r1"}},
			{uninstall: b.Name, want: map[string]string{}},
		},
		"pre-existing label is never removed": {
			{install: &preexisting, want: map[string]string{}},
			{uninstall: preexisting.Name, want: map[string]string{}},
		},
		"label no longer reported is removed on re-install": {
			{install: &a, want: map[string]string{zone: "z1", shared: "r1"}},
			{install: &DriverInfo{Name: a.Name, NodeID: "id-a", Topology: map[string]string{rack: "k1"}}, want: map[string]string{rack: "k1"}},
			{uninstall: a.Name, want: map[string]string{}},
		},
	}
	for name, steps := range tests {
		t.Run(name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			m, client := newManager(t, newNode(nil))
			for i, st := range steps {
				if st.install != nil {
					if err := m.Install(ctx, *st.install); err != nil {
						t.Fatalf("step %d: Install(%s): %v", i, st.install.Name, err)
					}
				} else if err := m.Uninstall(ctx, st.uninstall); err != nil {
					t.Fatalf("step %d: Uninstall(%s): %v", i, st.uninstall, err)
				}
				labels := maps.Clone(getNode(t, client).Labels)
				if labels[corev1.LabelHostname] != testNode {
					t.Fatalf("step %d: hostname label lost: %v", i, labels)
				}
				delete(labels, corev1.LabelHostname)
				if diff := cmp.Diff(st.want, labels, cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("step %d: labels mismatch (-want +got):\n%s", i, diff)
				}
			}
			if ann, ok := getNode(t, client).Annotations[AnnotationTopologyLabels]; ok && len(steps) > 0 && steps[len(steps)-1].uninstall != "" {
				t.Errorf("ownership annotation left after the last Uninstall: %s", ann)
			}
		})
	}
}
