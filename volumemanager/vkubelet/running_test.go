package vkubelet_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	"github.com/csi-volmgr/csi-volmgr/volumemanager/vkubelet"
)

// listingProvider is a provider whose GetPods lists pods, or fails.
type listingProvider struct {
	fakeProvider
	mu   sync.Mutex
	pods []*corev1.Pod
	err  error
}

func (p *listingProvider) GetPods(context.Context) ([]*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pods, p.err
}

// reports records the running-pods reports, and how many were begun
// before their list was taken.
type reports struct {
	mu    sync.Mutex
	got   [][]types.UID
	begun int
	ch    chan struct{}
}

func (r *reports) BeginRunningPods() func([]types.UID) {
	r.mu.Lock()
	r.begun++
	r.mu.Unlock()
	return func(uids []types.UID) {
		r.mu.Lock()
		r.got = append(r.got, slices.Clone(uids))
		r.mu.Unlock()
		r.ch <- struct{}{}
	}
}

func TestReportRunningPodsLeavesOutPodsThatAreDone(t *testing.T) {
	pod := func(uid types.UID, phase corev1.PodPhase) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: uid}, Status: corev1.PodStatus{Phase: phase}}
	}
	exited := pod("exited", corev1.PodRunning)
	exited.Status.ContainerStatuses = []corev1.ContainerStatus{{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{}}}}
	prov := &listingProvider{pods: []*corev1.Pod{pod("running", corev1.PodRunning), pod("starting", ""), pod("done", corev1.PodSucceeded), exited}}
	r := &reports{ch: make(chan struct{}, 16)}
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { vkubelet.ReportRunningPods(ctx, prov, r, 10*time.Millisecond); close(done) }()
	<-r.ch
	<-r.ch // periodic
	// A provider that cannot list its pods: no report (its pods stay held).
	prov.mu.Lock()
	prov.err = errors.New("boom")
	prov.mu.Unlock()
	time.Sleep(50 * time.Millisecond)
	cancel()
	<-done
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, got := range r.got {
		if want := []types.UID{"running", "starting"}; !slices.Equal(got, want) {
			t.Errorf("reported %v, want %v", got, want)
		}
	}
	// Drained: at most one report was on its way when the error was set.
	if n := len(r.ch); n > 1 {
		t.Errorf("%d reports while the provider could not list its pods", n)
	}
}
