package e2e_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

// csiNodeCount returns the allocatable count of driver in the node's
// CSINode; -1 when it has none.
func csiNodeCount(t *testing.T, f *k8stest.Fixture, driver string) (int32, error) {
	n, err := f.Client.StorageV1().CSINodes().Get(t.Context(), f.NodeName, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	for _, d := range n.Spec.Drivers {
		if d.Name == driver {
			if d.Allocatable == nil || d.Allocatable.Count == nil {
				return -1, nil
			}
			return *d.Allocatable.Count, nil
		}
	}
	return 0, fmt.Errorf("CSINode has no entry for %s", driver)
}

func waitCSINodeCount(t *testing.T, f *k8stest.Fixture, driver string, want int32) {
	t.Helper()
	eventually(t, fmt.Sprintf("CSINode allocatable count %d", want), func() (bool, error) {
		got, err := csiNodeCount(t, f, driver)
		if err != nil {
			return false, err
		}
		return got == want, fmt.Errorf("count is %d", got)
	})
}

// TestAttachLimit: an attach that failed with ResourceExhausted (the
// VolumeAttachment's attachError.errorCode, KEP-4876) fails the pod's
// condition with VolumeAttachmentLimitExceeded and the attacher's message,
// and makes the agent ask the driver for its limit at once and write it to
// the CSINode; with nodeAllocatableUpdatePeriodSeconds the count follows
// the driver's limit periodically.
//
// Against an API server of 1.34 (make test-skew), which drops errorCode
// and nodeAllocatableUpdatePeriodSeconds and keeps CSINode counts
// immutable (MutableCSINodeAllocatableCount off by default), the agent
// acts as the kubelet of 1.34: the pod's condition is AttachFailed with
// the attacher's message, and the count written at registration stays.
func TestAttachLimit(t *testing.T) {
	t.Parallel()
	f := k8stest.New(t)
	f.CreateNode(t)
	mutable := k8stest.ServerVersion(t, f.Client).Features().MutableCSINodeAllocatableCount
	a := startAgent(t, f, agentOptions{})
	driver := uniqueDriverName()
	setCSIDriver := func(period *int64) {
		t.Helper()
		obj := &storagev1.CSIDriver{
			ObjectMeta: metav1.ObjectMeta{Name: driver},
			Spec:       storagev1.CSIDriverSpec{AttachRequired: ptr.To(true), NodeAllocatableUpdatePeriodSeconds: period},
		}
		cur, err := f.Client.StorageV1().CSIDrivers().Get(t.Context(), driver, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = f.Client.StorageV1().CSIDrivers().Create(t.Context(), obj, metav1.CreateOptions{})
		} else if err == nil {
			cur.Spec.NodeAllocatableUpdatePeriodSeconds = period
			_, err = f.Client.StorageV1().CSIDrivers().Update(t.Context(), cur, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	setCSIDriver(nil)
	t.Cleanup(func() {
		_ = f.Client.StorageV1().CSIDrivers().Delete(context.WithoutCancel(t.Context()), driver, metav1.DeleteOptions{})
	})
	caps := attachCaps()
	p := plugintest.Start(t, plugintest.Options{Name: driver, NodeID: "node-" + f.NodeName, Capabilities: &caps, RegistrationDir: a.RegDir, MaxVolumesPerNode: 2})
	waitCSINodeCount(t, f, driver, 2)

	vol := createVolume(t, p, "data", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	pvName := "pv-" + f.Namespace
	createBoundClaim(t, f, claim{PVName: pvName, PVCName: "data", Driver: driver, Handle: vol.ID})
	pod := createPod(t, f, "app", podVolume{Name: "data", ClaimName: "data"})
	va := createAttachment(t, f, driver, vol.ID, pvName)

	// The driver's limit grew meanwhile; nothing refreshes it periodically.
	if err := p.SetControl(plugin.FaultConfig{MaxVolumesPerNode: ptr.To[int64](5)}); err != nil {
		t.Fatal(err)
	}
	const attacherMessage = "rpc error: code = ResourceExhausted desc = node already has 2 volumes attached"
	setAttachmentStatus(t, f, va, storagev1.VolumeAttachmentStatus{AttachError: &storagev1.VolumeError{
		Time: metav1.Now(), Message: attacherMessage, ErrorCode: ptr.To(int32(codes.ResourceExhausted)),
	}})
	if !mutable {
		waitReason(t, f, pod, status.ReasonAttachFailed, "node already has 2 volumes attached")
		setCSIDriver(ptr.To[int64](1))
		if d, err := f.Client.StorageV1().CSIDrivers().Get(t.Context(), driver, metav1.GetOptions{}); err != nil || d.Spec.NodeAllocatableUpdatePeriodSeconds != nil {
			t.Errorf("CSIDriver %s: %v; want nodeAllocatableUpdatePeriodSeconds dropped by this API server", driver, err)
		}
		// Long enough for a periodic refresh and a limit refresh to have
		// been written, were they made.
		time.Sleep(3 * time.Second)
		if got, err := csiNodeCount(t, f, driver); err != nil || got != 2 {
			t.Errorf("CSINode allocatable count %d (%v), want the 2 written at registration", got, err)
		}
		setAttachmentStatus(t, f, va, storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: controllerPublish(t, p, vol.ID)})
		waitReady(t, f, pod)
		return
	}
	waitReason(t, f, pod, status.ReasonVolumeAttachmentLimitExceeded, "node already has 2 volumes attached")
	waitCSINodeCount(t, f, driver, 5)

	// With a period, a changed limit reaches the CSINode without any error.
	setCSIDriver(ptr.To[int64](10))
	if err := p.SetControl(plugin.FaultConfig{MaxVolumesPerNode: ptr.To[int64](7)}); err != nil {
		t.Fatal(err)
	}
	waitCSINodeCount(t, f, driver, 7)
	// The refresher writes the CSINode first and then the registry.
	eventually(t, "max volumes 7 in the registry, as `csi-volmgr drivers` shows it", func() (bool, error) {
		d, ok := a.VM.Drivers().Driver(driver)
		return ok && d.MaxVolumes == 7, fmt.Errorf("the registry's driver = %+v (registered %v)", d, ok)
	})

	// Once attached, the pod's volume is published.
	setAttachmentStatus(t, f, va, storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: controllerPublish(t, p, vol.ID)})
	waitReady(t, f, pod)
}
