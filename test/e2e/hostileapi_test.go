package e2e_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

// TestHostileAPIObjects is issue 16's table of hostile API objects, against
// a real API server and one agent: each row is something the API server
// admits (or refuses, which the row asserts) that an operator, a controller
// or an attacker could write, and what the agent must make of it. Every row
// ends with a clear reason where a user looks (the pod's VolumesReady
// condition, an Event on the Node) or with the volume working, and at the
// end nothing lies outside the agent's root and every path a driver was
// given lies below it. docs/reliability.md lists the rows.
func TestHostileAPIObjects(t *testing.T) {
	t.Parallel()
	f := k8stest.New(t)
	f.CreateNode(t)
	a := startAgent(t, f, agentOptions{})
	h := &hostile{t: t, f: f, a: a, driver: uniqueDriverName()}
	// The main driver serves persistent and inline volumes with pod info.
	h.createCSIDriver(h.driver, func(d *storagev1.CSIDriver) {
		d.Spec.PodInfoOnMount = ptr.To(true)
		d.Spec.VolumeLifecycleModes = []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent, storagev1.VolumeLifecycleEphemeral}
	})
	h.p = startPlugin(t, a, h.driver, nodeCaps())

	t.Run("names and handles at the API's maximum lengths", h.maxLengths)
	t.Run("dot-dot and slash in every name that reaches a path", h.pathNames)
	t.Run("a driver name the API admits and CSI does not", h.upperCaseDriver)
	t.Run("a PV whose CSI source changes while mounted", h.pvSourceChanges)
	t.Run("a PVC rebound to another PV", h.claimRebound)
	t.Run("a VolumeAttachment for another node", h.attachmentForAnotherNode)
	t.Run("CSIDriver objects with every odd field the API admits", h.oddCSIDrivers)
	t.Run("a registration socket that lies about its name", h.lyingRegistrar)
	t.Run("two registrars for one driver", h.twoRegistrars)

	// Nothing outside the root, every path below it.
	assertPathsBelowRoot(t, a, h.plugins()...)
	assertOnlyRoot(t, a)
}

// hostile is the shared state of TestHostileAPIObjects.
type hostile struct {
	t      *testing.T
	f      *k8stest.Fixture
	a      *agent
	driver string
	p      *plugintest.Plugin
	extra  []*plugintest.Plugin
	n      int
}

func (h *hostile) plugins() []*plugintest.Plugin {
	return append([]*plugintest.Plugin{h.p}, h.extra...)
}

// name returns a short name unique within the test and the API server
// (PVs are cluster-scoped, and -count=2 runs the test again on the same
// one): the driver's random first label and a counter.
func (h *hostile) name(prefix string) string {
	h.n++
	return fmt.Sprintf("%s%s-%d", prefix, h.id(), h.n)
}

// id is the random first label of the test's driver name.
func (h *hostile) id() string { return strings.SplitN(h.driver, ".", 2)[0] }

func (h *hostile) createCSIDriver(name string, mutate func(*storagev1.CSIDriver)) {
	t := h.t
	d := &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: storagev1.CSIDriverSpec{AttachRequired: ptr.To(false), PodInfoOnMount: ptr.To(false)}}
	if mutate != nil {
		mutate(d)
	}
	if _, err := h.f.Client.StorageV1().CSIDrivers().Create(t.Context(), d, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating CSIDriver %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = h.f.Client.StorageV1().CSIDrivers().Delete(context.WithoutCancel(t.Context()), name, metav1.DeleteOptions{})
	})
}

// volumeOf creates a filesystem volume in p and a PV and claim bound to it.
func (h *hostile) volumeOf(t *testing.T, p *plugintest.Plugin, driver, pvName, claimName string) plugin.Volume {
	vol := createVolume(t, p, pvName, csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	createBoundClaim(t, h.f, claim{PVName: pvName, PVCName: claimName, Driver: driver, Handle: vol.ID})
	return vol
}

// podWith creates a pod with the given volumes mounted.
func (h *hostile) podWith(t *testing.T, name string, vols ...corev1.Volume) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: h.f.Namespace},
		// The ServiceAccount admission plugin, which sets the name, is off here.
		Spec: corev1.PodSpec{NodeName: h.f.NodeName, ServiceAccountName: "default",
			Containers: []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}}},
	}
	for _, v := range vols {
		pod.Spec.Volumes = append(pod.Spec.Volumes, v)
		pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: v.Name, MountPath: "/mnt/" + v.Name})
	}
	created, err := h.f.Client.CoreV1().Pods(h.f.Namespace).Create(t.Context(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod %s: %v", name, err)
	}
	return created
}

func claimVolume(name, claimName string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claimName}}}
}

func inlineVolume(name, driver string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: driver}}}
}

// deleteAndWaitTornDown deletes the pods and waits until the agent holds no
// volume of theirs.
func (h *hostile) deleteAndWaitTornDown(t *testing.T, pods ...*corev1.Pod) {
	for _, pod := range pods {
		deletePod(t, h.f, pod)
	}
	eventually(t, "the pods' volumes torn down", func() (bool, error) {
		for _, v := range h.a.VM.Volumes() {
			for _, p := range v.Pods {
				for _, pod := range pods {
					if p.Key.Pod == pod.UID {
						return false, fmt.Errorf("%s still held for pod %s", v.Name, pod.Name)
					}
				}
			}
		}
		return true, nil
	})
}

// maxLengths: a PV, a claim and a pod named with 253 characters, a pod
// volume and an inline volume named with 63: the names that reach a path
// (the PV's and the volumes') still fit one path component, and the volumes
// are published.
func (h *hostile) maxLengths(t *testing.T) {
	pvName := h.id() + strings.Repeat("p", 253-len(h.id())) // cluster-scoped: unique per run
	claimName := strings.Repeat("c", 253)
	h.volumeOf(t, h.p, h.driver, pvName, claimName)
	pod := h.podWith(t, strings.Repeat("a", 253),
		claimVolume(strings.Repeat("v", 63), claimName), inlineVolume(strings.Repeat("i", 63), h.driver))
	waitReady(t, h.f, pod)
	target := publishPaths(h.a, pod, pvName).Target
	inline := filepath.Join(h.a.Root, "pods", string(pod.UID), "volumes", "kubernetes.io~csi", strings.Repeat("i", 63), "mount")
	for _, p := range []string{target, inline} {
		if !isMounted(t, p) {
			t.Errorf("%s is not mounted", p)
		}
	}
	h.deleteAndWaitTornDown(t, pod)
}

// pathNames: every name that reaches a path with ".." or "/" is refused by
// the API server (PV, claim, pod volume, CSIDriver, namespace and node
// names, a PV's CSI driver); a volume handle is not, and is only ever used
// hashed: the driver is asked to stage it below the root, and the pod's
// condition says why it failed.
func (h *hostile) pathNames(t *testing.T) {
	ctx := t.Context()
	c := h.f.Client
	size := corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}
	pv := func(name, driver string) *corev1.PersistentVolume {
		return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PersistentVolumeSpec{
			Capacity: size, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: "h"}}}}
	}
	for _, bad := range []string{"..", "../x", "a/b", "a/../b", "/abs"} {
		refused := map[string]error{}
		_, refused["PV name"] = c.CoreV1().PersistentVolumes().Create(ctx, pv(bad, h.driver), metav1.CreateOptions{})
		_, refused["PV CSI driver"] = c.CoreV1().PersistentVolumes().Create(ctx, pv(h.name("pv-bad-"), bad), metav1.CreateOptions{})
		_, refused["PVC name"] = c.CoreV1().PersistentVolumeClaims(h.f.Namespace).Create(ctx, &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: bad}, Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, Resources: corev1.VolumeResourceRequirements{Requests: size}}}, metav1.CreateOptions{})
		_, refused["CSIDriver name"] = c.StorageV1().CSIDrivers().Create(ctx, &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: bad}}, metav1.CreateOptions{})
		_, refused["namespace"] = c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: bad}}, metav1.CreateOptions{})
		_, refused["node name"] = c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: bad}}, metav1.CreateOptions{})
		_, refused["pod volume name"] = c.CoreV1().Pods(h.f.Namespace).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: h.name("refused-")},
			Spec: corev1.PodSpec{NodeName: h.f.NodeName, Containers: []corev1.Container{{Name: "app", Image: "pause",
				VolumeMounts: []corev1.VolumeMount{{Name: bad, MountPath: "/x"}}}},
				Volumes: []corev1.Volume{inlineVolume(bad, h.driver)}}}, metav1.CreateOptions{})
		for what, err := range refused {
			if !apierrors.IsInvalid(err) && !apierrors.IsBadRequest(err) && !apierrors.IsNotFound(err) {
				t.Errorf("%s %q: the API server answered %v, want it refused", what, bad, err)
			}
		}
	}

	handles := []string{"../../../../../../../../../tmp/" + h.name("escape-"), "/" + h.name("absolute-") + "/..", strings.Repeat("../", 1<<20/3)}
	var pods []*corev1.Pod
	for _, handle := range handles {
		pvName, claimName := h.name("pv-handle-"), h.name("claim-handle-")
		createBoundClaim(t, h.f, claim{PVName: pvName, PVCName: claimName, Driver: h.driver, Handle: handle})
		pods = append(pods, h.podWith(t, h.name("handle-"), claimVolume("data", claimName)))
	}
	for i, pod := range pods {
		c := waitReason(t, h.f, pod, status.ReasonNodeStageFailed, "NodeStageVolume failed", "code = NotFound")
		if len(c.Message) > status.MaxMessageLength {
			t.Errorf("handle %d: condition message is %d bytes, over %d", i, len(c.Message), status.MaxMessageLength)
		}
		want := stagingPaths(h.a, h.driver, handles[i]).Path
		calls := volumeCalls(t, h.p, handles[i])
		if len(calls) == 0 || slices.ContainsFunc(calls, func(c plugin.Call) bool { return c.Begin.StagingPath != want }) {
			t.Errorf("handle %d: calls %q, want only NodeStageVolume at the hashed path %s", i, methods(calls), want)
		}
	}
	for _, p := range []string{filepath.Clean(handles[0]), strings.TrimSuffix(handles[1], "/..")} {
		if exists(p) {
			t.Errorf("%s exists", p)
		}
	}
	h.deleteAndWaitTornDown(t, pods...)
}

// upperCaseDriver: a PV's CSI driver may be upper case, a CSIDriver object's
// name may not, and CSI refuses it as a driver name: the pod says the driver
// is not registered, and no path is made for it.
func (h *hostile) upperCaseDriver(t *testing.T) {
	driver := "UPPER.e2e.csi-volmgr.io"
	pvName, claimName := h.name("pv-upper-"), h.name("claim-upper-")
	createBoundClaim(t, h.f, claim{PVName: pvName, PVCName: claimName, Driver: driver, Handle: "h"})
	pod := h.podWith(t, h.name("upper-"), claimVolume("data", claimName))
	waitReason(t, h.f, pod, status.ReasonDriverNotRegistered, driver)
	if p := filepath.Join(h.a.Root, "plugins", "kubernetes.io", "csi", driver); exists(p) {
		t.Errorf("%s was made for a driver that never registered", p)
	}
	h.deleteAndWaitTornDown(t, pod)
}

// pvSourceChanges: a PV's CSI source cannot be changed (the API server
// refuses); replacing the PV by one of the same name with another volume
// handle while a pod runs leaves the running pod its volume (no unpublish,
// no unstage, condition still True); a new pod of the claim gets the new
// volume.
func (h *hostile) pvSourceChanges(t *testing.T) {
	ctx := t.Context()
	pvName, claimName := h.name("pv-changes-"), h.name("claim-changes-")
	oldVol := h.volumeOf(t, h.p, h.driver, pvName, claimName)
	newVol := createVolume(t, h.p, h.name("vol-new-"), csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	running := h.podWith(t, h.name("running-"), claimVolume("data", claimName))
	waitReady(t, h.f, running)

	pv, err := h.f.Client.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv.Spec.CSI.VolumeHandle = newVol.ID
	if _, err := h.f.Client.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("changing a PV's CSI source: %v, want refused as immutable", err)
	}
	h.replacePV(t, pv, func(pv *corev1.PersistentVolume) { pv.Spec.CSI.VolumeHandle = newVol.ID })
	second := h.podWith(t, h.name("second-"), claimVolume("data", claimName))
	waitReady(t, h.f, second)
	h.keptFor(t, running, oldVol.ID)
	if got := okCalls(volumeCalls(t, h.p, newVol.ID), nodePublish); len(got) != 1 {
		t.Errorf("the new pod's volume was published %d times, want once at the new handle", len(got))
	}
	h.deleteAndWaitTornDown(t, running, second)
}

// replacePV deletes the PV and creates it again, changed by mutate, as an
// operator who "fixes" a PV under a running pod does.
func (h *hostile) replacePV(t *testing.T, pv *corev1.PersistentVolume, mutate func(*corev1.PersistentVolume)) {
	ctx := t.Context()
	if err := h.f.Client.CoreV1().PersistentVolumes().Delete(ctx, pv.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// No PV protection controller runs here to lift its finalizer.
	dropFinalizers(t, func() error {
		cur, err := h.f.Client.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Finalizers = nil
		_, err = h.f.Client.CoreV1().PersistentVolumes().Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	eventually(t, "PV "+pv.Name+" gone", func() (bool, error) {
		_, err := h.f.Client.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	again := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: pv.Name}, Spec: *pv.Spec.DeepCopy()}
	mutate(again)
	created, err := h.f.Client.CoreV1().PersistentVolumes().Create(ctx, again, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status.Phase = corev1.VolumeBound
	if _, err := h.f.Client.CoreV1().PersistentVolumes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// dropFinalizers runs update (which removes an object's finalizers) until
// it succeeds or the object is gone.
func dropFinalizers(t *testing.T, update func() error) {
	t.Helper()
	eventually(t, "finalizers removed", func() (bool, error) {
		err := update()
		if apierrors.IsNotFound(err) || err == nil {
			return true, nil
		}
		if apierrors.IsConflict(err) {
			return false, nil
		}
		return false, err
	})
}

// keptFor checks that the running pod still has handle's volume: mounted,
// condition True, never unpublished nor unstaged.
func (h *hostile) keptFor(t *testing.T, pod *corev1.Pod, handle string) {
	t.Helper()
	c, err := volumesReady(t, h.f, pod)
	if err != nil || c == nil || c.Status != corev1.ConditionTrue {
		t.Errorf("the running pod's condition is %+v (%v), want True", c, err)
	}
	// A new pod of the claim may be published the old volume for a moment,
	// while the agent's cache still has the old PV, and then unpublished:
	// only the running pod's target, and the volume's stage, count.
	podDir := filepath.Join(h.a.Root, "pods", string(pod.UID)) + "/"
	for _, call := range volumeCalls(t, h.p, handle) {
		if call.Begin.Method == nodeUnstage || (call.Begin.Method == nodeUnpublish && strings.HasPrefix(call.Begin.TargetPath, podDir)) {
			t.Errorf("%s of the running pod's volume %s", call.Begin.Method, handle)
		}
	}
	held := false
	for _, v := range h.a.VM.Volumes() {
		if v.Handle != handle {
			continue
		}
		for _, p := range v.Pods {
			held = held || (p.Key.Pod == pod.UID && p.State == volume.Published)
		}
	}
	if !held {
		t.Errorf("the agent does not hold %s published for the running pod %s", handle, pod.Name)
	}
	mps, err := mountsUnder(filepath.Join(h.a.Root, "pods", string(pod.UID)))
	if err != nil {
		t.Fatal(err)
	}
	mounted := len(mps) > 0
	if !mounted {
		t.Errorf("nothing is mounted for the running pod %s", pod.Name)
	}
}

// claimRebound: a bound claim's volumeName cannot be changed (the API
// server refuses); deleting the claim and creating it again bound to
// another PV leaves the running pod its volume; a new pod gets the other.
func (h *hostile) claimRebound(t *testing.T) {
	ctx := t.Context()
	pvName, claimName := h.name("pv-rebound-"), h.name("claim-rebound-")
	oldVol := h.volumeOf(t, h.p, h.driver, pvName, claimName)
	running := h.podWith(t, h.name("running-"), claimVolume("data", claimName))
	waitReady(t, h.f, running)

	pvc, err := h.f.Client.CoreV1().PersistentVolumeClaims(h.f.Namespace).Get(ctx, claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	otherPV := h.name("pv-other-")
	pvc.Spec.VolumeName = otherPV
	if _, err := h.f.Client.CoreV1().PersistentVolumeClaims(h.f.Namespace).Update(ctx, pvc, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("rebinding a bound claim: %v, want refused", err)
	}
	if err := h.f.Client.CoreV1().PersistentVolumeClaims(h.f.Namespace).Delete(ctx, claimName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// No PVC protection controller runs here to lift its finalizer.
	dropFinalizers(t, func() error {
		cur, err := h.f.Client.CoreV1().PersistentVolumeClaims(h.f.Namespace).Get(ctx, claimName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Finalizers = nil
		_, err = h.f.Client.CoreV1().PersistentVolumeClaims(h.f.Namespace).Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	eventually(t, "claim gone", func() (bool, error) {
		_, err := h.f.Client.CoreV1().PersistentVolumeClaims(h.f.Namespace).Get(ctx, claimName, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	newVol := createVolume(t, h.p, h.name("vol-other-"), csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	createBoundClaim(t, h.f, claim{PVName: otherPV, PVCName: claimName, Driver: h.driver, Handle: newVol.ID})
	second := h.podWith(t, h.name("second-"), claimVolume("data", claimName))
	waitReady(t, h.f, second)
	h.keptFor(t, running, oldVol.ID)
	h.deleteAndWaitTornDown(t, running, second)
}

// attachmentForAnotherNode: with an attach-required driver, neither a
// VolumeAttachment of the volume for another node nor one named as this
// node's but whose spec names another node attaches the volume here: the
// pod waits for attach, and the second says why.
func (h *hostile) attachmentForAnotherNode(t *testing.T) {
	ctx := t.Context()
	driver := uniqueDriverName()
	h.createCSIDriver(driver, func(d *storagev1.CSIDriver) { d.Spec.AttachRequired = ptr.To(true) })
	caps := plugin.Capabilities{StageUnstage: true, ControllerPublish: true}
	p := startPlugin(t, h.a, driver, caps)
	h.extra = append(h.extra, p)
	pvName, claimName := h.name("pv-att-"), h.name("claim-att-")
	vol := h.volumeOf(t, p, driver, pvName, claimName)
	pod := h.podWith(t, h.name("att-"), claimVolume("data", claimName))
	waitInUse(t, h.f, "lists the volume", func(got []corev1.UniqueVolumeName) bool { return slices.Contains(got, uniqueName(driver, vol.ID)) })

	attach := func(name, node string) {
		va, err := h.f.Client.StorageV1().VolumeAttachments().Create(ctx, &storagev1.VolumeAttachment{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: storagev1.VolumeAttachmentSpec{Attacher: driver, NodeName: node,
				Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = h.f.Client.StorageV1().VolumeAttachments().Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{})
		})
		va.Status = storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: map[string]string{plugin.PublishContextDevicePath: vol.Path}}
		if _, err := h.f.Client.StorageV1().VolumeAttachments().UpdateStatus(ctx, va, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	other := "other-" + h.f.NodeName
	attach(volume.AttachmentName(vol.ID, driver, other), other)
	waitReason(t, h.f, pod, status.ReasonWaitingForAttach, "does not exist")
	attach(volume.AttachmentName(vol.ID, driver, h.f.NodeName), other)
	waitReason(t, h.f, pod, status.ReasonWaitingForAttach, fmt.Sprintf("is for node %q", other))
	if calls := volumeCalls(t, p, vol.ID); len(calls) != 0 {
		t.Errorf("node calls for a volume attached to another node: %q", methods(calls))
	}
	h.deleteAndWaitTornDown(t, pod)
}

// oddCSIDrivers: CSIDriver objects with the values the API server admits
// although they make little sense (each replaces the last): each pod ends
// up published or with the reason that names the field.
func (h *hostile) oddCSIDrivers(t *testing.T) {
	ctx := t.Context()
	driver := uniqueDriverName()
	p := startPlugin(t, h.a, driver, nodeCaps())
	h.extra = append(h.extra, p)
	// The pods' service account, for the token requests.
	if _, err := h.f.Client.CoreV1().ServiceAccounts(h.f.Namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	modes := func(m ...storagev1.VolumeLifecycleMode) []storagev1.VolumeLifecycleMode { return m }
	for _, tc := range []struct {
		name   string
		spec   storagev1.CSIDriverSpec
		inline bool
		// reason and msg are the condition's; "" means the pod is published.
		reason string
		msg    []string
	}{{
		name: "empty volumeLifecycleModes (means Persistent)",
		spec: storagev1.CSIDriverSpec{VolumeLifecycleModes: modes()},
	}, {
		name:   "duplicate Ephemeral, no Persistent",
		spec:   storagev1.CSIDriverSpec{VolumeLifecycleModes: modes(storagev1.VolumeLifecycleEphemeral, storagev1.VolumeLifecycleEphemeral)},
		reason: status.ReasonInvalidVolumeSpec, msg: []string{"does not support Persistent volumes"},
	}, {
		name:   "attachRequired for an inline-only driver, inline volume",
		spec:   storagev1.CSIDriverSpec{AttachRequired: ptr.To(true), PodInfoOnMount: ptr.To(true), VolumeLifecycleModes: modes(storagev1.VolumeLifecycleEphemeral)},
		inline: true,
	}, {
		name: "a token for the API server's audiences, requiresRepublish, seLinuxMount, storageCapacity",
		spec: storagev1.CSIDriverSpec{TokenRequests: []storagev1.TokenRequest{{Audience: ""}}, RequiresRepublish: ptr.To(true),
			SELinuxMount: ptr.To(true), StorageCapacity: ptr.To(true)},
	}, {
		name: "a token audience with dot-dot, slash and a newline",
		spec: storagev1.CSIDriverSpec{TokenRequests: []storagev1.TokenRequest{{Audience: "../../x/\n"}}},
	}, {
		name: "a token audience of 64 KiB",
		spec: storagev1.CSIDriverSpec{TokenRequests: []storagev1.TokenRequest{{Audience: strings.Repeat("x", 64<<10)}}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			_ = h.f.Client.StorageV1().CSIDrivers().Delete(ctx, driver, metav1.DeleteOptions{})
			eventually(t, "CSIDriver gone", func() (bool, error) {
				_, err := h.f.Client.StorageV1().CSIDrivers().Get(ctx, driver, metav1.GetOptions{})
				return apierrors.IsNotFound(err), nil
			})
			h.createCSIDriver(driver, func(d *storagev1.CSIDriver) {
				d.Spec = tc.spec
				if d.Spec.AttachRequired == nil {
					d.Spec.AttachRequired = ptr.To(false) // the API's default is true
				}
			})
			var vol corev1.Volume
			if tc.inline {
				vol = inlineVolume("data", driver)
			} else {
				pvName, claimName := h.name("pv-odd-"), h.name("claim-odd-")
				h.volumeOf(t, p, driver, pvName, claimName)
				vol = claimVolume("data", claimName)
			}
			pod := h.podWith(t, h.name("odd-"), vol)
			if tc.reason == "" {
				waitReady(t, h.f, pod)
			} else {
				c := waitReason(t, h.f, pod, tc.reason, tc.msg...)
				if len(c.Message) > status.MaxMessageLength {
					t.Errorf("condition message is %d bytes, over %d", len(c.Message), status.MaxMessageLength)
				}
			}
			h.deleteAndWaitTornDown(t, pod)
		})
	}
}

// fakeRegistrar serves the plugin-registration API with a fixed GetInfo
// answer and records the agent's verdicts.
type fakeRegistrar struct {
	registerapi.UnimplementedRegistrationServer
	info     *registerapi.PluginInfo
	verdicts chan *registerapi.RegistrationStatus
}

func (r *fakeRegistrar) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return r.info, nil
}

func (r *fakeRegistrar) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	select {
	case r.verdicts <- st:
	default:
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// serveRegistrar serves a fake registrar at socket until the test ends.
func serveRegistrar(t *testing.T, socket string, info *registerapi.PluginInfo) *fakeRegistrar {
	t.Helper()
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	r := &fakeRegistrar{info: info, verdicts: make(chan *registerapi.RegistrationStatus, 16)}
	s := grpc.NewServer()
	registerapi.RegisterRegistrationServer(s, r)
	go func() { _ = s.Serve(l) }()
	t.Cleanup(func() { s.Stop(); _ = os.Remove(socket) })
	return r
}

// nodeEvent waits for a Warning Event DriverRegistrationFailed on the Node
// whose message contains every one of parts.
func (h *hostile) nodeEvent(t *testing.T, parts ...string) {
	t.Helper()
	eventually(t, fmt.Sprintf("a DriverRegistrationFailed Event on the Node with %q", parts), func() (bool, error) {
		evs, err := h.f.Client.CoreV1().Events(metav1.NamespaceAll).List(t.Context(), metav1.ListOptions{FieldSelector: fields.AndSelectors(
			fields.OneTermEqualSelector("involvedObject.kind", "Node"),
			fields.OneTermEqualSelector("involvedObject.name", h.f.NodeName),
			fields.OneTermEqualSelector("reason", status.EventDriverRegistrationFailed)).String()})
		if err != nil {
			return false, err
		}
		for _, ev := range evs.Items {
			if ev.Type == corev1.EventTypeWarning && containsAll(ev.Message, parts) {
				return true, nil
			}
		}
		return false, fmt.Errorf("%d such Events, none with the message", len(evs.Items))
	})
}

func containsAll(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// lyingRegistrar: a registration socket named after one driver that
// answers with another name. The name GetInfo gives is the driver's name
// (as in the kubelet): a liar claiming a driver that is registered and
// healthy through another socket is refused with a reason on the Node; one
// claiming a driver nobody registered registers that driver, through its
// socket, and nothing else.
func (h *hostile) lyingRegistrar(t *testing.T) {
	socket := filepath.Join(h.a.RegDir, "liar.e2e.csi-volmgr.io-reg.sock")
	r := serveRegistrar(t, socket, &registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: h.driver, Endpoint: h.p.Endpoint, SupportedVersions: []string{"1.0.0"}})
	verdict := <-r.verdicts
	if verdict.GetPluginRegistered() || !strings.Contains(verdict.GetError(), "already registered through") {
		t.Errorf("the liar claiming %s was told %+v, want refused as already registered", h.driver, verdict)
	}
	h.nodeEvent(t, h.driver, socket, "already registered through")
	if d, ok := h.a.VM.Drivers().Driver(h.driver); !ok || d.RegistrationSocket == socket {
		t.Errorf("driver %s is registered through %q, want the honest socket", h.driver, d.RegistrationSocket)
	}

	// A liar for a driver nobody registered: its plugin runs without a
	// registration socket of its own.
	name := uniqueDriverName()
	p, err := plugintest.Launch(t.Context(), plugintest.Options{Name: name, NodeID: "node-" + h.f.NodeName})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	other := filepath.Join(h.a.RegDir, "named-otherwise.e2e.csi-volmgr.io-reg.sock")
	r2 := serveRegistrar(t, other, &registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: name, Endpoint: p.Endpoint, SupportedVersions: []string{"1.0.0"}})
	if v := <-r2.verdicts; !v.GetPluginRegistered() {
		t.Errorf("a registrar for the unregistered driver %s was refused: %s", name, v.GetError())
	}
	if d, ok := h.a.VM.Drivers().Driver(name); !ok || d.RegistrationSocket != other {
		t.Errorf("driver %s: registered %v through %q, want through %s", name, ok, d.RegistrationSocket, other)
	}
	if _, ok := h.a.VM.Drivers().Driver("named-otherwise.e2e.csi-volmgr.io"); ok {
		t.Error("the socket's name was registered as a driver")
	}
}

// twoRegistrars: a second plugin process of a registered driver registering
// through a socket of its own at the same version is refused with a reason
// on the Node while the first is healthy; the first keeps serving.
func (h *hostile) twoRegistrars(t *testing.T) {
	second, err := plugintest.Launch(t.Context(), plugintest.Options{Name: h.driver, NodeID: "node-" + h.f.NodeName})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = second.Close() })
	socket := filepath.Join(h.a.RegDir, "second-registrar-reg.sock")
	r := serveRegistrar(t, socket, &registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: h.driver, Endpoint: second.Endpoint, SupportedVersions: []string{"1.0.0"}})
	if v := <-r.verdicts; v.GetPluginRegistered() {
		t.Error("the second registrar of a healthy driver was accepted")
	}
	h.nodeEvent(t, h.driver, socket, "already registered through", "equal to or higher than the offered 1.0.0")
	d, ok := h.a.VM.Drivers().Driver(h.driver)
	if !ok || d.Endpoint != h.p.Endpoint {
		t.Fatalf("driver %s is registered at %q, want the first plugin's %s", h.driver, d.Endpoint, h.p.Endpoint)
	}
	pvName, claimName := h.name("pv-two-"), h.name("claim-two-")
	h.volumeOf(t, h.p, h.driver, pvName, claimName)
	pod := h.podWith(t, h.name("two-"), claimVolume("data", claimName))
	waitReady(t, h.f, pod)
	h.deleteAndWaitTornDown(t, pod)
}

// isMounted says whether p is a mount point.
func isMounted(t *testing.T, p string) bool {
	t.Helper()
	mps, err := mountsUnder(filepath.Dir(p))
	if err != nil {
		t.Fatal(err)
	}
	return slices.Contains(mps, p)
}
