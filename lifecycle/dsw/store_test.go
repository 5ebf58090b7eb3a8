package dsw_test

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// recorder is a Handler that records every key it is told about.
type recorder struct {
	mu         sync.Mutex
	volumes    []volume.Name
	podVolumes []volume.PodKey
	pods       []types.UID
}

func (r *recorder) handler() dsw.Handler {
	return dsw.Handler{
		Volume: func(n volume.Name) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.volumes = append(r.volumes, n)
		},
		PodVolume: func(k volume.PodKey) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.podVolumes = append(r.podVolumes, k)
		},
		Pod: func(uid types.UID) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.pods = append(r.pods, uid)
		},
	}
}

// take returns and clears what was recorded, sorted.
func (r *recorder) take() (vols []volume.Name, uses []volume.PodKey, pods []types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	vols, uses, pods = r.volumes, r.podVolumes, r.pods
	r.volumes, r.podVolumes, r.pods = nil, nil, nil
	slices.Sort(vols)
	slices.SortFunc(uses, func(a, b volume.PodKey) int {
		if a.Volume != b.Volume {
			if a.Volume < b.Volume {
				return -1
			}
			return 1
		}
		if a.Pod < b.Pod {
			return -1
		}
		if a.Pod > b.Pod {
			return 1
		}
		return 0
	})
	slices.Sort(pods)
	return vols, uses, pods
}

func podInfo(uid string) volume.PodInfo {
	return volume.PodInfo{UID: types.UID(uid), Namespace: "ns", Name: "pod-" + uid, ServiceAccount: "default"}
}

func pvSource(driver, handle, pv string) volume.Source {
	return volume.Source{
		ID:          volume.ID{Driver: driver, Handle: handle, PVName: pv, AccessType: volume.Filesystem},
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		Attributes:  map[string]string{"k": "v"},
	}
}

func use(uid, spec string, src volume.Source) dsw.Use {
	return dsw.Use{
		Name:   volume.PersistentName(src.Driver, src.Handle),
		Source: src,
		Volume: volume.PodVolume{Pod: podInfo(uid), SpecName: spec},
	}
}

func nameOf(src volume.Source) volume.Name {
	return volume.PersistentName(src.Driver, src.Handle)
}

func key(src volume.Source, uid string) volume.PodKey {
	return volume.PodKey{Volume: volume.PersistentName(src.Driver, src.Handle), Pod: types.UID(uid)}
}

func TestSetPodAndQueries(t *testing.T) {
	s := dsw.New()
	rec := &recorder{}
	s.Subscribe(rec.handler())

	a := pvSource("d", "h1", "pv1")
	b := pvSource("d", "h2", "pv2")
	seen := time.Unix(100, 0)
	s.SetPod(dsw.Pod{
		Info:      podInfo("p1"),
		FirstSeen: seen,
		Uses:      []dsw.Use{use("p1", "data", a), use("p1", "logs", b)},
		Errors:    []dsw.VolumeError{{SpecName: "z", Err: errors.New(`PVC "ns/z" is not bound`)}},
	})
	s.SetPod(dsw.Pod{Info: podInfo("p2"), Uses: []dsw.Use{use("p2", "data", a)}})
	s.SetPod(dsw.Pod{Info: podInfo("p3")}) // known, wants nothing

	vols, uses, pods := rec.take()
	if diff := cmp.Diff([]volume.Name{nameOf(a), nameOf(b)}, vols); diff != "" {
		t.Errorf("volume events (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]volume.PodKey{key(a, "p1"), key(a, "p2"), key(b, "p1")}, uses); diff != "" {
		t.Errorf("use events (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]types.UID{"p1", "p2", "p3"}, pods); diff != "" {
		t.Errorf("pod events (-want +got):\n%s", diff)
	}

	if !s.HasPod("p3") || s.HasPod("p4") {
		t.Errorf("HasPod(p3), HasPod(p4) = %v, %v; want true, false", s.HasPod("p3"), s.HasPod("p4"))
	}
	if p3, ok := s.Pod("p3"); !ok || len(p3.Uses) != 0 {
		t.Errorf("Pod(p3) = %+v, %v; want a pod without uses", p3, ok)
	}
	if got := s.VolumePods(nameOf(a)); !slices.Equal(got, []types.UID{"p1", "p2"}) {
		t.Errorf("VolumePods(a) = %v, want [p1 p2]", got)
	}
	if !s.IsVolumeWanted(nameOf(b)) || s.IsVolumeWanted("kubernetes.io/csi/d^nope") {
		t.Error("IsVolumeWanted is wrong")
	}
	if src, ok := s.Volume(nameOf(a)); !ok || !src.Equal(a) {
		t.Errorf("Volume(a) = %+v, %v; want %+v", src, ok, a)
	}
	u, ok := s.PodVolume(key(a, "p2"))
	if !ok || u.Volume.SpecName != "data" || u.Volume.Pod != podInfo("p2") {
		t.Errorf("PodVolume(a@p2) = %+v, %v", u, ok)
	}
	p1, ok := s.Pod("p1")
	if !ok || !p1.FirstSeen.Equal(seen) || len(p1.Uses) != 2 || p1.Uses[0].Volume.SpecName != "data" {
		t.Errorf("Pod(p1) = %+v, %v", p1, ok)
	}
	if errs := s.PodErrors("p1"); len(errs) != 1 || errs[0].Error() != `volume "z": PVC "ns/z" is not bound` {
		t.Errorf("PodErrors(p1) = %v", errs)
	}
	want := dsw.Counts{Pods: 3, Volumes: 2, PodVolumes: 3, PodVolumesByDriver: map[string]int{"d": 3}}
	if diff := cmp.Diff(want, s.Counts()); diff != "" {
		t.Errorf("Counts (-want +got):\n%s", diff)
	}
}

func TestSetPodDiffs(t *testing.T) {
	a := pvSource("d", "h1", "pv1")
	b := pvSource("d", "h2", "pv2")
	bigger := a
	bigger.CapacityBytes = 2 << 30

	for name, tc := range map[string]struct {
		second                     dsw.Pod
		wantVols                   []volume.Name
		wantUses                   []volume.PodKey
		wantPods                   []types.UID
		wantVolumesAfter           []volume.Name
		wantVolumeSource           *volume.Source
		wantPodErrs, wantFirstSeen int
	}{
		"same state notifies nobody": {
			second:           dsw.Pod{Info: podInfo("p1"), Uses: []dsw.Use{use("p1", "data", a)}},
			wantVolumesAfter: []volume.Name{nameOf(a)},
		},
		"use replaced by another volume": {
			second:           dsw.Pod{Info: podInfo("p1"), Uses: []dsw.Use{use("p1", "data", b)}},
			wantVols:         []volume.Name{nameOf(a), nameOf(b)},
			wantUses:         []volume.PodKey{key(a, "p1"), key(b, "p1")},
			wantPods:         []types.UID{"p1"},
			wantVolumesAfter: []volume.Name{nameOf(b)},
		},
		"source changed": {
			second:           dsw.Pod{Info: podInfo("p1"), Uses: []dsw.Use{use("p1", "data", bigger)}},
			wantVols:         []volume.Name{nameOf(a)},
			wantUses:         []volume.PodKey{key(a, "p1")},
			wantPods:         []types.UID{"p1"},
			wantVolumesAfter: []volume.Name{nameOf(a)},
			wantVolumeSource: &bigger,
		},
		"only errors changed": {
			second: dsw.Pod{Info: podInfo("p1"), Uses: []dsw.Use{use("p1", "data", a)},
				Errors: []dsw.VolumeError{{SpecName: "x", Err: errors.New("boom")}}},
			wantPods:         []types.UID{"p1"},
			wantVolumesAfter: []volume.Name{nameOf(a)},
			wantPodErrs:      1,
		},
		"all uses gone, pod still known": {
			second:           dsw.Pod{Info: podInfo("p1")},
			wantVols:         []volume.Name{nameOf(a)},
			wantUses:         []volume.PodKey{key(a, "p1")},
			wantPods:         []types.UID{"p1"},
			wantVolumesAfter: []volume.Name{},
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := dsw.New()
			rec := &recorder{}
			s.Subscribe(rec.handler())
			s.SetPod(dsw.Pod{Info: podInfo("p1"), FirstSeen: time.Unix(1, 0), Uses: []dsw.Use{use("p1", "data", a)}})
			rec.take()

			tc.second.FirstSeen = time.Unix(2, 0)
			s.SetPod(tc.second)
			vols, uses, pods := rec.take()
			if diff := cmp.Diff(tc.wantVols, vols); diff != "" {
				t.Errorf("volume events (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantUses, uses); diff != "" {
				t.Errorf("use events (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantPods, pods); diff != "" {
				t.Errorf("pod events (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantVolumesAfter, s.Volumes()); diff != "" {
				t.Errorf("Volumes() (-want +got):\n%s", diff)
			}
			if tc.wantVolumeSource != nil {
				if src, _ := s.Volume(nameOf(a)); !src.Equal(*tc.wantVolumeSource) {
					t.Errorf("Volume() = %+v, want %+v", src, *tc.wantVolumeSource)
				}
			}
			if got := len(s.PodErrors("p1")); got != tc.wantPodErrs {
				t.Errorf("len(PodErrors) = %d, want %d", got, tc.wantPodErrs)
			}
			if p, _ := s.Pod("p1"); !p.FirstSeen.Equal(time.Unix(1, 0)) {
				t.Errorf("FirstSeen = %v, want the first SetPod's %v", p.FirstSeen, time.Unix(1, 0))
			}
		})
	}
}

func TestDeletePod(t *testing.T) {
	s := dsw.New()
	rec := &recorder{}
	s.Subscribe(rec.handler())
	a := pvSource("d", "h1", "pv1")
	b := pvSource("d", "h2", "pv2")
	s.SetPod(dsw.Pod{Info: podInfo("p1"), Uses: []dsw.Use{use("p1", "data", a), use("p1", "logs", b)}})
	s.SetPod(dsw.Pod{Info: podInfo("p2"), Uses: []dsw.Use{use("p2", "data", a)}})
	rec.take()

	s.DeletePod("p1")
	vols, uses, pods := rec.take()
	// a is still wanted by p2: only b leaves the desired state.
	if diff := cmp.Diff([]volume.Name{nameOf(b)}, vols); diff != "" {
		t.Errorf("volume events (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]volume.PodKey{key(a, "p1"), key(b, "p1")}, uses); diff != "" {
		t.Errorf("use events (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]types.UID{"p1"}, pods); diff != "" {
		t.Errorf("pod events (-want +got):\n%s", diff)
	}
	if s.HasPod("p1") || !s.IsVolumeWanted(nameOf(a)) || s.IsVolumeWanted(nameOf(b)) {
		t.Errorf("after DeletePod(p1): HasPod(p1)=%v wanted(a)=%v wanted(b)=%v", s.HasPod("p1"),
			s.IsVolumeWanted(nameOf(a)), s.IsVolumeWanted(nameOf(b)))
	}
	if _, ok := s.PodVolume(key(a, "p1")); ok {
		t.Error("PodVolume(a@p1) still present after DeletePod")
	}

	s.DeletePod("p1") // unknown now: nothing happens
	if vols, uses, pods := rec.take(); len(vols)+len(uses)+len(pods) != 0 {
		t.Errorf("DeletePod of an unknown pod notified %v %v %v", vols, uses, pods)
	}
}

// TestSameHandleTwoPVs covers two PersistentVolumes with one driver and
// handle (one volume Name): each pod keeps its own Source for publishing,
// and the volume-level Source follows the pods that remain.
func TestSameHandleTwoPVs(t *testing.T) {
	s := dsw.New()
	rec := &recorder{}
	s.Subscribe(rec.handler())
	pvA := pvSource("d", "h", "pv-a")
	pvB := pvSource("d", "h", "pv-b")
	s.SetPod(dsw.Pod{Info: podInfo("p1"), Uses: []dsw.Use{use("p1", "v", pvA)}})
	s.SetPod(dsw.Pod{Info: podInfo("p2"), Uses: []dsw.Use{use("p2", "v", pvB)}})

	if u, _ := s.PodVolume(key(pvA, "p1")); u.Source.PVName != "pv-a" {
		t.Errorf("p1's use has PV %q, want pv-a", u.Source.PVName)
	}
	if u, _ := s.PodVolume(key(pvB, "p2")); u.Source.PVName != "pv-b" {
		t.Errorf("p2's use has PV %q, want pv-b", u.Source.PVName)
	}
	if src, _ := s.Volume(nameOf(pvA)); src.PVName != "pv-b" {
		t.Errorf("volume-level PV = %q, want the latest, pv-b", src.PVName)
	}
	rec.take()
	s.DeletePod("p2")
	if src, _ := s.Volume(nameOf(pvA)); src.PVName != "pv-a" {
		t.Errorf("volume-level PV after p2 left = %q, want pv-a (p1's)", src.PVName)
	}
	if vols, _, _ := rec.take(); !slices.Equal(vols, []volume.Name{nameOf(pvA)}) {
		t.Errorf("volume events = %v, want the source change of %s", vols, nameOf(pvA))
	}
}

// TestConcurrent runs writers and readers at once; with -race it checks the
// locking, and at the end the state must be exactly the writers' last one.
func TestConcurrent(t *testing.T) {
	s := dsw.New()
	var notified sync.Map
	s.Subscribe(dsw.Handler{
		PodVolume: func(k volume.PodKey) { notified.Store(k, true) },
		Pod:       func(uid types.UID) { _ = s.HasPod(uid) }, // handlers may read the Store
	})
	const pods, rounds = 16, 50
	var wg sync.WaitGroup
	for i := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			uid := fmt.Sprintf("p%02d", i)
			for r := range rounds {
				shared := pvSource("d", "shared", "pv-shared")
				own := pvSource("d", fmt.Sprintf("h%d-%d", i, r%3), "pv-own")
				s.SetPod(dsw.Pod{Info: podInfo(uid), Uses: []dsw.Use{use(uid, "a", shared), use(uid, "b", own)}})
				_ = s.VolumePods(nameOf(shared))
				_ = s.Counts()
				if r%10 == 9 {
					s.DeletePod(types.UID(uid))
				}
			}
		}()
	}
	wg.Wait()

	// Round 49 ended with DeletePod: nobody is left.
	if c := s.Counts(); c.Pods != 0 || c.Volumes != 0 || c.PodVolumes != 0 {
		t.Errorf("Counts after all pods left = %+v, want zeros", c)
	}
	if _, ok := notified.Load(key(pvSource("d", "shared", ""), "p00")); !ok {
		t.Error("no PodVolume notification for shared@p00")
	}
}
