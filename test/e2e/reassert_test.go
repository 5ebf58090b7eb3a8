package e2e_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

// TestOverwrittenStatusIsRestored: a runtime that replaces the pod's
// conditions, and a controller that rewrites the Node's volumesInUse,
// overwrite what the agent owns; the next event of the pod and of the Node
// makes the agent write it back, once: the objects are quiet afterwards.
func TestOverwrittenStatusIsRestored(t *testing.T) {
	t.Parallel()
	f := k8stest.New(t)
	f.CreateNode(t)
	a := startAgent(t, f, agentOptions{})
	driver := uniqueDriverName()
	createCSIDriver(t, f, driver, true)
	caps := attachCaps()
	p := plugintest.Start(t, plugintest.Options{Name: driver, NodeID: "node-" + f.NodeName, Capabilities: &caps, RegistrationDir: a.RegDir})
	vol := createVolume(t, p, "data", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	pvName := "pv-" + f.Namespace
	createBoundClaim(t, f, claim{PVName: pvName, PVCName: "data", Driver: driver, Handle: vol.ID})
	pod := createPod(t, f, "app", podVolume{Name: "data", ClaimName: "data"})
	want := uniqueName(driver, vol.ID)
	waitInUse(t, f, "holds the volume", func(got []corev1.UniqueVolumeName) bool { return slices.Contains(got, want) })
	va := createAttachment(t, f, driver, vol.ID, pvName)
	setAttachmentStatus(t, f, va, storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: controllerPublish(t, p, vol.ID)})
	waitReady(t, f, pod)

	// A runtime posts its own pod status, dropping the agent's condition.
	cur, err := f.Client.CoreV1().Pods(f.Namespace).Get(t.Context(), pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: metav1.Now()}}
	if _, err := f.Client.CoreV1().Pods(f.Namespace).UpdateStatus(t.Context(), cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitReady(t, f, pod)
	assertQuiet(t, "pod", func() (string, error) {
		p, err := f.Client.CoreV1().Pods(f.Namespace).Get(t.Context(), pod.Name, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		if c, _ := volumesReady(t, f, p); c == nil || c.Status != corev1.ConditionTrue {
			return "", fmt.Errorf("condition %s is %+v", status.ConditionVolumesReady, c)
		}
		return p.ResourceVersion, nil
	})

	// A controller rewrites the Node's status without the volume.
	node, err := f.Client.CoreV1().Nodes().Get(t.Context(), f.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.VolumesInUse = nil
	if _, err := f.Client.CoreV1().Nodes().UpdateStatus(t.Context(), node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitInUse(t, f, "holds the volume again", func(got []corev1.UniqueVolumeName) bool { return slices.Contains(got, want) })
	assertQuiet(t, "Node", func() (string, error) {
		n, err := f.Client.CoreV1().Nodes().Get(t.Context(), f.NodeName, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		return n.ResourceVersion, nil
	})
}

// assertQuiet checks that an object's resourceVersion stays the same for a
// while: nothing keeps writing it.
func assertQuiet(t *testing.T, what string, version func() (string, error)) {
	t.Helper()
	before, err := version()
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	after, err := version()
	if err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("the %s kept being written after the restore (resourceVersion %s → %s)", what, before, after)
	}
}
