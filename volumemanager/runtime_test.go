package volumemanager_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/mount-utils"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// TestTeardownWaitsForTheRuntime runs the volume manager for a runtime
// (WaitForContainersStopped, with RemoveTerminatingPods too) against a
// real API server and the real plugin, and uses the HTTP pod API as a
// runtime beside the agent would: the pod's volume is published and
// reported with its host path; deleting the pod marks it for deletion but
// leaves the volume mounted; only the runtime's containers-stopped signal
// unpublishes it.
func TestTeardownWaitsForTheRuntime(t *testing.T) {
	f := k8stest.New(t)
	ctx := t.Context()
	f.CreateNode(t) // the runtime's Node
	n := startClusterNode(t, f, func(c *volumemanager.Config) {
		c.RemoveTerminatingPods, c.WaitForContainersStopped = true, true
	})
	vm, p, handle := n.vm, n.plugin, n.handle
	api := httptest.NewServer(vm.Handler())
	t.Cleanup(api.Close)

	pods := f.Client.CoreV1().Pods(f.Namespace)
	newPod := func(name, claim string) *corev1.Pod {
		t.Helper()
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.Namespace},
			Spec:       corev1.PodSpec{NodeName: f.NodeName, Containers: []corev1.Container{{Name: "c", Image: "i"}}},
		}
		if claim != "" {
			pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
			pod.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
			}}}
		}
		created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return created
	}

	// A pod whose claim does not exist: the wait ends with the reason.
	broken := newPod("broken", "missing")
	short, stop := context.WithTimeout(ctx, 3*time.Second)
	err := vm.WaitForAttachAndMount(short, broken)
	stop()
	if nr, ok := errors.AsType[*volumemanager.VolumesNotReadyError](err); !ok || nr.Reason != status.ReasonInvalidVolumeSpec || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitForAttachAndMount of a pod with a missing claim = %v, want a VolumesNotReadyError with reason %s", err, status.ReasonInvalidVolumeSpec)
	}

	// Over HTTP: the same reason once the wait times out; bad requests say why.
	var pending volumemanager.PodVolumes
	getJSON(t, api.URL+"/api/v1/pods/"+f.Namespace+"/broken?wait=mounted&timeout=1s&uid="+string(broken.UID), http.StatusGatewayTimeout, &pending)
	if pending.State != volumemanager.PodVolumesPending || pending.Reason != status.ReasonInvalidVolumeSpec || pending.Message == "" {
		t.Errorf("timed-out wait answered %+v, want Pending with reason %s and a message", pending, status.ReasonInvalidVolumeSpec)
	}
	for _, bad := range []struct {
		method, path string
		code         int
	}{
		{http.MethodGet, "/api/v1/pods/" + f.Namespace + "/nosuchpod", http.StatusNotFound},
		{http.MethodGet, "/api/v1/pods/" + f.Namespace + "/broken?timeout=forever", http.StatusBadRequest},
		{http.MethodGet, "/api/v1/pods/" + f.Namespace + "/broken?wait=soon", http.StatusBadRequest},
		{http.MethodPost, "/api/v1/pods/" + f.Namespace + "/broken/containers-stopped", http.StatusBadRequest},
	} {
		req, err := http.NewRequestWithContext(ctx, bad.method, api.URL+bad.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != bad.code {
			t.Errorf("%s %s answered %s, want %d", bad.method, bad.path, resp.Status, bad.code)
		}
	}

	app := newPod("app", "data")
	var state volumemanager.PodVolumes
	getJSON(t, api.URL+"/api/v1/pods/"+f.Namespace+"/app?wait=mounted&timeout=60s&uid="+string(app.UID), http.StatusOK, &state)
	if state.State != volumemanager.PodVolumesReady || len(state.Volumes) != 1 || state.Volumes[0].Name != "data" || state.Volumes[0].HostPath == "" {
		t.Fatalf("pod state %+v: want Ready with volume data and its host path", state)
	}
	target := state.Volumes[0].HostPath
	if got := vm.GetMountedVolumesForPod(app.UID)["data"]; !reflect.DeepEqual(got, state.Volumes[0]) {
		t.Errorf("GetMountedVolumesForPod = %+v, the HTTP API says %+v", got, state.Volumes[0])
	}
	if err := os.WriteFile(filepath.Join(target, "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}

	// containers-stopped is refused for a live pod (the API server has it,
	// not marked for deletion), for a UID that is another pod's, and for a
	// UID the agent does not know: nothing is torn down.
	stopped := func(name string, uid types.UID) string {
		return api.URL + "/api/v1/pods/" + f.Namespace + "/" + name + "/containers-stopped?uid=" + string(uid)
	}
	for _, tc := range []struct {
		why, url string
		want     int
	}{
		{"a live pod", stopped("app", app.UID), http.StatusConflict},
		{"another pod's UID", stopped("broken", app.UID), http.StatusConflict},
		{"the pod's UID in another namespace", api.URL + "/api/v1/pods/other/app/containers-stopped?uid=" + string(app.UID), http.StatusConflict},
		{"an unknown UID", stopped("app", "no-such-uid"), http.StatusNotFound},
	} {
		if code := call(t, http.DefaultClient, http.MethodPost, tc.url, ""); code != tc.want {
			t.Errorf("POST containers-stopped for %s answered %d, want %d", tc.why, code, tc.want)
		}
	}

	// Marked for deletion: the runtime's containers may still run, so the
	// volume stays. A pod created after the deletion and seen ready shows
	// the agent has processed the deletion's event too.
	if err := pods.Delete(ctx, app.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := vm.WaitForAttachAndMount(ctx, newPod("later", "")); err != nil {
		t.Fatal(err)
	}
	if isMnt, err := mount.New("").IsMountPoint(target); err != nil || !isMnt {
		t.Fatalf("volume unmounted while the pod is only marked for deletion (mount point %v, %v)", isMnt, err)
	}
	if slices.Contains(n.okCalls(t), "NodeUnpublishVolume") {
		t.Fatal("NodeUnpublishVolume before the runtime said the containers stopped")
	}

	if code := call(t, http.DefaultClient, http.MethodPost, stopped("broken", app.UID), ""); code != http.StatusConflict {
		t.Errorf("POST containers-stopped of a deleting pod under another name answered %d, want 409", code)
	}

	// The runtime says its containers stopped, then waits for the unmount.
	signalled := time.Now()
	resp, err := http.Post(api.URL+"/api/v1/pods/"+f.Namespace+"/app/containers-stopped?uid="+string(app.UID), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("containers-stopped answered %s", resp.Status)
	}
	if err := vm.WaitForUnmount(ctx, app); err != nil {
		t.Fatal(err)
	}
	if isMnt, _ := mount.New("").IsMountPoint(target); isMnt {
		t.Errorf("target %s still mounted after WaitForUnmount", target)
	}
	entries, err := p.ReadJournal()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Method == "NodeUnpublishVolume" && e.VolumeID == handle && e.Time.Before(signalled) {
			t.Errorf("NodeUnpublishVolume at %v, before the signal at %v", e.Time, signalled)
		}
	}
	poll(t, "the unstage", func(context.Context) (bool, error) { return len(vm.Volumes()) == 0, nil })
}

func getJSON(t *testing.T, url string, wantCode int, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != wantCode {
		t.Fatalf("GET %s: %s, want %d", url, resp.Status, wantCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(fmt.Errorf("GET %s: %w", url, err))
	}
}
