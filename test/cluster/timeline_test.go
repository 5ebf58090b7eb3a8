//go:build e2e

package cluster_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
)

// podTimes are when the test process saw a pod reach each point, from
// watch events (one clock for all).
type podTimes struct {
	created, scheduled, volumesReady, running, deleted time.Time
}

// volumeTimes are when the test saw a PV's VolumeAttachment attached and
// deleted, and the PV's volume leave the Node's volumesInUse.
type volumeTimes struct {
	attached, notInUse, detached time.Time
	// unique is the volume's name in volumesInUse; inUse says the Node
	// listed it.
	unique corev1.UniqueVolumeName
	inUse  bool
}

// timeline watches pods, VolumeAttachments and the Node and records when
// each point was first seen.
type timeline struct {
	mu      sync.Mutex
	pods    map[string]*podTimes    // by pod name
	volumes map[string]*volumeTimes // by PV name
	// inUse is the Node's volumesInUse as last seen.
	inUse []corev1.UniqueVolumeName
}

func watchTimeline(t testing.TB, client kubernetes.Interface, namespace, node string) *timeline {
	t.Helper()
	tl := &timeline{pods: map[string]*podTimes{}, volumes: map[string]*volumeTimes{}}
	ctx := t.Context()
	watches := []struct {
		start func() (watch.Interface, error)
		on    func(watch.Event, time.Time)
	}{
		{func() (watch.Interface, error) {
			return client.CoreV1().Pods(namespace).Watch(ctx, metav1.ListOptions{})
		}, tl.pod},
		{func() (watch.Interface, error) {
			return client.StorageV1().VolumeAttachments().Watch(ctx, metav1.ListOptions{})
		}, tl.attachment},
		{func() (watch.Interface, error) {
			return client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + node})
		}, tl.node},
	}
	for _, w := range watches {
		wi, err := w.start()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(wi.Stop)
		go func() {
			for ev := range wi.ResultChan() {
				w.on(ev, time.Now())
			}
		}()
	}
	return tl
}

func (tl *timeline) podOf(name string) *podTimes {
	p, ok := tl.pods[name]
	if !ok {
		p = &podTimes{}
		tl.pods[name] = p
	}
	return p
}

func (tl *timeline) volumeOf(pv string) *volumeTimes {
	v, ok := tl.volumes[pv]
	if !ok {
		v = &volumeTimes{}
		tl.volumes[pv] = v
	}
	return v
}

func setOnce(t *time.Time, now time.Time) {
	if t.IsZero() {
		*t = now
	}
}

func (tl *timeline) pod(ev watch.Event, now time.Time) {
	pod, ok := ev.Object.(*corev1.Pod)
	if !ok {
		return
	}
	tl.mu.Lock()
	defer tl.mu.Unlock()
	p := tl.podOf(pod.Name)
	if ev.Type == watch.Added {
		setOnce(&p.created, now)
	}
	if ev.Type == watch.Deleted {
		setOnce(&p.deleted, now)
		return
	}
	if pod.Spec.NodeName != "" {
		setOnce(&p.scheduled, now)
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == status.ConditionVolumesReady && c.Status == corev1.ConditionTrue {
			setOnce(&p.volumesReady, now)
		}
	}
	if pod.Status.Phase == corev1.PodRunning {
		setOnce(&p.running, now)
	}
}

func (tl *timeline) attachment(ev watch.Event, now time.Time) {
	va, ok := ev.Object.(*storagev1.VolumeAttachment)
	if !ok || va.Spec.Source.PersistentVolumeName == nil {
		return
	}
	tl.mu.Lock()
	defer tl.mu.Unlock()
	v := tl.volumeOf(*va.Spec.Source.PersistentVolumeName)
	if ev.Type == watch.Deleted {
		setOnce(&v.detached, now)
		return
	}
	if va.Status.Attached {
		setOnce(&v.attached, now)
	}
}

func (tl *timeline) node(ev watch.Event, now time.Time) {
	node, ok := ev.Object.(*corev1.Node)
	if !ok {
		return
	}
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.inUse = slices.Clone(node.Status.VolumesInUse)
	for _, v := range tl.volumes {
		if v.unique == "" {
			continue
		}
		if slices.Contains(node.Status.VolumesInUse, v.unique) {
			v.inUse, v.notInUse = true, time.Time{}
		} else if v.inUse && v.notInUse.IsZero() {
			v.notInUse = now
		}
	}
}

// track records the volumesInUse name of a PV's volume.
func (tl *timeline) track(pv string, unique corev1.UniqueVolumeName) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.volumeOf(pv).unique = unique
}

// snapshot returns copies of the recorded times.
func (tl *timeline) snapshot() (map[string]podTimes, map[string]volumeTimes) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	pods := make(map[string]podTimes, len(tl.pods))
	for k, v := range tl.pods {
		pods[k] = *v
	}
	vols := make(map[string]volumeTimes, len(tl.volumes))
	for k, v := range tl.volumes {
		vols[k] = *v
	}
	return pods, vols
}
