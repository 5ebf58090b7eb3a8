package volumemanager_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/selinux"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// TestMountedVolumesSayHowToSetUpTheContainer: what a runtime needs to set
// up a container beside the path, on a real API server with the real
// plugin, standing for an SELinux host (selinux.Defaults): the SELinux
// context the volume was mounted with (the one in NodePublishVolume's
// mount flags) and the group its PV asks for (pv.beta.kubernetes.io/gid),
// in the Go API and the HTTP API; GetExtraSupplementalGroupsForPod leaves
// out the groups the pod has itself, as the kubelet's does.
func TestMountedVolumesSayHowToSetUpTheContainer(t *testing.T) {
	const (
		level = "s0:c7,c8"
		label = "system_u:object_r:container_file_t:" + level
		gid   = int64(2345)
	)
	f := k8stest.New(t)
	ctx := t.Context()
	f.CreateNode(t)
	n := startClusterNodeWith(t, f, clusterNodeOptions{
		Configure: func(c *volumemanager.Config) {
			c.RemoveTerminatingPods, c.WaitForContainersStopped = true, true
			c.Tuning.SELinux = selinux.Defaults{}
		},
		Driver: func(s *storagev1.CSIDriverSpec) { s.SELinuxMount = ptr.To(true) },
		PV: func(pv *corev1.PersistentVolume) {
			pv.Annotations = map[string]string{"pv.beta.kubernetes.io/gid": "2345"}
		},
	})
	api := httptest.NewServer(n.vm.Handler())
	t.Cleanup(api.Close)

	pod, err := f.Client.CoreV1().Pods(f.Namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: f.Namespace},
		Spec: corev1.PodSpec{
			NodeName: f.NodeName,
			SecurityContext: &corev1.PodSecurityContext{
				SELinuxOptions: &corev1.SELinuxOptions{Level: level}, SupplementalGroups: []int64{100},
			},
			Containers: []corev1.Container{{Name: "c", Image: "i", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"},
			}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.vm.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}

	// The context the volume was really mounted with.
	entries, err := n.plugin.ReadJournal()
	if err != nil {
		t.Fatal(err)
	}
	published := false
	for _, e := range entries {
		if e.Method == "NodePublishVolume" && e.Event == plugin.EventBegin && e.VolumeID == n.handle {
			published = true
			if !slices.Contains(e.MountFlags, selinux.MountOption(label)) {
				t.Errorf("NodePublishVolume mount flags %q: want %s (the test's premise)", e.MountFlags, selinux.MountOption(label))
			}
		}
	}
	if !published {
		t.Fatal("no NodePublishVolume in the plugin's journal")
	}

	data, ok := n.vm.GetMountedVolumesForPod(pod.UID)["data"]
	if !ok || data.HostPath == "" {
		t.Fatalf("GetMountedVolumesForPod: %+v, want volume data with its host path", n.vm.GetMountedVolumesForPod(pod.UID))
	}
	if data.SELinuxContext != label {
		t.Errorf("SELinuxContext %q, want %q", data.SELinuxContext, label)
	}
	if data.SupplementalGroup == nil || *data.SupplementalGroup != gid {
		t.Errorf("SupplementalGroup %v, want %d", data.SupplementalGroup, gid)
	}
	if got := n.vm.GetExtraSupplementalGroupsForPod(pod); !slices.Equal(got, []int64{gid}) {
		t.Errorf("GetExtraSupplementalGroupsForPod = %v, want [%d]", got, gid)
	}
	has := pod.DeepCopy()
	has.Spec.SecurityContext.SupplementalGroups = append(has.Spec.SecurityContext.SupplementalGroups, gid)
	if got := n.vm.GetExtraSupplementalGroupsForPod(has); len(got) != 0 {
		t.Errorf("GetExtraSupplementalGroupsForPod of a pod that has group %d itself = %v, want none", gid, got)
	}

	var state volumemanager.PodVolumes
	getJSON(t, api.URL+"/api/v1/pods/"+f.Namespace+"/app", http.StatusOK, &state)
	if !slices.Equal(state.SupplementalGroups, []int64{gid}) {
		t.Errorf("HTTP API supplementalGroups %v, want [%d]", state.SupplementalGroups, gid)
	}
	if len(state.Volumes) != 1 || state.Volumes[0].SELinuxContext != label || state.Volumes[0].SupplementalGroup == nil ||
		*state.Volumes[0].SupplementalGroup != gid || state.Volumes[0].HostPath != data.HostPath {
		t.Errorf("HTTP API volumes %+v, want data with context %s and group %d as the Go API", state.Volumes, label, gid)
	}

	if err := f.Client.CoreV1().Pods(f.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	n.vm.ContainersStopped(pod.UID)
	if err := n.vm.WaitForUnmount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	poll(t, "the unstage", func(context.Context) (bool, error) { return len(n.vm.Volumes()) == 0, nil })
}
