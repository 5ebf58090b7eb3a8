package source

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
)

// richPod is a pod with most fields set, as a real cluster's pods are.
func richPod() *corev1.Pod {
	fsGroup, grace := int64(2000), int64(30)
	policy := corev1.FSGroupChangeOnRootMismatch
	seLinuxPolicy := corev1.SELinuxChangePolicyRecursive
	now := metav1.NewTime(time.Unix(1700000000, 0))
	container := func(name string) corev1.Container {
		return corev1.Container{
			Name:    name,
			Image:   "registry.example.com/app:v1",
			Command: []string{"/app", "--serve"},
			Env:     []corev1.EnvVar{{Name: "A", Value: "b"}},
			Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")},
			},
			VolumeMounts: []corev1.VolumeMount{
				{Name: "data", MountPath: "/data", ReadOnly: true, SubPath: "x"},
				{Name: "kube-api-access", MountPath: "/var/run/secrets"},
			},
			VolumeDevices: []corev1.VolumeDevice{{Name: "raw", DevicePath: "/dev/xvda"}},
			SecurityContext: &corev1.SecurityContext{
				SELinuxOptions: &corev1.SELinuxOptions{Level: "s0:c1,c2"},
				RunAsUser:      new(int64(1000)),
			},
			LivenessProbe: &corev1.Probe{PeriodSeconds: 10},
		}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "web-0", Namespace: "ns", UID: "uid-1", ResourceVersion: "42",
			Labels:                     map[string]string{"app": "web"},
			Annotations:                map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{...}"},
			OwnerReferences:            []metav1.OwnerReference{{Kind: "StatefulSet", Name: "web", UID: "ss"}},
			ManagedFields:              []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
			DeletionTimestamp:          &now,
			DeletionGracePeriodSeconds: &grace,
		},
		Spec: corev1.PodSpec{
			NodeName:           "node-a",
			ServiceAccountName: "web",
			InitContainers:     []corev1.Container{container("init")},
			Containers:         []corev1.Container{container("app"), {Name: "sidecar"}},
			EphemeralContainers: []corev1.EphemeralContainer{{
				EphemeralContainerCommon: corev1.EphemeralContainerCommon(container("debug")),
				TargetContainerName:      "app",
			}},
			Volumes: []corev1.Volume{
				{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data-web-0"}}},
				{Name: "raw", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{}}},
				{Name: "inline", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: "csi.example.com"}}},
				{Name: "ebs", VolumeSource: corev1.VolumeSource{AWSElasticBlockStore: &corev1.AWSElasticBlockStoreVolumeSource{VolumeID: "vol-1"}}},
				{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{}}},
				{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{}}},
			},
			SecurityContext: &corev1.PodSecurityContext{
				FSGroup:             &fsGroup,
				FSGroupChangePolicy: &policy,
				SELinuxOptions:      &corev1.SELinuxOptions{Level: "s0:c3,c4"},
				SELinuxChangePolicy: &seLinuxPolicy,
				RunAsUser:           new(int64(1000)),
				SupplementalGroups:  []int64{5},
			},
			Tolerations: []corev1.Toleration{{Key: "k", Operator: corev1.TolerationOpExists}},
		},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning,
			Conditions: []corev1.PodCondition{
				{Type: corev1.PodReady, Status: corev1.ConditionTrue},
				{Type: status.ConditionVolumesReady, Status: corev1.ConditionTrue, Reason: "Published"},
			},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "app", ImageID: "sha256:abc", Ready: true}},
			PodIP:             "10.0.0.1",
		},
	}
}

// TestTrimPod: the cached pod keeps exactly the fields trim.go lists, the
// informer's object is left as it was, and trimming is idempotent (a
// client-go requirement of transforms).
func TestTrimPod(t *testing.T) {
	pod := richPod()
	before := pod.DeepCopy()
	got := trimPod(pod)

	seLinux := &corev1.SecurityContext{SELinuxOptions: &corev1.SELinuxOptions{Level: "s0:c1,c2"}}
	trimmed := func(name string) corev1.Container {
		return corev1.Container{
			Name:            name,
			VolumeMounts:    []corev1.VolumeMount{{Name: "data"}, {Name: "kube-api-access"}},
			VolumeDevices:   []corev1.VolumeDevice{{Name: "raw"}},
			SecurityContext: seLinux,
		}
	}
	want := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "web-0", Namespace: "ns", UID: "uid-1", ResourceVersion: "42",
			DeletionTimestamp:          before.DeletionTimestamp,
			DeletionGracePeriodSeconds: before.DeletionGracePeriodSeconds,
		},
		Spec: corev1.PodSpec{
			NodeName:            "node-a",
			ServiceAccountName:  "web",
			InitContainers:      []corev1.Container{trimmed("init")},
			Containers:          []corev1.Container{trimmed("app"), {Name: "sidecar"}},
			EphemeralContainers: []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon(trimmed("debug"))}},
			Volumes:             before.Spec.Volumes[:4], // PVC, ephemeral, inline CSI, migratable in-tree
			SecurityContext: &corev1.PodSecurityContext{
				FSGroup:             before.Spec.SecurityContext.FSGroup,
				FSGroupChangePolicy: before.Spec.SecurityContext.FSGroupChangePolicy,
				SELinuxOptions:      before.Spec.SecurityContext.SELinuxOptions,
				SELinuxChangePolicy: before.Spec.SecurityContext.SELinuxChangePolicy,
			},
		},
		Status: corev1.PodStatus{
			Phase:      corev1.PodRunning,
			Conditions: []corev1.PodCondition{before.Status.Conditions[1]},
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("trimPod (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(before, pod); diff != "" {
		t.Errorf("trimPod changed its argument (-before +after):\n%s", diff)
	}
	if diff := cmp.Diff(got, trimPod(got)); diff != "" {
		t.Errorf("trimPod is not idempotent (-once +twice):\n%s", diff)
	}
	if got, err := trimPodTransform("not a pod"); err != nil || got != "not a pod" {
		t.Errorf("trimPodTransform(string) = %v, %v; want it passed through", got, err)
	}
}

// TestPodCacheIsTrimmed: the pods the Source serves are the trimmed ones.
func TestPodCacheIsTrimmed(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	pod := richPod()
	pod.DeletionTimestamp, pod.DeletionGracePeriodSeconds = nil, nil
	client := fake.NewClientset(pod)
	s, err := New(ctx, Config{Client: client, NodeName: "node-a"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	var cached *corev1.Pod
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		var ok bool
		cached, ok = s.PodByName("ns", "web-0")
		return ok, nil
	}); err != nil {
		t.Fatalf("the pod never reached the cache: %v", err)
	}
	if diff := cmp.Diff(trimPod(pod), cached); diff != "" {
		t.Errorf("cached pod (-trimmed +cached):\n%s", diff)
	}
}
