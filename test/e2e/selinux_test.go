package e2e_test

import (
	"context"
	"slices"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/selinux"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
)

// createSELinuxCSIDriver creates a CSIDriver with seLinuxMount: true and
// no attach.
func createSELinuxCSIDriver(t *testing.T, f *k8stest.Fixture, driver string) {
	t.Helper()
	obj := &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: driver},
		Spec:       storagev1.CSIDriverSpec{AttachRequired: ptr.To(false), PodInfoOnMount: ptr.To(false), SELinuxMount: ptr.To(true)},
	}
	if _, err := f.Client.StorageV1().CSIDrivers().Create(t.Context(), obj, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating CSIDriver %s: %v", driver, err)
	}
	t.Cleanup(func() {
		err := f.Client.StorageV1().CSIDrivers().Delete(context.WithoutCancel(t.Context()), driver, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting CSIDriver %s: %v", driver, err)
		}
	})
}

// createLabeledPod creates a pod whose containers run with SELinux level
// level, mounting the claim.
func createLabeledPod(t *testing.T, f *k8stest.Fixture, name, claimName, level string) *corev1.Pod {
	t.Helper()
	return createClaimPod(t, f, name, claimName, &corev1.PodSecurityContext{SELinuxOptions: &corev1.SELinuxOptions{Level: level}})
}

// TestSELinuxMountContext stands for an SELinux host (the test machine
// need not run SELinux: selinux.Defaults computes the labels as the
// container policy would): a driver with seLinuxMount gets the pod's label
// as context="..." among the mount flags of NodeStageVolume and
// NodePublishVolume, for a ReadWriteOncePod volume and, as the kubelet's
// SELinuxMount does, for a shared one while its pods agree; a pod with
// another label on the shared volume is refused with the kubelet's
// conflict error, and the pods that agree are not held back.
//
// Against an API server before 1.37 (make test-skew) the agent acts as
// the kubelet of that minor (SELinuxMount off by default): the
// ReadWriteOncePod volume still gets the context, the shared one is
// mounted without one, and a pod with another label on it is not refused.
func TestSELinuxMountContext(t *testing.T) {
	t.Parallel()
	f := k8stest.New(t)
	f.CreateNode(t)
	allModes := k8stest.ServerVersion(t, f.Client).Features().SELinuxMountAllAccessModes
	a := startAgent(t, f, agentOptions{SELinux: selinux.Defaults{}})
	driver := uniqueDriverName()
	createSELinuxCSIDriver(t, f, driver)
	p := startPlugin(t, a, driver, plugin.Capabilities{StageUnstage: true, SingleNodeMultiWriter: true})
	const (
		level1 = "s0:c1,c2"
		level2 = "s0:c3,c4"
	)
	wantFlag := `context="system_u:object_r:container_file_t:` + level1 + `"`

	rwop := createVolume(t, p, "rwop", csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER)
	createBoundClaim(t, f, claim{PVName: "pv-rwop-" + f.Namespace, PVCName: "rwop", Driver: driver, Handle: rwop.ID,
		AccessMode: corev1.ReadWriteOncePod})
	shared := createVolume(t, p, "shared", csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
	createBoundClaim(t, f, claim{PVName: "pv-shared-" + f.Namespace, PVCName: "shared", Driver: driver, Handle: shared.ID,
		AccessMode: corev1.ReadWriteMany})

	single := createLabeledPod(t, f, "single", "rwop", level1)
	first := createLabeledPod(t, f, "first", "shared", level1)
	waitReady(t, f, single)
	waitReady(t, f, first)
	for vol, want := range map[string]bool{rwop.ID: true, shared.ID: allModes} {
		for _, c := range okCalls(volumeCalls(t, p, vol), nodeStage) {
			if slices.Contains(c.Begin.MountFlags, wantFlag) != want {
				t.Errorf("NodeStageVolume of %s had mount flags %q, want %s among them: %v", vol, c.Begin.MountFlags, wantFlag, want)
			}
		}
		pubs := okCalls(volumeCalls(t, p, vol), nodePublish)
		if len(pubs) != 1 || slices.Contains(pubs[0].Begin.MountFlags, wantFlag) != want {
			t.Errorf("NodePublishVolume of %s: %+v, want one, with %s among its flags: %v", vol, pubs, wantFlag, want)
		}
	}

	// Another label on the shared volume: refused; the same label: fine.
	// Before 1.37 the shared volume has no context: nothing to conflict.
	other := createLabeledPod(t, f, "other", "shared", level2)
	same := createLabeledPod(t, f, "same", "shared", level1)
	wantPublishes := 3
	if allModes {
		waitReason(t, f, other, status.ReasonInvalidVolumeSpec, "conflicting SELinux labels of volume", level1, level2)
		wantPublishes = 2
	} else {
		waitReady(t, f, other)
	}
	waitReady(t, f, same)
	if n := len(okCalls(volumeCalls(t, p, shared.ID), nodePublish)); n != wantPublishes {
		t.Errorf("NodePublishVolume of the shared volume succeeded %d times, want %d", n, wantPublishes)
	}

	for _, pod := range []*corev1.Pod{single, first, other, same} {
		deletePod(t, f, pod)
	}
	waitCalls(t, p, shared.ID, "unstage", hasOK(nodeUnstage, 1))
	waitCalls(t, p, rwop.ID, "unstage", hasOK(nodeUnstage, 1))
}
