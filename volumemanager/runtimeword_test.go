package volumemanager_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/mount-utils"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/metrics"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// runtimeNode is a clusterNode for a runtime (WaitForContainersStopped),
// with its HTTP API.
type runtimeNode struct {
	*clusterNode
	f   *k8stest.Fixture
	api *httptest.Server
}

func startRuntimeNode(t *testing.T) *runtimeNode {
	t.Helper()
	f := k8stest.New(t)
	f.CreateNode(t) // the runtime's Node
	n := &runtimeNode{f: f, clusterNode: startClusterNode(t, f, func(c *volumemanager.Config) { c.WaitForContainersStopped = true })}
	n.startAPI(t)
	return n
}

// startAPI serves the current volume manager's HTTP API.
func (n *runtimeNode) startAPI(t *testing.T) {
	n.api = httptest.NewServer(n.vm.Handler())
	t.Cleanup(n.api.Close)
}

// publishedPod creates a pod of the claim "data" and returns it once its
// volume is published, with the volume's host path.
func (n *runtimeNode) publishedPod(t *testing.T, name string) (*corev1.Pod, string) {
	t.Helper()
	pod, err := n.f.Client.CoreV1().Pods(n.f.Namespace).Create(t.Context(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: n.f.Namespace},
		Spec: corev1.PodSpec{NodeName: n.f.NodeName, Containers: []corev1.Container{{
			Name: "c", Image: "i", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
		}}, Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"},
		}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := n.vm.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	return pod, n.vm.GetMountedVolumesForPod(pod.UID)["data"].HostPath
}

// forceDelete deletes the pod with grace period 0: it is gone from the API
// server at once, whatever its containers do.
func (n *runtimeNode) forceDelete(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	if err := n.f.Client.CoreV1().Pods(n.f.Namespace).Delete(t.Context(), pod.Name,
		metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
}

// waitAwaiting waits until the pod awaits its runtime, as the Go and the
// HTTP API show it.
func (n *runtimeNode) waitAwaiting(t *testing.T, uid types.UID, reason string) {
	t.Helper()
	poll(t, "the pod awaiting its runtime", func(context.Context) (bool, error) {
		p, ok := n.vm.PodVolumes(uid)
		return ok && p.State == volumemanager.PodVolumesAwaitingRuntime, nil
	})
	var listed []volumemanager.PodVolumes
	getJSON(t, n.api.URL+volumemanager.PodsPath, http.StatusOK, &listed)
	i := slices.IndexFunc(listed, func(p volumemanager.PodVolumes) bool { return p.UID == uid })
	if i < 0 || listed[i].State != volumemanager.PodVolumesAwaitingRuntime ||
		listed[i].Reason != volumemanager.ReasonAwaitingRuntime || !strings.Contains(listed[i].Message, reason) || len(listed[i].Volumes) != 0 {
		t.Fatalf("GET %s = %+v: want pod %s AwaitingRuntime, message %q", volumemanager.PodsPath, listed, uid, reason)
	}
}

func (n *runtimeNode) wantAwaitingGauge(t *testing.T, want int) {
	t.Helper()
	got, err := testutil.GatherAndCount(n.vm.Metrics(), metrics.AwaitingRuntimeName)
	if err != nil || got != 1 {
		t.Fatalf("%s: %d series, %v", metrics.AwaitingRuntimeName, got, err)
	}
	mfs, err := n.vm.Metrics().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == metrics.AwaitingRuntimeName {
			if v := mf.GetMetric()[0].GetGauge().GetValue(); int(v) != want {
				t.Errorf("%s = %v, want %d", metrics.AwaitingRuntimeName, v, want)
			}
		}
	}
}

// postStopped sends containers-stopped of the pod name with uid and
// returns the status code.
func (n *runtimeNode) postStopped(t *testing.T, name string, uid types.UID) int {
	t.Helper()
	return call(t, http.DefaultClient, http.MethodPost, n.api.URL+volumemanager.PodsPath+"/"+n.f.Namespace+"/"+name+"/containers-stopped?uid="+string(uid), "")
}

// beginRunningPods asks for the mark of a running-pods report over HTTP,
// as a runtime right before it lists its pods.
func (n *runtimeNode) beginRunningPods(t *testing.T) string {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, n.api.URL+volumemanager.RunningPodsBeginPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m volumemanager.RunningPodsMark
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil || resp.StatusCode != http.StatusOK || m.Mark == "" {
		t.Fatalf("POST %s: %s, %+v, %v; want 200 and a mark", volumemanager.RunningPodsBeginPath, resp.Status, m, err)
	}
	return m.Mark
}

// report is the body of a running-pods report of mark with uids.
func report(mark string, uids ...types.UID) string {
	b, err := json.Marshal(volumemanager.RunningPodsReport{Mark: mark, UIDs: append([]types.UID{}, uids...)})
	if err != nil {
		panic(err)
	}
	return string(b)
}

func (n *runtimeNode) putRunningPods(t *testing.T, body string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPut, n.api.URL+volumemanager.RunningPodsPath, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

func wantMounted(t *testing.T, target string, want bool, why string) {
	t.Helper()
	isMnt, err := mount.New("").IsMountPoint(target)
	if err != nil && want {
		t.Fatalf("%s: %v", why, err)
	}
	if isMnt != want {
		t.Fatalf("%s: %s mounted = %v, want %v", why, target, isMnt, want)
	}
}

// TestForceDeletedPodsKeepTheirVolumesUntilTheRuntimeReleasesThem: with a
// runtime, a published pod force-deleted from the API server keeps its
// volume (its containers may still run) until the runtime's word: the
// containers-stopped signal by UID for one, and for the other a
// running-pods report over HTTP — one that still has the pod keeps it,
// one without it tears it down.
func TestForceDeletedPodsKeepTheirVolumesUntilTheRuntimeReleasesThem(t *testing.T) {
	n := startRuntimeNode(t)
	ctx := t.Context()
	a, targetA := n.publishedPod(t, "a")
	b, targetB := n.publishedPod(t, "b")
	n.vm.RunningPods([]types.UID{a.UID, b.UID}) // as before the deletes: both run

	deleted := time.Now()
	n.forceDelete(t, a)
	n.forceDelete(t, b)
	n.waitAwaiting(t, a.UID, "no longer in the API server")
	n.waitAwaiting(t, b.UID, "no longer in the API server")
	n.wantAwaitingGauge(t, 2)
	time.Sleep(time.Until(deleted.Add(10 * time.Second)))
	wantMounted(t, targetA, true, "10 s after the force delete")
	wantMounted(t, targetB, true, "10 s after the force delete")
	if slices.Contains(n.okCalls(t), "NodeUnpublishVolume") {
		t.Fatal("NodeUnpublishVolume before the runtime's word")
	}

	// The signal by UID, for a pod the API server no longer has: under
	// its own name only.
	if code := n.postStopped(t, "b", a.UID); code != http.StatusConflict {
		t.Fatalf("containers-stopped of a under b's name answered %d, want 409", code)
	}
	resp, err := http.Post(n.api.URL+volumemanager.PodsPath+"/"+n.f.Namespace+"/a/containers-stopped?uid="+string(a.UID), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("containers-stopped answered %s", resp.Status)
	}
	if err := n.vm.WaitForUnmount(ctx, a); err != nil {
		t.Fatal(err)
	}
	wantMounted(t, targetA, false, "after containers-stopped")
	wantMounted(t, targetB, true, "after the other pod's containers-stopped")
	n.wantAwaitingGauge(t, 1)

	// Bad reports change nothing: among them an empty list without a
	// mark, or with a mark the agent never issued.
	mark := n.beginRunningPods(t)
	run, _, _ := strings.Cut(mark, ".")
	for _, bad := range []string{"", "not json", "{}", `{"uids": []}`, `{"mark": "` + mark + `", "uids": null}`,
		`{"mark": "` + mark + `", "uids": [""]}`, `{"mark": "` + mark + `", "pods": []}`, report(mark) + report(mark),
		report("not-a-mark"), report(run + ".x"), report(run + ".99999")} {
		if code := n.putRunningPods(t, bad); code != http.StatusBadRequest {
			t.Errorf("PUT %s %q answered %d, want 400", volumemanager.RunningPodsPath, bad, code)
		}
	}
	// A mark of an earlier run of the agent (another run ID) is refused.
	if code := n.putRunningPods(t, report("0123456789abcdef.0")); code != http.StatusConflict {
		t.Errorf("PUT %s with a mark of another run answered %d, want 409", volumemanager.RunningPodsPath, code)
	}
	// A report that still has b keeps it.
	if code := n.putRunningPods(t, report(mark, b.UID)); code != http.StatusNoContent {
		t.Fatalf("PUT %s answered %d, want 204", volumemanager.RunningPodsPath, code)
	}
	time.Sleep(2 * time.Second)
	wantMounted(t, targetB, true, "after a report that has the pod")
	n.waitAwaiting(t, b.UID, "no longer in the API server")
	// One without it releases it.
	if code := n.putRunningPods(t, report(n.beginRunningPods(t))); code != http.StatusNoContent {
		t.Fatalf("PUT %s answered %d, want 204", volumemanager.RunningPodsPath, code)
	}
	if err := n.vm.WaitForUnmount(ctx, b); err != nil {
		t.Fatal(err)
	}
	wantMounted(t, targetB, false, "after a report without the pod")
	n.wantAwaitingGauge(t, 0)
	poll(t, "the unstage", func(context.Context) (bool, error) { return len(n.vm.Volumes()) == 0, nil })
}

// TestPodFoundOnDiskAfterARestartWaitsForTheRuntime: a pod force-deleted
// while the agent was down is found on disk at start; its volume stays
// until the runtime's report says it no longer runs it.
func TestPodFoundOnDiskAfterARestartWaitsForTheRuntime(t *testing.T) {
	n := startRuntimeNode(t)
	pod, target := n.publishedPod(t, "a")
	n.stop()
	n.forceDelete(t, pod)
	n.restart(t)
	n.startAPI(t)
	poll(t, "the restarted agent ready", func(context.Context) (bool, error) { return n.vm.Ready(), nil })
	n.waitAwaiting(t, pod.UID, "found on disk at start")
	n.wantAwaitingGauge(t, 1)
	time.Sleep(3 * time.Second)
	wantMounted(t, target, true, "after the restart, without the runtime's word")

	n.vm.RunningPods([]types.UID{pod.UID})
	time.Sleep(time.Second)
	wantMounted(t, target, true, "after a report that has the pod")
	n.vm.RunningPods(nil)
	if err := n.vm.WaitForUnmount(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	wantMounted(t, target, false, "after a report without the pod")
	n.wantAwaitingGauge(t, 0)
	poll(t, "the unstage", func(context.Context) (bool, error) { return len(n.vm.Volumes()) == 0, nil })
}

// TestStaleRunningPodsReportKeepsAPodStartedAfterItsList: the race of a
// report over HTTP. The runtime takes its mark and lists its pods; then
// pod P starts (its volume published) and is force-deleted; then the
// report, taken before P started and so without it, arrives. It releases
// nothing of P, whose containers run: the volume stays mounted. A report
// listed after P left, without P, releases it.
func TestStaleRunningPodsReportKeepsAPodStartedAfterItsList(t *testing.T) {
	n := startRuntimeNode(t)
	mark := n.beginRunningPods(t) // the runtime lists its pods: none
	p, target := n.publishedPod(t, "p")
	n.forceDelete(t, p)
	n.waitAwaiting(t, p.UID, "no longer in the API server")

	if code := n.putRunningPods(t, report(mark)); code != http.StatusNoContent {
		t.Fatalf("PUT %s of the stale list answered %d, want 204", volumemanager.RunningPodsPath, code)
	}
	time.Sleep(3 * time.Second)
	wantMounted(t, target, true, "after a report listed before the pod started")
	if slices.Contains(n.okCalls(t), "NodeUnpublishVolume") {
		t.Fatal("NodeUnpublishVolume after a report listed before the pod started")
	}
	n.waitAwaiting(t, p.UID, "no longer in the API server")
	n.wantAwaitingGauge(t, 1)

	if code := n.putRunningPods(t, report(n.beginRunningPods(t))); code != http.StatusNoContent {
		t.Fatalf("PUT %s answered %d, want 204", volumemanager.RunningPodsPath, code)
	}
	if err := n.vm.WaitForUnmount(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	wantMounted(t, target, false, "after a report listed after the pod left")
	n.wantAwaitingGauge(t, 0)
}
