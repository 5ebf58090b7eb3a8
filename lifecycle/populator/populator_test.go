package populator_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/source"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// useSummary is what a test checks of a dsw.Use.
type useSummary struct {
	Spec     string
	Name     volume.Name
	PV       string
	Access   volume.AccessType
	ReadOnly bool
	Inline   bool
}

func summarize(uses []dsw.Use) []useSummary {
	var out []useSummary
	for _, u := range uses {
		out = append(out, useSummary{Spec: u.Volume.SpecName, Name: u.Name, PV: u.Source.PVName,
			Access: u.Source.AccessType, ReadOnly: u.Volume.ReadOnly, Inline: u.Source.Inline})
	}
	return out
}

func pvName(handle string) volume.Name { return volume.PersistentName(driver, handle) }

func fsUse(spec, handle, pv string) useSummary {
	return useSummary{Spec: spec, Name: pvName(handle), PV: pv, Access: volume.Filesystem}
}

// TestResolve: pods, claims and volumes in → desired volumes and per-pod
// reasons out.
func TestResolve(t *testing.T) {
	block := ptr.To(corev1.PersistentVolumeBlock)
	fs := ptr.To(corev1.PersistentVolumeFilesystem)
	deleting := func(c *corev1.PersistentVolumeClaim) { c.DeletionTimestamp = &metav1.Time{} }
	protected := func(c *corev1.PersistentVolumeClaim) {
		c.DeletionTimestamp = &metav1.Time{}
		c.Finalizers = []string{"kubernetes.io/pvc-protection"}
	}
	ephemeralVol := func(name string) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{}}}
	}
	inlineVol := func(name, drv string) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
			Driver: drv, ReadOnly: ptr.To(true), VolumeAttributes: map[string]string{"size": "1Gi"},
			NodePublishSecretRef: &corev1.LocalObjectReference{Name: "creds"}}}}
	}
	ownedBy := func(p *corev1.Pod) func(*corev1.PersistentVolumeClaim) {
		return func(c *corev1.PersistentVolumeClaim) {
			c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: p.Name, UID: p.UID, Controller: ptr.To(true)}}
		}
	}
	ephPod := newPod("eph", withVolume(ephemeralVol("scratch")), mount("scratch"))

	for name, tc := range map[string]struct {
		objs     []runtime.Object
		wantUses []useSummary
		wantErrs []string
		// wantAttach lists the VolumeAttachment references of pod "p".
		wantAttach []string
	}{
		"bound CSI PV": {
			objs:       []runtime.Object{newPod("p", withClaim("data", "c1")), newPVC("c1", "pv1"), newPV("pv1", "c1", "h1")},
			wantUses:   []useSummary{fsUse("data", "h1", "pv1")},
			wantAttach: []string{volume.AttachmentName("h1", driver, node)},
		},
		"volume not used by any container": {
			objs: []runtime.Object{newPod("p", withVolume(corev1.Volume{Name: "unused", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "c1"}}})), newPVC("c1", "pv1"), newPV("pv1", "c1", "h1")},
		},
		"claim not found": {
			objs:     []runtime.Object{newPod("p", withClaim("data", "missing"))},
			wantErrs: []string{`data: PVC "ns/missing" not found`},
		},
		"claim not bound": {
			objs:     []runtime.Object{newPod("p", withClaim("data", "c1")), newPVC("c1", "")},
			wantErrs: []string{`data: PVC "ns/c1" is not bound`},
		},
		"claim bound without volumeName": {
			objs: []runtime.Object{newPod("p", withClaim("data", "c1")),
				newPVC("c1", "", func(c *corev1.PersistentVolumeClaim) { c.Status.Phase = corev1.ClaimBound })},
			wantErrs: []string{`data: PVC "ns/c1" is bound but names no PV (empty spec.volumeName)`},
		},
		"claim being deleted": {
			objs:     []runtime.Object{newPod("p", withClaim("data", "c1")), newPVC("c1", "pv1", deleting), newPV("pv1", "c1", "h1")},
			wantErrs: []string{`data: PVC "ns/c1" is being deleted`},
		},
		"claim being deleted but protected": {
			objs:       []runtime.Object{newPod("p", withClaim("data", "c1")), newPVC("c1", "pv1", protected), newPV("pv1", "c1", "h1")},
			wantUses:   []useSummary{fsUse("data", "h1", "pv1")},
			wantAttach: []string{volume.AttachmentName("h1", driver, node)},
		},
		"PV missing": {
			objs:     []runtime.Object{newPod("p", withClaim("data", "c1")), newPVC("c1", "pv1")},
			wantErrs: []string{`data: PV "pv1" of PVC "ns/c1" not found`},
		},
		"PV bound to another claim": {
			objs: []runtime.Object{newPod("p", withClaim("data", "c1")), newPVC("c1", "pv1"),
				newPV("pv1", "c1", "h1", func(pv *corev1.PersistentVolume) { pv.Spec.ClaimRef.UID = "someone-else" })},
			wantErrs: []string{`data: PV "pv1" is bound to another claim (claimRef UID "someone-else", PVC "ns/c1" has UID "uid-c1")`},
		},
		"PV without claimRef": {
			objs: []runtime.Object{newPod("p", withClaim("data", "c1")), newPVC("c1", "pv1"),
				newPV("pv1", "c1", "h1", func(pv *corev1.PersistentVolume) { pv.Spec.ClaimRef = nil })},
			wantErrs: []string{`data: PV "pv1" is not bound to PVC "ns/c1" (no claimRef)`},
		},
		"PV not CSI": {
			objs: []runtime.Object{newPod("p", withClaim("data", "c1")), newPVC("c1", "pv1"),
				newPV("pv1", "c1", "h1", func(pv *corev1.PersistentVolume) {
					pv.Spec.PersistentVolumeSource = corev1.PersistentVolumeSource{NFS: &corev1.NFSVolumeSource{Server: "s", Path: "/"}}
				})},
			wantErrs: []string{`data: PV "pv1" is not a CSI volume`},
		},
		"block PV in volumeMounts": {
			objs: []runtime.Object{newPod("p", withClaim("data", "c1")), newPVC("c1", "pv1"),
				newPV("pv1", "c1", "h1", func(pv *corev1.PersistentVolume) { pv.Spec.VolumeMode = block })},
			wantErrs: []string{`data: PV "pv1" has volumeMode Block, but is used in volumeMounts`},
		},
		"block PV in volumeDevices": {
			objs: []runtime.Object{
				newPod("p", withVolume(corev1.Volume{Name: "raw", VolumeSource: corev1.VolumeSource{
					PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "c1", ReadOnly: true}}}), device("raw")),
				newPVC("c1", "pv1"),
				newPV("pv1", "c1", "h1", func(pv *corev1.PersistentVolume) { pv.Spec.VolumeMode = block })},
			wantUses:   []useSummary{{Spec: "raw", Name: pvName("h1"), PV: "pv1", Access: volume.Block, ReadOnly: true}},
			wantAttach: []string{volume.AttachmentName("h1", driver, node)},
		},
		"filesystem PV in volumeDevices": {
			objs: []runtime.Object{
				newPod("p", withVolume(corev1.Volume{Name: "raw", VolumeSource: corev1.VolumeSource{
					PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "c1"}}}), device("raw")),
				newPVC("c1", "pv1"),
				newPV("pv1", "c1", "h1", func(pv *corev1.PersistentVolume) { pv.Spec.VolumeMode = fs })},
			wantErrs: []string{`raw: PV "pv1" has volumeMode Filesystem, but is used in volumeDevices`},
		},
		"driver without attach": {
			objs: []runtime.Object{newPod("p", withClaim("data", "c1")), newPVC("c1", "pv1"), newPV("pv1", "c1", "h1"),
				csiDriver(driver, false, storagev1.VolumeLifecyclePersistent)},
			wantUses: []useSummary{fsUse("data", "h1", "pv1")},
		},
		"driver without Persistent mode": {
			objs: []runtime.Object{newPod("p", withClaim("data", "c1")), newPVC("c1", "pv1"), newPV("pv1", "c1", "h1"),
				csiDriver(driver, false, storagev1.VolumeLifecycleEphemeral)},
			wantErrs: []string{`data: CSI driver "csi.example.com" does not support Persistent volumes (PV "pv1")`},
		},
		"generic ephemeral volume owned by the pod": {
			objs: []runtime.Object{
				newPod("p", withVolume(ephemeralVol("scratch")), mount("scratch")),
				newPVC("p-scratch", "pv1", ownedBy(newPod("p"))), newPV("pv1", "p-scratch", "h1")},
			wantUses:   []useSummary{fsUse("scratch", "h1", "pv1")},
			wantAttach: []string{volume.AttachmentName("h1", driver, node)},
		},
		"generic ephemeral volume of someone else": {
			objs: []runtime.Object{
				newPod("p", withVolume(ephemeralVol("scratch")), mount("scratch")),
				newPVC("p-scratch", "pv1", ownedBy(ephPod)), newPV("pv1", "p-scratch", "h1")},
			wantErrs: []string{`scratch: PVC "ns/p-scratch" was not created for pod ns/p (pod is not owner)`},
		},
		"CSI inline volume": {
			objs: []runtime.Object{newPod("p", withVolume(inlineVol("cache", driver)), mount("cache")),
				csiDriver(driver, true, storagev1.VolumeLifecycleEphemeral)},
			wantUses: []useSummary{{Spec: "cache", Name: volume.InlineName("uid-p", "cache"), Access: volume.Filesystem,
				ReadOnly: true, Inline: true}},
		},
		"CSI inline volume of a driver without Ephemeral mode": {
			objs:     []runtime.Object{newPod("p", withVolume(inlineVol("cache", driver)), mount("cache"))},
			wantErrs: []string{`cache: CSI driver "csi.example.com" does not support inline (Ephemeral) volumes`},
		},
		"one bad volume, one good, non-CSI ignored": {
			objs: []runtime.Object{
				newPod("p", withClaim("data", "c1"), withClaim("bad", "missing"),
					withVolume(corev1.Volume{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}), mount("tmp")),
				newPVC("c1", "pv1"), newPV("pv1", "c1", "h1")},
			wantUses:   []useSummary{fsUse("data", "h1", "pv1")},
			wantErrs:   []string{`bad: PVC "ns/missing" not found`},
			wantAttach: []string{volume.AttachmentName("h1", driver, node)},
		},
		"init and ephemeral containers count": {
			objs: []runtime.Object{
				newPod("p",
					withVolume(corev1.Volume{Name: "a", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "c1"}}}),
					withVolume(corev1.Volume{Name: "b", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "c2"}}}),
					func(p *corev1.Pod) {
						p.Spec.InitContainers = []corev1.Container{{Name: "i", VolumeMounts: []corev1.VolumeMount{{Name: "a"}}}}
						p.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{
							Name: "e", VolumeMounts: []corev1.VolumeMount{{Name: "b"}}}}}
					}),
				newPVC("c1", "pv1"), newPV("pv1", "c1", "h1"), newPVC("c2", "pv2"), newPV("pv2", "c2", "h2"),
				csiDriver(driver, false, storagev1.VolumeLifecyclePersistent)},
			wantUses: []useSummary{fsUse("a", "h1", "pv1"), fsUse("b", "h2", "pv2")},
		},
		"two volumes of one claim": {
			objs: []runtime.Object{newPod("p", withClaim("a", "c1"), withClaim("b", "c1")), newPVC("c1", "pv1"), newPV("pv1", "c1", "h1"),
				csiDriver(driver, false, storagev1.VolumeLifecyclePersistent)},
			wantUses: []useSummary{fsUse("a", "h1", "pv1")},
		},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := testContext(t)
			s := startStack(ctx, t, fakeClient(tc.objs...), stackOptions{})
			got, ok := s.store.Pod("uid-p")
			if !ok {
				t.Fatal("pod p is not known to the desired state")
			}
			if diff := cmp.Diff(tc.wantUses, summarize(got.Uses)); diff != "" {
				t.Errorf("uses (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantErrs, errorsOf(got)); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
			var attach []string
			for _, a := range s.src.References("uid-p").Attachments {
				attach = append(attach, a.Name)
			}
			if diff := cmp.Diff(tc.wantAttach, attach); diff != "" {
				t.Errorf("VolumeAttachment references (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSourceFields checks every field a bound CSI PV carries into the
// desired state, and the pod-level fields. The deprecated
// volume.beta.kubernetes.io/mount-options annotation is not among them: the
// kubelet's CSI path sends spec.mountOptions only (csi_attacher.go
// MountDevice, csi_mounter.go SetUpAt); MountOptionFromSpec, which adds the
// annotation, serves the in-tree plugins.
func TestSourceFields(t *testing.T) {
	ctx := testContext(t)
	pod := newPod("p", withClaim("data", "c1"), func(p *corev1.Pod) {
		p.Spec.SecurityContext = &corev1.PodSecurityContext{FSGroup: ptr.To[int64](2000),
			FSGroupChangePolicy: ptr.To(corev1.FSGroupChangeOnRootMismatch)}
	})
	pv := newPV("pv1", "c1", "h1", func(pv *corev1.PersistentVolume) {
		pv.Annotations = map[string]string{"volume.beta.kubernetes.io/mount-options": "noatime, nodiratime"}
		pv.Spec.MountOptions = []string{"discard"}
		pv.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
		pv.Spec.CSI.NodeStageSecretRef = &corev1.SecretReference{Namespace: "sec", Name: "stage"}
		pv.Spec.CSI.NodePublishSecretRef = &corev1.SecretReference{Namespace: "sec", Name: "publish"}
		pv.Spec.CSI.NodeExpandSecretRef = &corev1.SecretReference{Namespace: "sec", Name: "expand"}
	})
	s := startStack(ctx, t, fakeClient(pod, newPVC("c1", "pv1"), pv), stackOptions{})

	u, ok := s.store.PodVolume(volume.PodKey{Volume: pvName("h1"), Pod: "uid-p"})
	if !ok {
		t.Fatal("use of h1 by p is not desired")
	}
	want := volume.Source{
		ID:            volume.ID{Driver: driver, Handle: "h1", PVName: "pv1", AccessType: volume.Filesystem},
		AccessModes:   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
		FSType:        "ext4",
		MountOptions:  []string{"discard"},
		Attributes:    map[string]string{"pool": "fast"},
		StageSecret:   &volume.SecretRef{Namespace: "sec", Name: "stage"},
		PublishSecret: &volume.SecretRef{Namespace: "sec", Name: "publish"},
		ExpandSecret:  &volume.SecretRef{Namespace: "sec", Name: "expand"},
		CapacityBytes: 1 << 30,
	}
	if diff := cmp.Diff(want, u.Source); diff != "" {
		t.Errorf("Source (-want +got):\n%s", diff)
	}
	wantPV := volume.PodVolume{
		Pod:      volume.PodInfo{UID: "uid-p", Namespace: ns, Name: "p", ServiceAccount: "sa"},
		SpecName: "data", FSGroup: ptr.To[int64](2000), FSGroupChangePolicy: ptr.To(corev1.FSGroupChangeOnRootMismatch),
	}
	if diff := cmp.Diff(wantPV, u.Volume); diff != "" {
		t.Errorf("PodVolume (-want +got):\n%s", diff)
	}
	if src, _ := s.store.Volume(pvName("h1")); !src.Equal(want) {
		t.Errorf("volume-level Source = %+v, want %+v", src, want)
	}
	refs := s.src.References("uid-p")
	wantRefs := source.References{
		PVCs:        []cache.ObjectName{{Namespace: ns, Name: "c1"}},
		PVs:         []string{"pv1"},
		Attachments: []source.Attachment{{Name: volume.AttachmentName("h1", driver, node), Volume: pvName("h1")}},
	}
	if diff := cmp.Diff(wantRefs, refs); diff != "" {
		t.Errorf("References (-want +got):\n%s", diff)
	}
}

// TestInlineFields checks what a CSI inline volume carries.
func TestInlineFields(t *testing.T) {
	ctx := testContext(t)
	pod := newPod("p", withVolume(corev1.Volume{Name: "cache", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
		Driver: driver, FSType: ptr.To("xfs"), VolumeAttributes: map[string]string{"size": "1Gi"},
		NodePublishSecretRef: &corev1.LocalObjectReference{Name: "creds"}}}}), mount("cache"))
	s := startStack(ctx, t, fakeClient(pod, csiDriver(driver, true, storagev1.VolumeLifecycleEphemeral)), stackOptions{})

	u, ok := s.store.PodVolume(volume.PodKey{Volume: volume.InlineName("uid-p", "cache"), Pod: "uid-p"})
	if !ok {
		t.Fatal("inline volume is not desired")
	}
	want := volume.Source{
		ID: volume.ID{Driver: driver, Handle: volume.InlineHandle("uid-p", "cache"), AccessType: volume.Filesystem}, Inline: true,
		AccessModes:   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		FSType:        "xfs",
		Attributes:    map[string]string{"size": "1Gi"},
		PublishSecret: &volume.SecretRef{Namespace: ns, Name: "creds"},
	}
	if diff := cmp.Diff(want, u.Source); diff != "" {
		t.Errorf("Source (-want +got):\n%s", diff)
	}
	// Inline volumes are never attached: no VolumeAttachment is watched.
	if refs := s.src.References("uid-p"); len(refs.Attachments)+len(refs.PVCs)+len(refs.PVs) != 0 {
		t.Errorf("References of an inline-only pod = %+v, want none", refs)
	}
}

// TestPodsThatLeave: terminal pods and (with the option) pods marked for
// deletion are not in the desired state; running ones are, with or without
// volumes.
func TestPodsThatLeave(t *testing.T) {
	objs := func() []runtime.Object {
		return []runtime.Object{
			newPod("running", withClaim("data", "c1")),
			newPod("novolumes"),
			newPod("succeeded", withClaim("data", "c1"), func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }),
			newPod("failed", withClaim("data", "c1"), func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }),
			newPod("deleting", withClaim("data", "c1"), func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{} }),
			newPod("elsewhere", withClaim("data", "c1"), func(p *corev1.Pod) { p.Spec.NodeName = "node-b" }),
			newPVC("c1", "pv1"), newPV("pv1", "c1", "h1"),
		}
	}
	for name, tc := range map[string]struct {
		removeTerminating bool
		want              []types.UID
	}{
		"with a kubelet":    {want: []types.UID{"uid-deleting", "uid-novolumes", "uid-running"}},
		"without a kubelet": {removeTerminating: true, want: []types.UID{"uid-novolumes", "uid-running"}},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := testContext(t)
			s := startStack(ctx, t, fakeClient(objs()...), stackOptions{removeTerminating: tc.removeTerminating})
			if diff := cmp.Diff(tc.want, s.store.Pods()); diff != "" {
				t.Errorf("known pods (-want +got):\n%s", diff)
			}
			wantUsers := len(tc.want) - 1 // all but novolumes
			if got := len(s.store.VolumePods(pvName("h1"))); got != wantUsers {
				t.Errorf("pods using h1 = %d, want %d", got, wantUsers)
			}
			if refs := s.src.References("uid-succeeded"); len(refs.PVCs) != 0 {
				t.Errorf("a terminal pod holds references %+v", refs)
			}
		})
	}
}

// TestPodMarkedForDeletionGetsNoNewVolumes: as the kubelet, a pod marked
// for deletion gets no volume it does not have yet (its containers are
// terminating), while a pod that has volumes keeps them until it is deleted
// or terminal. Pods known when the sources synced are resolved once
// whatever their state (the "with a kubelet" case of TestPodsThatLeave).
func TestPodMarkedForDeletionGetsNoNewVolumes(t *testing.T) {
	ctx := testContext(t)
	client := fakeClient(newPod("kept", withClaim("data", "c1")), newPVC("c1", "pv1"), newPV("pv1", "c1", "h1"))
	s := startStack(ctx, t, client, stackOptions{workers: 1})
	if got := s.store.VolumePods(pvName("h1")); len(got) != 1 {
		t.Fatalf("pods using h1 at start = %v, want kept", got)
	}

	deleting := newPod("deleting", withClaim("data", "c1"), func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: time.Now()} })
	if _, err := client.CoreV1().Pods(ns).Create(ctx, deleting, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kept, err := client.CoreV1().Pods(ns).Get(ctx, "kept", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kept.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	kept.ResourceVersion = "2"
	if _, err := client.CoreV1().Pods(ns).Update(ctx, kept, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// With one worker, pods are resolved in the order of their events: once
	// the marker is desired, the two pods before it have been handled.
	if _, err := client.CoreV1().Pods(ns).Create(ctx, newPod("marker", withClaim("data", "c1")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, "marker pod desired", func() bool {
		_, ok := s.store.PodVolume(volume.PodKey{Volume: pvName("h1"), Pod: "uid-marker"})
		return ok
	})
	if _, ok := s.store.Pod("uid-deleting"); ok {
		t.Error("a pod first seen while marked for deletion is in the desired state; the kubelet adds no volume to it")
	}
	if _, ok := s.store.PodVolume(volume.PodKey{Volume: pvName("h1"), Pod: "uid-kept"}); !ok {
		t.Error("a pod marked for deletion lost the volume it had; it keeps it until it is deleted or terminal")
	}
}

// TestTerminalPodsAreToldApart: with a runtime, a pod that leaves the
// desired state because the API server shows it terminal is reported
// (its containers are done), one that is gone from the API server is not:
// only its runtime may say its containers stopped.
func TestTerminalPodsAreToldApart(t *testing.T) {
	ctx := testContext(t)
	var mu sync.Mutex
	var terminal []types.UID
	client := fakeClient(
		newPod("running", withClaim("data", "c1")),
		newPod("succeeded", withClaim("data", "c1"), func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }),
		newPod("failed", withClaim("data", "c1"), func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }),
		newPVC("c1", "pv1"), newPV("pv1", "c1", "h1"),
	)
	s := startStack(ctx, t, client, stackOptions{waitForContainersStopped: true, terminal: func(uid types.UID) {
		mu.Lock()
		defer mu.Unlock()
		terminal = append(terminal, uid)
	}})
	if err := client.CoreV1().Pods(ns).Delete(ctx, "running", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, "the deleted pod left", func() bool { _, ok := s.store.Pod("uid-running"); return !ok })
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(terminal)
	if want := []types.UID{"uid-failed", "uid-succeeded"}; !slices.Equal(terminal, want) {
		t.Errorf("Terminal told of %v, want %v", terminal, want)
	}
}
