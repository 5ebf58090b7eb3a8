package e2e_test

import (
	"fmt"
	"strings"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

const nodeExpand = "NodeExpandVolume"

// expandCaps are a node plugin with staging and node expansion.
func expandCaps() plugin.Capabilities {
	return plugin.Capabilities{StageUnstage: true, Expand: true, VolumeStats: true}
}

// callsOf returns the plugin's calls of method for the volume handle.
func callsOf(t *testing.T, p *plugintest.Plugin, handle, method string) []plugin.Call {
	t.Helper()
	entries, err := p.ReadJournal()
	if err != nil {
		t.Fatal(err)
	}
	var out []plugin.Call
	for _, c := range plugin.Calls(entries) {
		if c.Begin.Method == method && c.Begin.VolumeID == handle {
			out = append(out, c)
		}
	}
	return out
}

// resizeAsTheResizer does what the external-resizer does, in its order, for
// a claim whose request grew to size. With recovery
// (RecoverVolumeExpansionFailure): the claim's allocatedResources and
// ControllerResizeInProgress, ControllerExpandVolume on the plugin, the
// PV's capacity, then allocatedResourceStatuses[storage]=NodeResizePending.
// Without, as older resizers: the FileSystemResizePending condition,
// ControllerExpandVolume and the PV's capacity.
func resizeAsTheResizer(t *testing.T, f *k8stest.Fixture, p *plugintest.Plugin, pvName, pvcName, handle string, size resource.Quantity, recovery bool) {
	t.Helper()
	ctx := t.Context()
	setClaimStatus := func(edit func(*corev1.PersistentVolumeClaimStatus)) {
		t.Helper()
		pvc, err := f.Client.CoreV1().PersistentVolumeClaims(f.Namespace).Get(ctx, pvcName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		edit(&pvc.Status)
		if _, err := f.Client.CoreV1().PersistentVolumeClaims(f.Namespace).UpdateStatus(ctx, pvc, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("updating the PVC's status: %v", err)
		}
	}
	resizeStatus := func(s corev1.ClaimResourceStatus) func(*corev1.PersistentVolumeClaimStatus) {
		return func(st *corev1.PersistentVolumeClaimStatus) {
			st.AllocatedResources = corev1.ResourceList{corev1.ResourceStorage: size}
			st.AllocatedResourceStatuses = map[corev1.ResourceName]corev1.ClaimResourceStatus{corev1.ResourceStorage: s}
		}
	}
	if recovery {
		setClaimStatus(resizeStatus(corev1.PersistentVolumeClaimControllerResizeInProgress))
	} else {
		setClaimStatus(func(st *corev1.PersistentVolumeClaimStatus) {
			st.Conditions = append(st.Conditions, corev1.PersistentVolumeClaimCondition{
				Type: corev1.PersistentVolumeClaimFileSystemResizePending, Status: corev1.ConditionTrue,
				LastTransitionTime: metav1.Now(), Message: "Waiting for user to (re-)start a pod to finish file system resize of volume on node.",
			})
		})
	}
	conn, err := p.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := csi.NewControllerClient(conn).ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{
		VolumeId: handle, CapacityRange: &csi.CapacityRange{RequiredBytes: size.Value()},
	})
	if err != nil || !resp.GetNodeExpansionRequired() {
		t.Fatalf("ControllerExpandVolume = %v, %v; want node expansion required", resp, err)
	}
	pv, err := f.Client.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv.Spec.Capacity[corev1.ResourceStorage] = size
	if _, err := f.Client.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("updating the PV's capacity: %v", err)
	}
	if recovery {
		setClaimStatus(resizeStatus(corev1.PersistentVolumeClaimNodeResizePending))
	}
}

// waitClaim waits until the claim's status satisfies ok and returns it.
func waitClaim(t *testing.T, f *k8stest.Fixture, name, what string, ok func(*corev1.PersistentVolumeClaim) error) *corev1.PersistentVolumeClaim {
	t.Helper()
	var last *corev1.PersistentVolumeClaim
	eventually(t, "PVC "+name+": "+what, func() (bool, error) {
		pvc, err := f.Client.CoreV1().PersistentVolumeClaims(f.Namespace).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		last = pvc
		if err := ok(pvc); err != nil {
			return false, err
		}
		return true, nil
	})
	return last
}

// expanded checks that the claim's status says the resize to size is done:
// capacity, no allocatedResourceStatuses[storage], no resize condition.
func expanded(size resource.Quantity) func(*corev1.PersistentVolumeClaim) error {
	return func(pvc *corev1.PersistentVolumeClaim) error {
		got := pvc.Status.Capacity[corev1.ResourceStorage]
		if got.Cmp(size) != 0 {
			return fmt.Errorf("status.capacity is %s", got.String())
		}
		if st, ok := pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage]; ok {
			return fmt.Errorf("allocatedResourceStatuses[storage] is still %s", st)
		}
		for _, c := range pvc.Status.Conditions {
			if c.Type == corev1.PersistentVolumeClaimFileSystemResizePending || c.Type == corev1.PersistentVolumeClaimNodeResizeError {
				return fmt.Errorf("condition %s is still there", c.Type)
			}
		}
		return nil
	}
}

// expandSetup publishes a pod's PVC of a plugin that expands on the node.
type expandSetup struct {
	f      *k8stest.Fixture
	a      *agent
	p      *plugintest.Plugin
	vol    plugin.Volume
	driver string
	pvName string
}

func newExpandSetup(t *testing.T) *expandSetup {
	t.Helper()
	return newExpandSetupWith(t, agentOptions{})
}

func newExpandSetupWith(t *testing.T, opts agentOptions) *expandSetup {
	t.Helper()
	f := k8stest.New(t)
	f.CreateNode(t)
	a := startAgent(t, f, opts)
	driver := uniqueDriverName()
	createCSIDriver(t, f, driver, false)
	p := startPlugin(t, a, driver, expandCaps())
	vol := createVolume(t, p, "data", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	pvName := "pv-" + f.Namespace
	createBoundClaim(t, f, claim{PVName: pvName, PVCName: "data", Driver: driver, Handle: vol.ID})
	return &expandSetup{f: f, a: a, p: p, vol: vol, driver: driver, pvName: pvName}
}

// TestExpandInUse resizes the claim of a running pod as the external-resizer
// does (RecoverVolumeExpansionFailure): the agent calls NodeExpandVolume
// once, on the pod's target with the staging path and the new size, and
// writes the claim's new capacity, clearing NodeResizePending; the pod
// stays ready and its mount untouched. The claim and the volume are
// settled when the resize begins: the agent sees it on a re-read.
func TestExpandInUse(t *testing.T) {
	t.Parallel()
	expandInUse(t, agentOptions{})
}

// TestExpandInUseWatchingEveryObject: the same with
// --settled-object-resync=0, where the agent watches the claim and the
// volume and sees the resize from their watches.
func TestExpandInUseWatchingEveryObject(t *testing.T) {
	t.Parallel()
	expandInUse(t, agentOptions{SettledObjectResync: -1})
}

func expandInUse(t *testing.T, opts agentOptions) {
	s := newExpandSetupWith(t, opts)
	pod := createPod(t, s.f, "app", podVolume{Name: "data", ClaimName: "data"})
	waitReady(t, s.f, pod)
	if n := len(callsOf(t, s.p, s.vol.ID, nodeExpand)); n != 0 {
		t.Fatalf("NodeExpandVolume called %d times before any resize", n)
	}

	size := resource.MustParse("2Gi")
	resizeAsTheResizer(t, s.f, s.p, s.pvName, "data", s.vol.ID, size, true)
	waitClaim(t, s.f, "data", "expanded to 2Gi", expanded(size))

	calls := callsOf(t, s.p, s.vol.ID, nodeExpand)
	if len(calls) != 1 || calls[0].Code() != codes.OK {
		t.Fatalf("NodeExpandVolume calls = %q, want one that succeeded", methods(calls))
	}
	c := calls[0].Begin
	pub, st := publishPaths(s.a, pod, s.pvName), stagingPaths(s.a, s.driver, s.vol.ID)
	if c.RequiredBytes != size.Value() || c.VolumePath != pub.Target {
		t.Errorf("NodeExpandVolume asked for %d bytes at %q, want %d at %q", c.RequiredBytes, c.VolumePath, size.Value(), pub.Target)
	}
	if c.StagingPath != st.Path {
		t.Errorf("NodeExpandVolume staging path = %q, want %q", c.StagingPath, st.Path)
	}
	waitReady(t, s.f, pod)
	if n := countCalls(volumeCalls(t, s.p, s.vol.ID), nodeUnpublish); n != 0 {
		t.Errorf("the expansion unpublished the volume %d times", n)
	}
	// Nothing more to do: no second call on later events.
	resizeNoop(t, s.f, "data")
	if n := len(callsOf(t, s.p, s.vol.ID, nodeExpand)); n != 1 {
		t.Errorf("NodeExpandVolume called %d times after the resize was done, want 1", n)
	}
}

// resizeNoop touches the claim (a label), which makes the agent look at it
// again, and waits until the agent has seen it.
func resizeNoop(t *testing.T, f *k8stest.Fixture, name string) {
	t.Helper()
	pvc, err := f.Client.CoreV1().PersistentVolumeClaims(f.Namespace).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pvc.Labels == nil {
		pvc.Labels = map[string]string{}
	}
	pvc.Labels["touched"] = "yes"
	if _, err := f.Client.CoreV1().PersistentVolumeClaims(f.Namespace).Update(t.Context(), pvc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A label change is a new resourceVersion: the by-name watch reports it
	// within the pod's next evaluation; give the expander the same chance.
	waitClaim(t, f, name, "labelled", func(p *corev1.PersistentVolumeClaim) error {
		if p.Labels["touched"] != "yes" {
			return fmt.Errorf("no label yet")
		}
		return nil
	})
}

// TestExpandFinalErrorMarksTheClaim: a driver that refuses the new size for
// good (InvalidArgument) makes the claim NodeResizeInfeasible with a
// NodeResizeError condition carrying the driver's message, and the pod gets
// a VolumeResizeFailed Event; the pod keeps its mount and stays ready.
func TestExpandFinalErrorMarksTheClaim(t *testing.T) {
	t.Parallel()
	s := newExpandSetup(t)
	pod := createPod(t, s.f, "app", podVolume{Name: "data", ClaimName: "data"})
	waitReady(t, s.f, pod)
	const driverMessage = "the node's disk has no room for 2Gi"
	if err := s.p.SetFaults(plugin.FaultRule{Method: nodeExpand, Code: codes.InvalidArgument, Message: driverMessage}); err != nil {
		t.Fatal(err)
	}
	resizeAsTheResizer(t, s.f, s.p, s.pvName, "data", s.vol.ID, resource.MustParse("2Gi"), true)
	pvc := waitClaim(t, s.f, "data", "NodeResizeInfeasible", func(pvc *corev1.PersistentVolumeClaim) error {
		if st := pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage]; st != corev1.PersistentVolumeClaimNodeResizeInfeasible {
			return fmt.Errorf("allocatedResourceStatuses[storage] = %q", st)
		}
		return nil
	})
	var cond *corev1.PersistentVolumeClaimCondition
	for i := range pvc.Status.Conditions {
		if pvc.Status.Conditions[i].Type == corev1.PersistentVolumeClaimNodeResizeError {
			cond = &pvc.Status.Conditions[i]
		}
	}
	if cond == nil || cond.Status != corev1.ConditionTrue || !strings.Contains(cond.Message, driverMessage) {
		t.Errorf("NodeResizeError condition = %+v, want True with the driver's message", cond)
	}
	if got := pvc.Status.Capacity[corev1.ResourceStorage]; got.Cmp(resource.MustParse("1Gi")) != 0 {
		t.Errorf("status.capacity = %s, want still 1Gi", got.String())
	}
	waitEvent(t, s.f, pod, status.EventVolumeResizeFailed, driverMessage)
	waitReady(t, s.f, pod)
	// Infeasible: not retried until the claim changes.
	n := len(callsOf(t, s.p, s.vol.ID, nodeExpand))
	resizeNoop(t, s.f, "data")
	if got := len(callsOf(t, s.p, s.vol.ID, nodeExpand)); got != n {
		t.Errorf("NodeExpandVolume retried (%d calls, %d before) although the claim is NodeResizeInfeasible", got, n)
	}
}

// TestExpandLegacyResizer: a claim marked by an older resizer, with the
// FileSystemResizePending condition and no allocatedResources, is expanded
// too; the agent sets the capacity and removes the condition.
func TestExpandLegacyResizer(t *testing.T) {
	t.Parallel()
	s := newExpandSetup(t)
	pod := createPod(t, s.f, "app", podVolume{Name: "data", ClaimName: "data"})
	waitReady(t, s.f, pod)
	size := resource.MustParse("3Gi")
	resizeAsTheResizer(t, s.f, s.p, s.pvName, "data", s.vol.ID, size, false)
	waitClaim(t, s.f, "data", "expanded to 3Gi", expanded(size))
	if calls := callsOf(t, s.p, s.vol.ID, nodeExpand); len(calls) != 1 || calls[0].Begin.RequiredBytes != size.Value() {
		t.Errorf("NodeExpandVolume calls = %q, want one for %d bytes", methods(calls), size.Value())
	}
}

// TestExpandDuringMount: a claim resized while no pod used it is expanded
// when the next pod mounts it, before the pod is ready; a failure there
// keeps the pod not ready (NodeExpandFailed) until it succeeds.
func TestExpandDuringMount(t *testing.T) {
	t.Parallel()
	s := newExpandSetup(t)
	size := resource.MustParse("2Gi")
	resizeAsTheResizer(t, s.f, s.p, s.pvName, "data", s.vol.ID, size, true)
	if err := s.p.SetFaults(plugin.FaultRule{Method: nodeExpand, Code: codes.Unavailable, Message: "resize daemon restarting"}); err != nil {
		t.Fatal(err)
	}
	pod := createPod(t, s.f, "app", podVolume{Name: "data", ClaimName: "data"})
	waitReason(t, s.f, pod, status.ReasonNodeExpandFailed, "resize daemon restarting")
	if err := s.p.ClearFaults(); err != nil {
		t.Fatal(err)
	}
	waitReady(t, s.f, pod)
	waitClaim(t, s.f, "data", "expanded to 2Gi", expanded(size))
	calls := callsOf(t, s.p, s.vol.ID, nodeExpand)
	if len(okCalls(calls, nodeExpand)) != 1 {
		t.Errorf("NodeExpandVolume calls = %q, want exactly one that succeeded", methods(calls))
	}
	pubs := okCalls(volumeCalls(t, s.p, s.vol.ID), nodePublish)
	if len(pubs) == 0 || !endsBefore(pubs[0], okCalls(calls, nodeExpand)[0]) {
		t.Errorf("NodeExpandVolume did not follow a NodePublishVolume")
	}
}
