package vkubelet_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/node"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
	"github.com/csi-volmgr/csi-volmgr/volumemanager/vkubelet"
)

// steps records what happened, in order, across the fakes.
type steps struct {
	mu  sync.Mutex
	log []string
}

func (s *steps) add(step string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log = append(s.log, step)
}

func (s *steps) get() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.log)
}

// fakeVolumes is a volume manager whose volumes are mounted and unmounted
// when the test closes mounted and unmounted.
type fakeVolumes struct {
	steps              *steps
	mounted, unmounted chan struct{}
	// waitingForUnmount is closed when WaitForUnmount is called.
	waitingForUnmount chan struct{}
}

func (f *fakeVolumes) WaitForAttachAndMount(ctx context.Context, pod *corev1.Pod) error {
	select {
	case <-f.mounted:
		f.steps.add("mounted")
		return nil
	case <-ctx.Done():
		return &volumemanager.VolumesNotReadyError{Pod: pod.Name, Reason: status.ReasonWaitingForAttach, Err: ctx.Err()}
	}
}

func (f *fakeVolumes) GetMountedVolumesForPod(types.UID) map[string]volumemanager.MountedVolume {
	return map[string]volumemanager.MountedVolume{"data": {
		Name: "data", HostPath: "/host/data", SELinuxContext: dataContext, SupplementalGroup: ptr.To[int64](dataGroup),
	}}
}

// The SELinux context and the group of the fake's volume data.
const (
	dataContext = "system_u:object_r:container_file_t:s0:c1,c2"
	dataGroup   = 2345
)

func (f *fakeVolumes) GetExtraSupplementalGroupsForPod(*corev1.Pod) []int64 {
	return []int64{dataGroup}
}

func (f *fakeVolumes) ContainersStopped(types.UID) { f.steps.add("containers stopped") }

func (f *fakeVolumes) BeginRunningPods() func([]types.UID) {
	return func(uids []types.UID) { f.steps.add(fmt.Sprintf("running pods %v", uids)) }
}

func (f *fakeVolumes) WaitForUnmount(ctx context.Context, _ *corev1.Pod) error {
	close(f.waitingForUnmount)
	select {
	case <-f.unmounted:
		f.steps.add("unmounted")
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *fakeVolumes) PodVolumes(uid types.UID) (volumemanager.PodVolumes, bool) {
	return volumemanager.PodVolumes{UID: uid, State: volumemanager.PodVolumesReady}, true
}

// fakeProvider reports the terminal status from within DeletePod, as a
// provider whose containers stop at once does.
type fakeProvider struct {
	steps   *steps
	notify  func(*corev1.Pod)
	volumes map[string]volumemanager.MountedVolume
	groups  []int64
}

func (p *fakeProvider) CreatePod(ctx context.Context, pod *corev1.Pod) error {
	p.volumes, _ = vkubelet.MountedVolumes(ctx)
	p.groups = vkubelet.ExtraSupplementalGroups(ctx)
	p.steps.add("provider create")
	running := pod.DeepCopy()
	running.Status.Phase = corev1.PodRunning
	p.notify(running)
	return nil
}

func (p *fakeProvider) UpdatePod(context.Context, *corev1.Pod) error { return nil }

func (p *fakeProvider) DeletePod(_ context.Context, pod *corev1.Pod) error {
	p.steps.add("provider delete")
	done := pod.DeepCopy()
	done.Status.Phase = corev1.PodSucceeded
	p.notify(done)
	return nil
}

func (p *fakeProvider) GetPod(context.Context, string, string) (*corev1.Pod, error) {
	return nil, errors.New("not used")
}

func (p *fakeProvider) GetPodStatus(context.Context, string, string) (*corev1.PodStatus, error) {
	return nil, errors.New("not used")
}

func (p *fakeProvider) GetPods(context.Context) ([]*corev1.Pod, error) { return nil, nil }

func (p *fakeProvider) NotifyPods(_ context.Context, cb func(*corev1.Pod)) { p.notify = cb }

func TestPodHandlerOrdersTheRuntimeAndTheVolumes(t *testing.T) {
	s := &steps{}
	vols := &fakeVolumes{steps: s, mounted: make(chan struct{}), unmounted: make(chan struct{}), waitingForUnmount: make(chan struct{})}
	prov := &fakeProvider{steps: s}
	h, err := vkubelet.NewPodHandler(prov, vkubelet.Config{Volumes: vols})
	if err != nil {
		t.Fatal(err)
	}
	notifier, ok := h.(node.PodNotifier)
	if !ok {
		t.Fatal("the handler of a notifying provider does not notify")
	}
	reported := make(chan *corev1.Pod, 4)
	notifier.NotifyPods(t.Context(), func(p *corev1.Pod) { s.add("status " + string(p.Status.Phase)); reported <- p })
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "u1"}}

	created := make(chan error, 1)
	go func() { created <- h.CreatePod(t.Context(), pod) }()
	close(vols.mounted)
	if err := <-created; err != nil {
		t.Fatal(err)
	}
	if data := prov.volumes["data"]; data.HostPath != "/host/data" || data.SELinuxContext != dataContext ||
		data.SupplementalGroup == nil || *data.SupplementalGroup != dataGroup {
		t.Errorf("the provider's CreatePod got volumes %+v, want data at /host/data with context %s and group %d", prov.volumes, dataContext, dataGroup)
	}
	if !slices.Equal(prov.groups, []int64{dataGroup}) {
		t.Errorf("the provider's CreatePod got extra supplemental groups %v, want [%d]", prov.groups, dataGroup)
	}
	if p := <-reported; !hasVolumesReady(p) {
		t.Errorf("running status conditions %v: want %s=True (the pod controller replaces the whole status)", p.Status.Conditions, status.ConditionVolumesReady)
	}

	deleted := make(chan error, 1)
	go func() { deleted <- h.DeletePod(t.Context(), pod) }()
	// The provider reported the terminal status from its DeletePod; it
	// waits while the volumes are being unmounted.
	<-vols.waitingForUnmount
	select {
	case p := <-reported:
		t.Fatalf("terminal status %s reported before the unmount; steps %v", p.Status.Phase, s.get())
	default:
	}
	close(vols.unmounted)
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
	if p := <-reported; p.Status.Phase != corev1.PodSucceeded {
		t.Errorf("reported %s after the unmount, want the provider's terminal status", p.Status.Phase)
	}
	want := []string{"mounted", "provider create", "status Running", "provider delete", "containers stopped", "running pods []", "unmounted", "status Succeeded"}
	if got := s.get(); !slices.Equal(got, want) {
		t.Errorf("steps %v, want %v", got, want)
	}
}

func hasVolumesReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == status.ConditionVolumesReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

func TestCreatePodFailsWithTheReasonWhenTheVolumesDoNotCome(t *testing.T) {
	s := &steps{}
	vols := &fakeVolumes{steps: s, mounted: make(chan struct{}), unmounted: make(chan struct{}), waitingForUnmount: make(chan struct{})}
	h, err := vkubelet.NewPodHandler(&fakeProvider{steps: s}, vkubelet.Config{Volumes: vols, MountTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	err = h.CreatePod(t.Context(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", UID: "u2"}})
	if nr, ok := errors.AsType[*volumemanager.VolumesNotReadyError](err); !ok || nr.Reason != status.ReasonWaitingForAttach {
		t.Errorf("CreatePod = %v, want a VolumesNotReadyError with the reason", err)
	}
	if got := s.get(); len(got) != 0 {
		t.Errorf("steps %v: the provider ran a pod whose volumes were not there", got)
	}
}
