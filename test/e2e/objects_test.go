package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/paths"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

// uniqueDriverName returns a driver name no other test uses; CSIDriver
// objects are cluster-scoped and the API server is shared. It is short, so
// that <root>/plugins_registry/<name>-reg.sock fits a unix socket address.
func uniqueDriverName() string {
	return "d" + utilrand.String(6) + ".e2e.csi-volmgr.io"
}

// createCSIDriver creates the CSIDriver object of driver with the given
// attachRequired, and deletes it when the test ends.
func createCSIDriver(t *testing.T, f *k8stest.Fixture, driver string, attachRequired bool) {
	t.Helper()
	obj := &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: driver},
		Spec: storagev1.CSIDriverSpec{
			AttachRequired: ptr.To(attachRequired),
			PodInfoOnMount: ptr.To(false),
		},
	}
	if _, err := f.Client.StorageV1().CSIDrivers().Create(t.Context(), obj, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating CSIDriver %s: %v", driver, err)
	}
	t.Cleanup(func() {
		ctx := context.WithoutCancel(t.Context())
		if err := f.Client.StorageV1().CSIDrivers().Delete(ctx, driver, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting CSIDriver %s: %v", driver, err)
		}
	})
}

// startPlugin starts the test plugin as driver, registering through the
// agent's registration directory.
func startPlugin(t *testing.T, a *agent, driver string, caps plugin.Capabilities) *plugintest.Plugin {
	t.Helper()
	return plugintest.Start(t, plugintest.Options{Name: driver, NodeID: "node-" + a.f.NodeName, Capabilities: &caps, RegistrationDir: a.RegDir})
}

// nodeCaps are the capabilities of a node plugin with staging and without
// controller publish (its CSIDriver says attachRequired=false).
func nodeCaps() plugin.Capabilities {
	return plugin.Capabilities{StageUnstage: true}
}

// createVolume creates a filesystem volume in the plugin (as an external
// provisioner would) and returns the plugin's record of it.
func createVolume(t *testing.T, p *plugintest.Plugin, name string, mode csi.VolumeCapability_AccessMode_Mode) plugin.Volume {
	t.Helper()
	conn, err := p.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := csi.NewControllerClient(conn).CreateVolume(t.Context(), &csi.CreateVolumeRequest{
		Name: name,
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
		}},
	})
	if err != nil {
		t.Fatalf("CreateVolume %s: %v", name, err)
	}
	vols, err := p.Volumes()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vols {
		if v.ID == resp.GetVolume().GetVolumeId() {
			return v
		}
	}
	t.Fatalf("volume %s not in the plugin's state", resp.GetVolume().GetVolumeId())
	return plugin.Volume{}
}

// claim describes a PV and a PVC bound to it.
type claim struct {
	PVName, PVCName string
	Driver, Handle  string
	AccessMode      corev1.PersistentVolumeAccessMode
	// Attributes are the PV's volumeAttributes.
	Attributes map[string]string
	// PVSource, when set, replaces the CSI source (a PV of another type).
	PVSource *corev1.PersistentVolumeSource
	// NoPV binds the PVC to PVName without creating the PV.
	NoPV bool
	// Pending leaves the PVC's status.phase Pending.
	Pending bool
	// ForeignClaimRef makes the PV's claimRef name the PVC with another UID,
	// as after the PVC was deleted and created again.
	ForeignClaimRef bool
}

// createBoundClaim creates a PV and a PVC bound to each other, as the PV
// controller (which does not run in the test API server) would leave them:
// the PV's claimRef names the PVC with its UID, the PVC's volumeName the PV,
// and the PVC's status.phase is Bound.
func createBoundClaim(t *testing.T, f *k8stest.Fixture, c claim) *corev1.PersistentVolumeClaim {
	t.Helper()
	ctx := t.Context()
	if c.AccessMode == "" {
		c.AccessMode = corev1.ReadWriteOnce
	}
	size := resource.MustParse("1Gi")
	pvc, err := f.Client.CoreV1().PersistentVolumeClaims(f.Namespace).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: c.PVCName, Namespace: f.Namespace},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{c.AccessMode},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
			VolumeName:       c.PVName,
			StorageClassName: ptr.To(""),
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating PVC %s: %v", c.PVCName, err)
	}
	if !c.NoPV {
		src := c.PVSource
		if src == nil {
			src = &corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: c.Driver, VolumeHandle: c.Handle, VolumeAttributes: c.Attributes,
			}}
		}
		claimUID := pvc.UID
		if c.ForeignClaimRef {
			claimUID = "00000000-0000-0000-0000-000000000000"
		}
		pv := &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: c.PVName},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
				AccessModes:                   []corev1.PersistentVolumeAccessMode{c.AccessMode},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
				StorageClassName:              "",
				ClaimRef: &corev1.ObjectReference{
					Kind: "PersistentVolumeClaim", APIVersion: "v1",
					Namespace: pvc.Namespace, Name: pvc.Name, UID: claimUID,
				},
				PersistentVolumeSource: *src,
			},
		}
		if _, err := f.Client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating PV %s: %v", c.PVName, err)
		}
		t.Cleanup(func() {
			ctx := context.WithoutCancel(t.Context())
			if err := f.Client.CoreV1().PersistentVolumes().Delete(ctx, c.PVName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("deleting PV %s: %v", c.PVName, err)
			}
		})
	}
	if c.Pending {
		return pvc
	}
	pvc.Status.Phase = corev1.ClaimBound
	pvc.Status.AccessModes = []corev1.PersistentVolumeAccessMode{c.AccessMode}
	pvc.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: size}
	pvc, err = f.Client.CoreV1().PersistentVolumeClaims(f.Namespace).UpdateStatus(ctx, pvc, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("binding PVC %s: %v", c.PVCName, err)
	}
	return pvc
}

// podVolume is one volume of a pod: its name in the pod and its PVC.
type podVolume struct {
	Name, ClaimName string
}

// createPod creates a pod on the fixture's node whose one container mounts
// every volume.
func createPod(t *testing.T, f *k8stest.Fixture, name string, vols ...podVolume) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.Namespace},
		Spec: corev1.PodSpec{
			NodeName:   f.NodeName,
			Containers: []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}},
		},
	}
	for _, v := range vols {
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{
			Name:         v.Name,
			VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: v.ClaimName}},
		})
		pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts,
			corev1.VolumeMount{Name: v.Name, MountPath: "/mnt/" + v.Name})
	}
	created, err := f.Client.CoreV1().Pods(f.Namespace).Create(t.Context(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod %s: %v", name, err)
	}
	return created
}

// deletePod deletes a pod at once (grace period 0), as a kubelet does once
// the containers have stopped.
func deletePod(t *testing.T, f *k8stest.Fixture, pod *corev1.Pod) {
	t.Helper()
	err := f.Client.CoreV1().Pods(pod.Namespace).Delete(t.Context(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	if err != nil {
		t.Fatalf("deleting pod %s: %v", pod.Name, err)
	}
}

// volumesReady returns the pod's csi-volmgr.io/VolumesReady condition.
func volumesReady(t *testing.T, f *k8stest.Fixture, pod *corev1.Pod) (*corev1.PodCondition, error) {
	got, err := f.Client.CoreV1().Pods(pod.Namespace).Get(t.Context(), pod.Name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	for i := range got.Status.Conditions {
		if got.Status.Conditions[i].Type == status.ConditionVolumesReady {
			return &got.Status.Conditions[i], nil
		}
	}
	return nil, nil
}

// waitCondition waits until the pod's VolumesReady condition satisfies ok
// and returns it.
func waitCondition(t *testing.T, f *k8stest.Fixture, pod *corev1.Pod, what string, ok func(c *corev1.PodCondition) bool) *corev1.PodCondition {
	t.Helper()
	var last *corev1.PodCondition
	eventually(t, fmt.Sprintf("pod %s: %s", pod.Name, what), func() (bool, error) {
		c, err := volumesReady(t, f, pod)
		if err != nil {
			return false, err
		}
		last = c
		if c == nil {
			return false, errors.New("the pod has no VolumesReady condition")
		}
		if !ok(c) {
			return false, fmt.Errorf("condition is %s reason=%q message=%q", c.Status, c.Reason, c.Message)
		}
		return true, nil
	})
	return last
}

// waitReady waits until the pod's VolumesReady condition is True.
func waitReady(t *testing.T, f *k8stest.Fixture, pod *corev1.Pod) {
	t.Helper()
	waitCondition(t, f, pod, "VolumesReady=True", func(c *corev1.PodCondition) bool {
		return c.Status == corev1.ConditionTrue
	})
}

// waitReason waits until the pod's VolumesReady condition is False with
// reason and a message containing every one of msgParts.
func waitReason(t *testing.T, f *k8stest.Fixture, pod *corev1.Pod, reason string, msgParts ...string) *corev1.PodCondition {
	t.Helper()
	return waitCondition(t, f, pod, fmt.Sprintf("VolumesReady=False reason %s message containing %q", reason, msgParts),
		func(c *corev1.PodCondition) bool {
			if c.Status != corev1.ConditionFalse || c.Reason != reason {
				return false
			}
			for _, p := range msgParts {
				if !strings.Contains(c.Message, p) {
					return false
				}
			}
			return true
		})
}

// volumesInUse returns the Node's status.volumesInUse.
func volumesInUse(t *testing.T, f *k8stest.Fixture) ([]corev1.UniqueVolumeName, error) {
	node, err := f.Client.CoreV1().Nodes().Get(t.Context(), f.NodeName, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return node.Status.VolumesInUse, nil
}

// waitInUse waits until the Node's volumesInUse satisfies ok.
func waitInUse(t *testing.T, f *k8stest.Fixture, what string, ok func([]corev1.UniqueVolumeName) bool) {
	t.Helper()
	eventually(t, "volumesInUse "+what, func() (bool, error) {
		got, err := volumesInUse(t, f)
		if err != nil {
			return false, err
		}
		if !ok(got) {
			return false, fmt.Errorf("volumesInUse is %q", got)
		}
		return true, nil
	})
}

// uniqueName is the name of a CSI PV volume in volumesInUse.
func uniqueName(driver, handle string) corev1.UniqueVolumeName {
	return corev1.UniqueVolumeName(volume.PersistentName(driver, handle))
}

// podPaths are where the agent publishes a pod's PV volume.
type podPaths struct {
	// Dir is <root>/pods/<uid>/volumes/kubernetes.io~csi/<pv>.
	Dir    string
	Target string
	Record string
}

func publishPaths(a *agent, pod *corev1.Pod, pvName string) podPaths {
	dir := filepath.Join(a.Root, "pods", string(pod.UID), "volumes", "kubernetes.io~csi", pvName)
	return podPaths{Dir: dir, Target: filepath.Join(dir, "mount"), Record: filepath.Join(dir, paths.DataFileName)}
}

// stagePaths are where the agent stages a volume.
type stagePaths struct {
	// Dir is <root>/plugins/kubernetes.io/csi/<driver>/<sha256(handle)>.
	Dir    string
	Path   string
	Record string
}

func stagingPaths(a *agent, driver, handle string) stagePaths {
	dir := filepath.Join(a.Root, "plugins", "kubernetes.io", "csi", driver, paths.HandleHash(handle))
	return stagePaths{Dir: dir, Path: filepath.Join(dir, "globalmount"), Record: filepath.Join(dir, paths.DataFileName)}
}

// exists says whether p exists.
func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// waitGone waits until none of the paths exists.
func waitGone(t *testing.T, what string, ps ...string) {
	t.Helper()
	eventually(t, what+" removed", func() (bool, error) {
		if i := slices.IndexFunc(ps, exists); i >= 0 {
			return false, fmt.Errorf("%s still exists", ps[i])
		}
		return true, nil
	})
}
