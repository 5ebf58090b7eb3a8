package e2e_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/mount-utils"
	testclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// TestRequiresRepublish runs a pod on a driver whose CSIDriver has
// requiresRepublish and a tokenRequest: the agent calls NodePublishVolume
// again every period at the same target, never unpublishing; the token is
// the cached one until it nears its expiry (the kubelet's refresh rule),
// then a fresh one; a republish that fails keeps the mount and the pod
// ready and records a FailedMount Event.
func TestRequiresRepublish(t *testing.T) {
	t.Parallel()
	f := k8stest.New(t)
	f.CreateNode(t)
	clk := testclock.NewFakePassiveClock(time.Now())
	a := startAgent(t, f, agentOptions{Changes: volumemanager.ChangesConfig{RepublishPeriod: 300 * time.Millisecond, TokenClock: clk}})
	driver := uniqueDriverName()
	if _, err := f.Client.StorageV1().CSIDrivers().Create(t.Context(), &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: driver},
		Spec: storagev1.CSIDriverSpec{
			AttachRequired: ptr.To(false), RequiresRepublish: ptr.To(true),
			TokenRequests: []storagev1.TokenRequest{{Audience: "vault", ExpirationSeconds: ptr.To[int64](600)}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		err := f.Client.StorageV1().CSIDrivers().Delete(context.WithoutCancel(t.Context()), driver, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
	})
	if _, err := f.Client.CoreV1().ServiceAccounts(f.Namespace).Create(t.Context(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	p := startPlugin(t, a, driver, nodeCaps())
	vol := createVolume(t, p, "data", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	pvName := "pv-" + f.Namespace
	createBoundClaim(t, f, claim{PVName: pvName, PVCName: "data", Driver: driver, Handle: vol.ID})
	pod, err := f.Client.CoreV1().Pods(f.Namespace).Create(t.Context(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "app"},
		Spec: corev1.PodSpec{
			NodeName: f.NodeName, ServiceAccountName: "default", AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10",
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitReady(t, f, pod)
	target := publishPaths(a, pod, pvName).Target

	publishes := func() []string {
		var digests []string
		for _, c := range okCalls(volumeCalls(t, p, vol.ID), nodePublish) {
			if c.Begin.TargetPath != target {
				t.Errorf("NodePublishVolume at %s, want %s", c.Begin.TargetPath, target)
			}
			digests = append(digests, c.Begin.TokensDigest)
		}
		return digests
	}
	waitPublishes := func(what string, ok func([]string) bool) []string {
		t.Helper()
		var got []string
		eventually(t, what, func() (bool, error) {
			got = publishes()
			return ok(got), fmt.Errorf("token digests of the publishes: %q", got)
		})
		return got
	}
	first := waitPublishes("two republishes", func(d []string) bool { return len(d) >= 3 })
	if first[0] == "" {
		t.Fatal("NodePublishVolume carried no service account token")
	}
	for i, d := range first {
		if d != first[0] {
			t.Fatalf("publish %d got another token (%s) although the first one is fresh: %q", i, d, first)
		}
	}
	// 500s of the token's 600s later it needs refreshing: the next
	// republish brings a new one.
	clk.SetTime(clk.Now().Add(500 * time.Second))
	waitPublishes("a republish with a fresh token", func(d []string) bool { return d[len(d)-1] != first[0] })

	if err := p.SetFaults(plugin.FaultRule{Method: nodePublish, Code: codes.Internal, Message: "secret store unreachable"}); err != nil {
		t.Fatal(err)
	}
	waitPodEvent(t, f, pod, corev1.EventTypeWarning, "FailedMount", "secret store unreachable")
	if ok, err := mount.New("").IsMountPoint(target); err != nil || !ok {
		t.Errorf("target after a failed republish: mounted %v, %v; want kept", ok, err)
	}
	waitReady(t, f, pod)
	if n := countCalls(volumeCalls(t, p, vol.ID), nodeUnpublish); n != 0 {
		t.Errorf("NodeUnpublishVolume called %d times; a republish never unmounts", n)
	}
}
