package manifests

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/source"
)

const (
	testNode    = "node-1"
	waitTimeout = 10 * time.Second
)

const podYAML = `apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  containers:
  - name: c
    image: busybox
    volumeMounts:
    - name: data
      mountPath: /data
  volumes:
  - name: data
    persistentVolumeClaim:
      claimName: data
`

const claimYAML = `apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: data
spec:
  accessModes: [ReadWriteOnce]
  volumeName: pv-1
  resources:
    requests:
      storage: 1Gi
`

const volumeYAML = `apiVersion: v1
kind: PersistentVolume
metadata:
  name: pv-1
spec:
  capacity:
    storage: 1Gi
  accessModes: [ReadWriteOnce]
  csi:
    driver: test.csi.example.com
    volumeHandle: vol-1
`

// fixture is a manifest directory with a running Source and a record of
// its notifications.
type fixture struct {
	t      *testing.T
	dir    string
	src    *Source
	logs   ktesting.Underlier
	mu     sync.Mutex
	pods   []types.UID
	policy []string
}

// newFixture writes files into a new directory and starts a Source on it.
func newFixture(t *testing.T, files map[string]string) *fixture {
	t.Helper()
	f := &fixture{t: t, dir: t.TempDir()}
	for name, content := range files {
		f.write(name, content)
	}
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true), ktesting.Verbosity(5)))
	f.logs = logger.GetSink().(ktesting.Underlier)
	ctx, cancel := context.WithCancel(klog.NewContext(t.Context(), logger))
	src, err := New(ctx, Config{Dir: f.dir, NodeName: testNode, Debounce: 10 * time.Millisecond})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	f.src = src
	src.OnPodChange(func(uid types.UID) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.pods = append(f.pods, uid)
	})
	src.Policies().OnChange(func(d string) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.policy = append(f.policy, d)
	})
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return f
}

func (f *fixture) write(name, content string) {
	f.t.Helper()
	if err := os.WriteFile(filepath.Join(f.dir, name), []byte(content), 0o600); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) remove(name string) {
	f.t.Helper()
	if err := os.Remove(filepath.Join(f.dir, name)); err != nil {
		f.t.Fatal(err)
	}
}

// until waits for cond, failing the test after waitTimeout.
func (f *fixture) until(what string, cond func() bool) {
	f.t.Helper()
	err := wait.PollUntilContextTimeout(f.t.Context(), 5*time.Millisecond, waitTimeout, true,
		func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		f.t.Fatalf("waiting for %s: %v", what, err)
	}
}

func (f *fixture) notifiedPod(uid types.UID) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, u := range f.pods {
		if u == uid {
			return true
		}
	}
	return false
}

func (f *fixture) resetNotifications() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pods, f.policy = nil, nil
}

func (f *fixture) podUID(name string) (types.UID, bool) {
	pod, ok := f.src.PodByName("default", name)
	if !ok {
		return "", false
	}
	return pod.UID, true
}

func TestNewReadsMultiDocumentFilesAndBindsClaims(t *testing.T) {
	f := newFixture(t, map[string]string{"app.yaml": podYAML + "---\n" + claimYAML + "---\n" + volumeYAML})

	pods := f.src.Pods()
	if len(pods) != 1 {
		t.Fatalf("Pods() = %d pods, want 1", len(pods))
	}
	pod := pods[0]
	if pod.Namespace != "default" || pod.Spec.NodeName != testNode || pod.UID == "" {
		t.Errorf("pod %s/%s on node %q with UID %q; want namespace default, node %s and a UID", pod.Namespace, pod.Name, pod.Spec.NodeName, testNode, pod.UID)
	}
	if got, ok := f.src.Pod(pod.UID); !ok || got != pod {
		t.Errorf("Pod(%s) = %v, %v; want the pod", pod.UID, got, ok)
	}
	pvc, err := f.src.PVC("default", "data")
	if err != nil {
		t.Fatal(err)
	}
	pv, err := f.src.PV("pv-1")
	if err != nil {
		t.Fatal(err)
	}
	if pvc.Status.Phase != corev1.ClaimBound || pvc.Spec.VolumeName != "pv-1" {
		t.Errorf("claim is %s bound to %q, want Bound to pv-1", pvc.Status.Phase, pvc.Spec.VolumeName)
	}
	if ref := pv.Spec.ClaimRef; ref == nil || ref.UID != pvc.UID || ref.Name != "data" || ref.Namespace != "default" {
		t.Errorf("volume's claimRef is %+v, want default/data with the claim's UID %s", ref, pvc.UID)
	}
	if _, err := f.src.PVC("default", "nope"); !apierrors.IsNotFound(err) {
		t.Errorf("PVC of a missing claim: %v, want NotFound", err)
	}

	// The UID is derived from the name: the same manifest read again (an
	// agent restart) gives the same pod directory.
	again, err := New(t.Context(), Config{Dir: f.dir, NodeName: testNode})
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := again.PodByName("default", "web"); !ok || p.UID != pod.UID {
		t.Errorf("UID after re-reading is %v, want %s", p, pod.UID)
	}
}

func TestClaimRefOnTheVolumeBindsAClaimWithoutVolumeName(t *testing.T) {
	claim := strings.Replace(claimYAML, "  volumeName: pv-1\n", "", 1)
	volume := volumeYAML + "  claimRef:\n    name: data\n    namespace: default\n"
	f := newFixture(t, map[string]string{"claim.yaml": claim, "volume.yaml": volume})
	pvc, err := f.src.PVC("default", "data")
	if err != nil {
		t.Fatal(err)
	}
	if pvc.Status.Phase != corev1.ClaimBound || pvc.Spec.VolumeName != "pv-1" {
		t.Errorf("claim is %s bound to %q, want Bound to pv-1", pvc.Status.Phase, pvc.Spec.VolumeName)
	}
}

func TestClaimOfAVolumeReservedForAnotherClaimIsPending(t *testing.T) {
	volume := volumeYAML + "  claimRef:\n    name: other\n    namespace: default\n"
	f := newFixture(t, map[string]string{"claim.yaml": claimYAML, "volume.yaml": volume})
	pvc, err := f.src.PVC("default", "data")
	if err != nil {
		t.Fatal(err)
	}
	if pvc.Status.Phase != corev1.ClaimPending {
		t.Errorf("claim is %s, want Pending: its volume is reserved for default/other", pvc.Status.Phase)
	}
}

func TestAddingChangingAndRemovingFiles(t *testing.T) {
	f := newFixture(t, map[string]string{"volume.yaml": volumeYAML})
	if len(f.src.Pods()) != 0 {
		t.Fatalf("Pods() = %v before any pod file", f.src.Pods())
	}

	// A pod file appears: the pod is served and reported.
	f.write("pod.yaml", podYAML)
	f.until("the new pod", func() bool {
		uid, ok := f.podUID("web")
		return ok && f.notifiedPod(uid)
	})
	uid, _ := f.podUID("web")

	// The pod references its claim (as the populator does); the claim's
	// file appearing later re-evaluates the pod.
	f.src.AddReferences(uid, source.References{PVCs: []cache.ObjectName{{Namespace: "default", Name: "data"}}})
	f.resetNotifications()
	f.write("claim.yaml", claimYAML)
	f.until("the pod to be re-evaluated for its new claim", func() bool { return f.notifiedPod(uid) })
	if pvc, err := f.src.PVC("default", "data"); err != nil || pvc.Status.Phase != corev1.ClaimBound {
		t.Fatalf("claim: %v, %v; want it Bound", pvc, err)
	}

	// A change of the pod's file is reported.
	f.resetNotifications()
	f.write("pod.yaml", strings.Replace(podYAML, "image: busybox", "image: busybox:2", 1))
	f.until("the changed pod", func() bool {
		p, ok := f.src.Pod(uid)
		return ok && p.Spec.Containers[0].Image == "busybox:2" && f.notifiedPod(uid)
	})

	// Removing the file removes the pod.
	f.resetNotifications()
	f.remove("pod.yaml")
	f.until("the pod to go", func() bool {
		_, ok := f.src.Pod(uid)
		return !ok && f.notifiedPod(uid)
	})
}

func TestBrokenEditKeepsWhatTheFileDescribedAndOtherFiles(t *testing.T) {
	other := strings.Replace(podYAML, "name: web", "name: other", 1)
	f := newFixture(t, map[string]string{"pod.yaml": podYAML, "other.yaml": other})
	uid, ok := f.podUID("web")
	if !ok {
		t.Fatal("pod web not read")
	}

	f.write("pod.yaml", podYAML+"  - name: [broken\n")
	path := filepath.Join(f.dir, "pod.yaml")
	f.until("the broken manifest to be reported", func() bool {
		return strings.Contains(f.logs.GetBuffer().String(), path+":16: not valid YAML")
	})
	if _, ok := f.src.Pod(uid); !ok {
		t.Error("pod web went away when its file stopped parsing; want it kept")
	}
	if _, ok := f.podUID("other"); !ok {
		t.Error("pod other went away when another file stopped parsing")
	}
	if f.notifiedPod(uid) {
		t.Error("pod web was re-evaluated although nothing usable changed")
	}

	// An empty file is one being written: nothing changes.
	f.write("pod.yaml", "")
	f.until("the empty manifest to be noticed", func() bool {
		return strings.Contains(f.logs.GetBuffer().String(), "Manifest is empty")
	})
	if _, ok := f.src.Pod(uid); !ok || f.notifiedPod(uid) {
		t.Error("pod web changed when its file was emptied; want it kept")
	}

	// The file fixed (a pod of another name now) replaces what it described.
	f.write("pod.yaml", strings.Replace(podYAML, "name: web", "name: web2", 1))
	f.until("the fixed file to be read", func() bool {
		_, web := f.src.Pod(uid)
		_, web2 := f.podUID("web2")
		return !web && web2
	})
}

func TestNewFailsOnAManifestThatDoesNotParse(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "good.yaml"), []byte(podYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bad.yaml"), []byte("apiVersion: v1\nkind: Pod\nmetadata:\n\tname: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := New(t.Context(), Config{Dir: dir, NodeName: testNode})
	var pe *ParseError
	if !errors.As(err, &pe) {
		t.Fatalf("New: %v, want a *ParseError", err)
	}
	if want := filepath.Join(dir, "bad.yaml") + ":4: not valid YAML"; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("New: %q, want it to start with %q", err, want)
	}

	if _, err := New(t.Context(), Config{Dir: filepath.Join(dir, "missing"), NodeName: testNode}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("New on a missing directory: %v, want ErrNotExist", err)
	}
}

func TestPoliciesFollowCSIDriverManifests(t *testing.T) {
	f := newFixture(t, nil)
	const driver = "test.csi.example.com"
	if !f.src.Policies().Get(driver).AttachRequired {
		t.Fatal("a driver without CSIDriver manifest must require attach (the kubelet's default)")
	}
	f.write("driver.yaml", "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata:\n  name: "+driver+"\nspec:\n  attachRequired: false\n  podInfoOnMount: true\n")
	f.until("the policy change", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.policy) == 1 && f.policy[0] == driver
	})
	if p := f.src.Policies().Get(driver); p.AttachRequired || !p.PodInfoOnMount {
		t.Errorf("policy %+v, want attachRequired=false, podInfoOnMount=true", p)
	}
	f.remove("driver.yaml")
	f.until("the default policy again", func() bool { return f.src.Policies().Get(driver).AttachRequired })
}

func TestObjectDefinedTwiceIsTakenFromTheFirstFile(t *testing.T) {
	second := strings.Replace(podYAML, "image: busybox", "image: second", 1)
	f := newFixture(t, map[string]string{"a.yaml": podYAML, "b.yaml": second})
	pod, ok := f.src.PodByName("default", "web")
	if !ok || pod.Spec.Containers[0].Image != "busybox" {
		t.Fatalf("pod web is %v, want the one of a.yaml", pod)
	}
	if !strings.Contains(f.logs.GetBuffer().String(), "already defined at "+filepath.Join(f.dir, "a.yaml")+":1") {
		t.Errorf("the duplicate was not logged:\n%s", f.logs.GetBuffer().String())
	}
	f.remove("a.yaml")
	f.until("b.yaml's pod to take over", func() bool {
		p, ok := f.src.PodByName("default", "web")
		return ok && p.Spec.Containers[0].Image == "second"
	})
}

func TestPodsOfOtherNodesAreIgnoredAndSecretsServed(t *testing.T) {
	foreign := strings.Replace(podYAML, "spec:\n", "spec:\n  nodeName: elsewhere\n", 1)
	secret := "apiVersion: v1\nkind: Secret\nmetadata:\n  name: creds\n  namespace: ns\ndata:\n  a: eA==\nstringData:\n  b: why\n"
	f := newFixture(t, map[string]string{"pod.yaml": foreign, "secret.yaml": secret})
	if pods := f.src.Pods(); len(pods) != 0 {
		t.Errorf("Pods() = %d pods, want none: the only pod is for another node", len(pods))
	}
	data, err := f.src.GetSecret(t.Context(), "ns", "creds")
	if err != nil {
		t.Fatal(err)
	}
	if data["a"] != "x" || data["b"] != "why" {
		t.Errorf("secret data %v, want a=x (data) and b=why (stringData)", data)
	}
	if _, err := f.src.GetSecret(t.Context(), "ns", "nope"); !apierrors.IsNotFound(err) {
		t.Errorf("GetSecret of a missing Secret: %v, want NotFound", err)
	}
}

// TestConfigMapStyleUpdatesAreSeen: a ConfigMap volume swaps a "..data"
// symlink to a new timestamped directory; no event names the manifest.
func TestConfigMapStyleUpdatesAreSeen(t *testing.T) {
	dir := t.TempDir()
	writeVersion := func(version, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(dir, version), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, version, "pod.yaml"), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(version, filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	writeVersion("..v1", podYAML)
	if err := os.Symlink(filepath.Join("..data", "pod.yaml"), filepath.Join(dir, "pod.yaml")); err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, dir: dir}
	ctx, cancel := context.WithCancel(t.Context())
	src, err := New(ctx, Config{Dir: dir, NodeName: testNode, Debounce: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	f.src = src
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	if _, ok := f.podUID("web"); !ok {
		t.Fatal("pod web not read through the ..data symlink")
	}

	writeVersion("..v2", strings.Replace(podYAML, "name: web", "name: web2", 1))
	f.until("the swapped content", func() bool {
		_, web := f.podUID("web")
		_, web2 := f.podUID("web2")
		return !web && web2
	})
}
