package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/volumemanager"
	"github.com/csi-volmgr/csi-volmgr/volumemanager/vkubelet"
)

// TestMain lets the test binary be the sandbox helper too: the provider
// re-executes os.Executable() with the sandbox subcommand, as the runtime
// does with its own binary.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == sandboxCommand {
		if err := runSandbox(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(127)
		}
		return
	}
	os.Exit(m.Run())
}

// volumes stands for the volume manager: the pod's volumes are mounted
// at fixed host directories; it records the runtime's calls.
type volumes struct {
	mounted map[string]volumemanager.MountedVolume
	groups  []int64

	mu      sync.Mutex
	stopped []types.UID
}

func (v *volumes) WaitForAttachAndMount(context.Context, *corev1.Pod) error { return nil }
func (v *volumes) GetMountedVolumesForPod(types.UID) map[string]volumemanager.MountedVolume {
	return v.mounted
}
func (v *volumes) GetExtraSupplementalGroupsForPod(*corev1.Pod) []int64 { return v.groups }
func (v *volumes) ContainersStopped(uid types.UID) {
	v.mu.Lock()
	v.stopped = append(v.stopped, uid)
	v.mu.Unlock()
}
func (v *volumes) BeginRunningPods() func([]types.UID)               { return func([]types.UID) {} }
func (v *volumes) WaitForUnmount(context.Context, *corev1.Pod) error { return nil }
func (v *volumes) PodVolumes(types.UID) (volumemanager.PodVolumes, bool) {
	return volumemanager.PodVolumes{}, false
}

// TestContainerRunsWithItsVolumesAndIdentity runs a real container
// process through the sandbox: it sees its writable volume at its
// mountPath, its read-only volume read-only, and runs as the user and
// group of its security context with the pod's supplemental groups, its
// fsGroup and the groups its volumes ask for. Deleting the pod stops the
// process before the volume manager hears that the containers stopped.
func TestContainerRunsWithItsVolumesAndIdentity(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the sandbox makes a mount namespace and changes user")
	}
	data, ro, state := t.TempDir(), t.TempDir(), t.TempDir()
	if err := os.Chmod(data, 0o777); err != nil { //nolint:gosec // the container's user (1000) writes there
		t.Fatal(err)
	}
	vm := &volumes{
		mounted: map[string]volumemanager.MountedVolume{
			"data": {Name: "data", HostPath: data},
			"ro":   {Name: "ro", HostPath: ro, ReadOnly: true},
		},
		groups: []int64{2345},
	}
	procs, err := newProcessProvider(options{stateDir: state, hostRoot: "/", nodeName: "vk"})
	if err != nil {
		t.Fatal(err)
	}
	statuses := make(chan *corev1.Pod, 16)
	procs.NotifyPods(t.Context(), func(p *corev1.Pod) { statuses <- p })
	handler, err := vkubelet.NewPodHandler(procs, vkubelet.Config{Volumes: vm})
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: "ns", UID: "u1"},
		Spec: corev1.PodSpec{
			SecurityContext: &corev1.PodSecurityContext{
				RunAsUser: ptr.To[int64](1000), RunAsGroup: ptr.To[int64](3000),
				SupplementalGroups: []int64{100}, FSGroup: ptr.To[int64](200),
			},
			Containers: []corev1.Container{{
				Name: "c",
				Command: []string{"sh", "-c", "{ id -u; id -g; id -G; } > /data/id.tmp; " +
					"if touch /ro/x 2>/dev/null; then echo writable; else echo read-only; fi > /data/ro.tmp; " +
					"mv /data/ro.tmp /data/ro; mv /data/id.tmp /data/id; exec sleep 3600"},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}, {Name: "ro", MountPath: "/ro"}},
			}},
		},
	}
	cleanupCtx := context.WithoutCancel(t.Context()) // t.Context() ends before the cleanups run
	t.Cleanup(func() { procs.stopEverything(cleanupCtx) })
	if err := handler.CreatePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	if p := <-statuses; p.Status.Phase != corev1.PodRunning {
		t.Errorf("status after CreatePod: phase %s, want Running", p.Status.Phase)
	}

	read := func(name string) string {
		var out []byte
		err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			var err error
			out, err = os.ReadFile(filepath.Join(data, name))
			return err == nil, nil
		})
		if err != nil {
			log, _ := os.ReadFile(filepath.Join(state, "u1", "c", "log"))
			t.Fatalf("the container wrote no %s: %v; its log:\n%s", name, err, log)
		}
		return strings.TrimSpace(string(out))
	}
	if got := read("ro"); got != "read-only" {
		t.Errorf("the container's read-only volume is %s", got)
	}
	if _, err := os.Stat(filepath.Join(ro, "x")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the container wrote into its read-only volume: %v", err)
	}
	id := strings.Split(read("id"), "\n")
	if len(id) != 3 || id[0] != "1000" || id[1] != "3000" {
		t.Fatalf("the container's id -u, -g, -G: %q, want 1000, 3000 and its groups", id)
	}
	groups := strings.Fields(id[2])
	for _, g := range []string{"3000", "100", "200", "2345"} {
		if !slices.Contains(groups, g) {
			t.Errorf("the container's groups %v: want %s among them", groups, g)
		}
	}
	if slices.Contains(groups, "0") {
		t.Errorf("the container's groups %v: root's group 0 must be dropped", groups)
	}

	// The stats summary lists the pod and its running container.
	summary, err := procs.GetStatsSummary(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(summary.Pods) != 1 || summary.Pods[0].PodRef.UID != "u1" || len(summary.Pods[0].Containers) != 1 ||
		summary.Pods[0].Containers[0].Name != "c" || summary.Node.NodeName != "vk" {
		t.Errorf("stats summary %+v: want node vk with pod u1 and its container c", summary)
	}

	// Deleting stops the process first, then tells the volume manager.
	procs.mu.Lock()
	proc := procs.pods["u1"].procs["c"]
	procs.mu.Unlock()
	deleting := pod.DeepCopy()
	deleting.DeletionGracePeriodSeconds = ptr.To[int64](5)
	if err := handler.DeletePod(t.Context(), deleting); err != nil {
		t.Fatal(err)
	}
	if !proc.exited() {
		t.Error("DeletePod returned while the container's process runs")
	}
	vm.mu.Lock()
	stopped := slices.Clone(vm.stopped)
	vm.mu.Unlock()
	if !slices.Equal(stopped, []types.UID{"u1"}) {
		t.Errorf("ContainersStopped calls %v, want [u1]", stopped)
	}
	if _, err := os.Stat(filepath.Join(state, "u1")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the pod's state directory is left: %v", err)
	}
}

// TestContainerNeedsACommand: the example runtime has no images.
func TestContainerNeedsACommand(t *testing.T) {
	procs, err := newProcessProvider(options{stateDir: t.TempDir(), hostRoot: "/"})
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: "ns", UID: "u1"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}
	err = procs.CreatePod(t.Context(), pod)
	if err == nil || !strings.Contains(err.Error(), "command is required") {
		t.Errorf("CreatePod of a container without command = %v, want command is required", err)
	}
}
