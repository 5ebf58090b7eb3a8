package e2e_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

// TestHostileVolumes gives the agent volumes whose names, handles and
// attributes try to escape its root directory or are broken in other ways,
// next to a well-formed pod on the same node: each broken pod gets a clear
// reason on its condition, nothing is created outside the root, and the
// well-formed pod gets its volume.
func TestHostileVolumes(t *testing.T) {
	t.Parallel()
	f := k8stest.New(t)
	f.CreateNode(t)

	// Names with ".." or "/" never reach the agent: the API server refuses
	// them. Should it ever accept one, this test must grow a case for it.
	t.Run("API refuses path-like names", func(t *testing.T) {
		for _, name := range []string{"..", "a/b", "a..b", "../x"} {
			pv := &corev1.PersistentVolume{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: corev1.PersistentVolumeSpec{
					Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
					AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: "x.example.com", VolumeHandle: "h"}},
				},
			}
			if _, err := f.Client.CoreV1().PersistentVolumes().Create(t.Context(), pv, metav1.CreateOptions{}); err == nil {
				_ = f.Client.CoreV1().PersistentVolumes().Delete(t.Context(), name, metav1.DeleteOptions{})
				t.Errorf("the API server accepted PV name %q", name)
			}
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "refused", Namespace: f.Namespace},
				Spec: corev1.PodSpec{
					NodeName:   f.NodeName,
					Containers: []corev1.Container{{Name: "app", Image: "pause", VolumeMounts: []corev1.VolumeMount{{Name: name, MountPath: "/x"}}}},
					Volumes: []corev1.Volume{{Name: name, VolumeSource: corev1.VolumeSource{
						PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}}},
				},
			}
			if _, err := f.Client.CoreV1().Pods(f.Namespace).Create(t.Context(), pod, metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
				t.Errorf("creating a pod with volume name %q: %v, want Invalid", name, err)
			}
		}
	})

	a := startAgent(t, f, agentOptions{})
	driver := uniqueDriverName()
	createCSIDriver(t, f, driver, false)
	p := startPlugin(t, a, driver, nodeCaps())

	escape := filepath.Join(os.TempDir(), "e2e-escape-"+utilrand.String(8))
	hugeHandle := strings.Repeat("../", 100<<10/3)
	type hostile struct {
		name  string
		claim claim
		// reason and message parts the pod's condition must show.
		reason string
		msg    []string
	}
	cases := []hostile{{
		name: "handle-traversal",
		claim: claim{Handle: "../../../../../../../.." + escape, Attributes: map[string]string{
			"../../../../../../../.." + escape: "../../../../../../../.." + escape, "path": escape + "/../..",
		}},
		reason: status.ReasonNodeStageFailed, msg: []string{"NodeStageVolume failed", "code = NotFound"},
	}, {
		name:   "handle-absolute",
		claim:  claim{Handle: escape},
		reason: status.ReasonNodeStageFailed, msg: []string{"NodeStageVolume failed", "code = NotFound"},
	}, {
		name:   "handle-huge",
		claim:  claim{Handle: hugeHandle},
		reason: status.ReasonNodeStageFailed, msg: []string{"NodeStageVolume failed"},
	}, {
		name: "pv-not-csi",
		claim: claim{PVSource: &corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{
			Path: escape,
		}}},
		reason: status.ReasonInvalidVolumeSpec, msg: []string{"is not a CSI volume"},
	}, {
		name:   "pv-missing",
		claim:  claim{NoPV: true},
		reason: status.ReasonInvalidVolumeSpec, msg: []string{"not found"},
	}, {
		name:   "pvc-pending",
		claim:  claim{Pending: true},
		reason: status.ReasonInvalidVolumeSpec, msg: []string{"is not bound"},
	}, {
		name:   "pv-bound-elsewhere",
		claim:  claim{ForeignClaimRef: true},
		reason: status.ReasonInvalidVolumeSpec, msg: []string{"bound to another claim"},
	}}
	var pods []*corev1.Pod
	for _, tc := range cases {
		c := tc.claim
		c.PVName, c.PVCName, c.Driver = "pv-"+tc.name+"."+f.Namespace, tc.name, driver
		if c.Handle == "" {
			c.Handle = "unused"
		}
		createBoundClaim(t, f, c)
		pods = append(pods, createPod(t, f, tc.name, podVolume{Name: "data", ClaimName: tc.name}))
	}
	// A well-formed pod on the same node, with a PV name full of dots.
	vol := createVolume(t, p, "good", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	goodPV := "pv.good." + f.Namespace
	createBoundClaim(t, f, claim{PVName: goodPV, PVCName: "good", Driver: driver, Handle: vol.ID})
	good := createPod(t, f, "good", podVolume{Name: "data", ClaimName: "good"})

	for i, tc := range cases {
		c := waitReason(t, f, pods[i], tc.reason, append([]string{tc.name}, tc.msg...)...)
		if len(c.Message) > status.MaxMessageLength {
			t.Errorf("%s: condition message is %d bytes, over %d", tc.name, len(c.Message), status.MaxMessageLength)
		}
	}
	waitReady(t, f, good)
	target := publishPaths(a, good, goodPV).Target
	if err := os.WriteFile(filepath.Join(target, "ok"), []byte("ok"), 0o644); err != nil {
		t.Fatalf("writing through the good pod's target: %v", err)
	}
	if _, err := os.Stat(filepath.Join(vol.Path, "ok")); err != nil {
		t.Fatalf("the good pod's target is not its volume: %v", err)
	}

	// Every path the plugin was given lies below the root, and nothing
	// appeared outside it.
	assertPathsBelowRoot(t, a, p)
	entries, err := p.ReadJournal()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases[:3] {
		want := stagingPaths(a, driver, tc.claim.Handle).Path
		stages := filterCalls(plugin.Calls(entries), tc.claim.Handle)
		if len(stages) == 0 {
			t.Errorf("%s: no NodeStageVolume call", tc.name)
		}
		for _, c := range stages {
			if c.Begin.Method != nodeStage || c.Begin.StagingPath != want {
				t.Errorf("%s: %s with staging path %q, want only NodeStageVolume at %q", tc.name, c.Begin.Method, c.Begin.StagingPath, want)
			}
		}
	}
	if exists(escape) {
		t.Errorf("%s was created", escape)
	}
	assertOnlyRoot(t, a)

	// Deleting every pod leaves nothing behind.
	for _, pod := range append(pods, good) {
		deletePod(t, f, pod)
	}
	waitCalls(t, p, vol.ID, "good volume unstaged", hasOK(nodeUnstage, 1))
	eventually(t, "agent holds no volume", func() (bool, error) {
		if s := a.VM.Volumes(); len(s) > 0 {
			return false, fmt.Errorf("agent holds %d volumes, first %s", len(s), truncateName(string(s[0].Name)))
		}
		return true, nil
	})
	waitEmptyDir(t, filepath.Join(a.Root, "pods"))
	waitEmptyDir(t, filepath.Join(a.Root, "plugins", "kubernetes.io", "csi"))
	waitInUse(t, f, "empty", func(got []corev1.UniqueVolumeName) bool { return len(got) == 0 })
	assertOnlyRoot(t, a)
	if exists(escape) {
		t.Errorf("%s was created", escape)
	}
}

// assertPathsBelowRoot checks that every staging and target path the
// plugins were given is clean and lies below the agent's root.
func assertPathsBelowRoot(t *testing.T, a *agent, plugins ...*plugintest.Plugin) {
	t.Helper()
	for _, p := range plugins {
		entries, err := p.ReadJournal()
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range plugin.Calls(entries) {
			for _, path := range []string{c.Begin.StagingPath, c.Begin.TargetPath} {
				if path != "" && (filepath.Clean(path) != path || !strings.HasPrefix(path, a.Root+"/")) {
					t.Errorf("%s got path %q, not below the root %s", c.Begin.Method, path, a.Root)
				}
			}
		}
	}
}

// assertOnlyRoot checks that the agent made nothing next to its root.
func assertOnlyRoot(t *testing.T, a *agent) {
	t.Helper()
	des, err := os.ReadDir(a.Base)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	if !slices.Equal(names, []string{filepath.Base(a.Root)}) {
		t.Errorf("%s holds %q, want only the root %q", a.Base, names, filepath.Base(a.Root))
	}
}

// waitEmptyDir waits until dir is empty or gone.
func waitEmptyDir(t *testing.T, dir string) {
	t.Helper()
	eventually(t, dir+" empty", func() (bool, error) {
		des, err := os.ReadDir(dir)
		if os.IsNotExist(err) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		if len(des) > 0 {
			return false, fmt.Errorf("%s holds %s", dir, des[0].Name())
		}
		return true, nil
	})
}

func truncateName(s string) string {
	if len(s) > 100 {
		return s[:100] + "…"
	}
	return s
}
