package asw_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

var (
	vol1 = volume.PersistentName("d.example.com", "h1")
	id1  = volume.ID{Driver: "d.example.com", Handle: "h1", PVName: "pv-1", AccessType: volume.Filesystem}
	t0   = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
)

func newWorld() *asw.World {
	return asw.New(asw.Options{Now: func() time.Time { return t0 }})
}

func staged(w *asw.World, name volume.Name, id volume.ID) {
	w.RecordAttach(name, id, map[string]string{"devicePath": "/dev/x"}, nil)
	w.RecordStage(name, id, asw.StageOutcome{Step: volume.StepStage, State: volume.Staged, StagingPath: "/s/" + string(name)})
}

func publish(w *asw.World, key volume.PodKey, id volume.ID, state volume.PublishState) {
	w.RecordPublish(key, id, asw.PublishOutcome{Step: volume.StepPublish, State: state, TargetPath: "/t/" + string(key.Pod)})
}

func TestLifecycleOfOneVolume(t *testing.T) {
	w := newWorld()
	if _, ok := w.Volume(vol1); ok {
		t.Fatal("an empty world knows vol1")
	}
	attachErr := fmt.Errorf("%w: VolumeAttachment csi-x", volume.ErrNotAttached)
	w.RecordAttach(vol1, id1, nil, attachErr)
	v, ok := w.Volume(vol1)
	if !ok || v.Attached || v.LastError == nil || v.LastError.Step != volume.StepWaitForAttach ||
		!errors.Is(v.LastError.Err, volume.ErrNotAttached) || !v.LastError.Time.Equal(t0) {
		t.Fatalf("after a failed attach: %+v", v)
	}

	pc := map[string]string{"devicePath": "/dev/x"}
	w.RecordAttach(vol1, id1, pc, nil)
	pc["devicePath"] = "mutated by the caller"
	v, _ = w.Volume(vol1)
	if !v.Attached || v.PublishContext["devicePath"] != "/dev/x" || v.LastError != nil || v.Driver != "d.example.com" {
		t.Fatalf("after attach: %+v", v)
	}

	w.RecordStage(vol1, id1, asw.StageOutcome{Step: volume.StepStage, State: volume.StageUncertain, StagingPath: "/s", Err: errors.New("deadline")})
	v, _ = w.Volume(vol1)
	if v.Stage != volume.StageUncertain || v.StagingPath != "/s" || v.LastError == nil || v.LastError.Step != volume.StepStage {
		t.Fatalf("after an uncertain stage: %+v", v)
	}
	// A later successful attach does not hide the stage error.
	w.RecordAttach(vol1, id1, nil, nil)
	if v, _ = w.Volume(vol1); v.LastError == nil {
		t.Fatal("attach success cleared the stage error")
	}
	w.RecordStage(vol1, id1, asw.StageOutcome{Step: volume.StepStage, State: volume.Staged, StagingPath: "/s"})
	if v, _ = w.Volume(vol1); v.Stage != volume.Staged || v.LastError != nil {
		t.Fatalf("after stage: %+v", v)
	}

	key := volume.PodKey{Volume: vol1, Pod: "pod-a"}
	publish(w, key, id1, volume.PublishUncertain)
	if published(w, key) {
		t.Error("an uncertain publish counts as ready")
	}
	publish(w, key, id1, volume.Published)
	if !published(w, key) {
		t.Error("a published volume is not ready")
	}
	if p, ok := w.Pod(key); !ok || p.TargetPath != "/t/pod-a" || p.State != volume.Published {
		t.Errorf("Pod = %+v, %v", p, ok)
	}

	w.ForgetPod(key)
	if _, ok := w.Pod(key); ok || len(w.PodVolumes("pod-a")) != 0 {
		t.Error("ForgetPod left the pod behind")
	}
	w.ForgetVolume(vol1)
	if _, ok := w.Volume(vol1); ok || len(w.VolumeNames()) != 0 {
		t.Error("ForgetVolume left the volume behind")
	}
}

// TestMayUnstage is the table test of the unstage rule.
func TestMayUnstage(t *testing.T) {
	for _, tc := range []struct {
		name    string
		pods    map[types.UID]volume.PublishState
		unknown bool
		blocked []types.UID
	}{
		{name: "unknown volume", unknown: true},
		{name: "no pods"},
		{name: "one published", pods: map[types.UID]volume.PublishState{"a": volume.Published}, blocked: []types.UID{"a"}},
		{name: "one uncertain", pods: map[types.UID]volume.PublishState{"a": volume.PublishUncertain}, blocked: []types.UID{"a"}},
		{name: "failed publish kept for its error", pods: map[types.UID]volume.PublishState{"a": volume.NotPublished}},
		{name: "mixed", pods: map[types.UID]volume.PublishState{
			"a": volume.NotPublished, "b": volume.PublishUncertain, "c": volume.Published,
		}, blocked: []types.UID{"b", "c"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld()
			if !tc.unknown {
				staged(w, vol1, id1)
			}
			for uid, state := range tc.pods {
				publish(w, volume.PodKey{Volume: vol1, Pod: uid}, id1, state)
			}
			err := w.MayUnstage(vol1)
			if got := w.Publishers(vol1); !slices.Equal(got, tc.blocked) {
				t.Errorf("Publishers = %v, want %v", got, tc.blocked)
			}
			if len(tc.blocked) == 0 {
				if err != nil {
					t.Errorf("MayUnstage = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, volume.ErrInUse) {
				t.Fatalf("MayUnstage = %v, want ErrInUse", err)
			}
			for _, uid := range tc.blocked {
				if !strings.Contains(err.Error(), string(uid)) {
					t.Errorf("MayUnstage error %q does not name pod %s", err, uid)
				}
			}
		})
	}
}

func TestMayUnstageNamesAFewPods(t *testing.T) {
	w := newWorld()
	staged(w, vol1, id1)
	for i := range 12 {
		publish(w, volume.PodKey{Volume: vol1, Pod: types.UID(fmt.Sprintf("pod-%02d", i))}, id1, volume.Published)
	}
	err := w.MayUnstage(vol1)
	if err == nil || !strings.Contains(err.Error(), "and 7 more") || strings.Contains(err.Error(), "pod-11") {
		t.Errorf("MayUnstage = %v, want 5 pods named and 7 more", err)
	}
}

func TestReconstructedStatesStayUntilProven(t *testing.T) {
	w := newWorld()
	key := volume.PodKey{Volume: vol1, Pod: "pod-a"}
	w.AddReconstructedPod(key, id1, "/t/pod-a")
	v, ok := w.Volume(vol1)
	if !ok || v.Stage != volume.StageUncertain || !v.Reconstructed || v.Attached {
		t.Fatalf("reconstructed volume = %+v", v)
	}
	p, _ := w.Pod(key)
	if p.State != volume.PublishUncertain || !p.Reconstructed || p.TargetPath != "/t/pod-a" {
		t.Fatalf("reconstructed pod = %+v", p)
	}
	if published(w, key) || w.MayUnstage(vol1) == nil {
		t.Error("a reconstructed publish is ready or does not block unstage")
	}
	// A second reconstruction (e.g. from the staged record) keeps what is known.
	w.AddReconstructedVolume(vol1, id1, "/s")
	if v, _ := w.Volume(vol1); v.StagingPath != "" {
		t.Errorf("AddReconstructedVolume changed an existing entry: %+v", v)
	}
	// A failed step keeps the mark; success clears it.
	w.RecordStage(vol1, id1, asw.StageOutcome{Step: volume.StepStage, State: volume.StageUncertain, Err: errors.New("final")})
	if v, _ := w.Volume(vol1); !v.Reconstructed {
		t.Error("a failed stage cleared the reconstructed mark")
	}
	w.RecordStage(vol1, id1, asw.StageOutcome{Step: volume.StepStage, State: volume.Staged, StagingPath: "/s"})
	publish(w, key, id1, volume.Published)
	v, _ = w.Volume(vol1)
	p, _ = w.Pod(key)
	if v.Reconstructed || p.Reconstructed {
		t.Errorf("proven states still marked reconstructed: %+v %+v", v, p)
	}

	other := volume.PersistentName("d", "h2")
	w.AddReconstructedVolume(other, volume.ID{Driver: "d", Handle: "h2", AccessType: volume.Filesystem}, "/s2")
	if v, _ := w.Volume(other); v.Stage != volume.StageUncertain || !v.Reconstructed || v.StagingPath != "/s2" {
		t.Errorf("AddReconstructedVolume = %+v", v)
	}
}

func TestPodIndexAndInUse(t *testing.T) {
	w := newWorld()
	inline := volume.InlineName("pod-a", "scratch")
	inlineID := volume.ID{Driver: "d", Handle: volume.InlineHandle("pod-a", "scratch"), AccessType: volume.Filesystem}
	vol2 := volume.PersistentName("d", "h2")
	id2 := volume.ID{Driver: "d", Handle: "h2", PVName: "pv-2", AccessType: volume.Filesystem}
	staged(w, vol1, id1)
	staged(w, vol2, id2)
	publish(w, volume.PodKey{Volume: vol1, Pod: "pod-a"}, id1, volume.Published)
	publish(w, volume.PodKey{Volume: vol2, Pod: "pod-a"}, id2, volume.NotPublished)
	publish(w, volume.PodKey{Volume: inline, Pod: "pod-a"}, inlineID, volume.Published)
	publish(w, volume.PodKey{Volume: vol1, Pod: "pod-b"}, id1, volume.PublishUncertain)

	var names []volume.Name
	for _, p := range w.PodVolumes("pod-a") {
		names = append(names, p.Key.Volume)
	}
	if want := []volume.Name{vol1, vol2, inline}; !slices.Equal(names, slices.Sorted(slices.Values(want))) {
		t.Errorf("PodVolumes(pod-a) = %v, want %v", names, want)
	}
	if got := w.VolumesInUse(); !slices.Equal(got, []volume.Name{vol1, vol2}) {
		t.Errorf("VolumesInUse = %v, want the two PV volumes", got)
	}

	w.ForgetVolume(vol1)
	if got := w.PodVolumes("pod-b"); len(got) != 0 {
		t.Errorf("ForgetVolume left pod-b's entry in the pod index: %v", got)
	}
	if got := w.PodVolumes("pod-a"); len(got) != 2 {
		t.Errorf("PodVolumes(pod-a) after ForgetVolume(vol1) = %v, want 2 entries", got)
	}
}

func TestSnapshotIsACopy(t *testing.T) {
	w := newWorld()
	staged(w, vol1, id1)
	publish(w, volume.PodKey{Volume: vol1, Pod: "pod-b"}, id1, volume.Published)
	w.RecordPublish(volume.PodKey{Volume: vol1, Pod: "pod-a"}, id1,
		asw.PublishOutcome{Step: volume.StepPublish, State: volume.NotPublished, Err: errors.New("permission denied")})

	snap := w.Snapshot()
	if len(snap) != 1 || len(snap[0].Pods) != 2 || snap[0].Pods[0].Key.Pod != "pod-a" || snap[0].Pods[1].Key.Pod != "pod-b" {
		t.Fatalf("Snapshot = %+v", snap)
	}
	if e := snap[0].Pods[0].LastError; e == nil || e.Err.Error() != "permission denied" || e.Step != volume.StepPublish || !e.Time.Equal(t0) {
		t.Errorf("pod-a's last error = %+v", e)
	}
	snap[0].PublishContext["devicePath"] = "changed"
	snap[0].Pods[0].LastError.Step = "changed"
	v, _ := w.Volume(vol1)
	p, _ := w.Pod(volume.PodKey{Volume: vol1, Pod: "pod-a"})
	if v.PublishContext["devicePath"] != "/dev/x" || p.LastError.Step != volume.StepPublish {
		t.Error("changing the snapshot changed the world")
	}
}

// TestConcurrentUse records and queries from many goroutines; run with -race.
func TestConcurrentUse(t *testing.T) {
	w := asw.New(asw.Options{})
	const volumes, pods = 8, 16
	var wg sync.WaitGroup
	for i := range volumes {
		name := volume.PersistentName("d", fmt.Sprint(i))
		id := volume.ID{Driver: "d", Handle: fmt.Sprint(i), AccessType: volume.Filesystem}
		staged(w, name, id)
		for j := range pods {
			key := volume.PodKey{Volume: name, Pod: types.UID(fmt.Sprint(j))}
			wg.Go(func() {
				for range 20 {
					publish(w, key, id, volume.Published)
					_ = published(w, key)
					_ = w.MayUnstage(name)
					_ = w.PodVolumes(key.Pod)
					_ = w.Snapshot()
					_ = w.VolumesInUse()
					w.ForgetPod(key)
				}
				publish(w, key, id, volume.Published)
			})
		}
	}
	wg.Wait()
	for j := range pods {
		if got := len(w.PodVolumes(types.UID(fmt.Sprint(j)))); got != volumes {
			t.Errorf("pod %d has %d volumes, want %d", j, got, volumes)
		}
	}
	for _, vs := range w.Snapshot() {
		if len(vs.Pods) != pods {
			t.Errorf("volume %s has %d pods, want %d", vs.Name, len(vs.Pods), pods)
		}
	}
}

// published says whether pod's use of the volume is ready: Published, not
// uncertain.
func published(w *asw.World, key volume.PodKey) bool {
	p, ok := w.Pod(key)
	return ok && p.State == volume.Published
}

func TestProgress(t *testing.T) {
	w := asw.New(asw.Options{})
	key := volume.PodKey{Volume: "v", Pod: "u"}
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	w.RecordProgress(key, volume.ID{Driver: "d"}, nil) // clearing creates nothing
	if _, ok := w.Pod(key); ok {
		t.Fatal("clearing progress created a pod entry")
	}
	p := &asw.Progress{Step: volume.StepApplyAccessControl, FSGroup: 2000, Files: 125000, Started: start, Updated: start.Add(31 * time.Second)}
	w.RecordProgress(key, volume.ID{Driver: "d"}, p)
	got, ok := w.Pod(key)
	if !ok || got.State != volume.NotPublished || got.Progress == nil || *got.Progress != *p {
		t.Fatalf("pod entry = %+v, want NotPublished with the progress", got)
	}
	if s := got.Progress.String(); s != "changing the group of the volume's files to fsGroup 2000: 125000 files in 31s" {
		t.Errorf("String() = %q", s)
	}
	w.RecordPublish(key, volume.ID{Driver: "d"}, asw.PublishOutcome{Step: volume.StepPublish, State: volume.Published})
	if got, _ := w.Pod(key); got.Progress != nil {
		t.Errorf("progress kept after the publish ended: %+v", got.Progress)
	}
}
