package populator_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// TestHostileInput feeds names an API server would reject (a standalone
// manifest or a fake client has no validation), huge handles and missing
// fields. Nothing panics; names are carried as data for lifecycle/paths to
// validate; missing fields become per-pod reasons.
func TestHostileInput(t *testing.T) {
	ctx := testContext(t)
	huge := strings.Repeat("h", 200<<10) // 200 KiB handle
	dotdot := "../../../etc"
	objs := []runtime.Object{
		csiDriver(driver, false, storagev1.VolumeLifecyclePersistent, storagev1.VolumeLifecycleEphemeral),
		newPod("p",
			withClaim("../escape", "c-dotdot"),
			withClaim("a/b", "c-huge"),
			withClaim("nohandle", "c-nohandle"),
			withClaim("noclaim", ""),
			withVolume(corev1.Volume{Name: "inline/..", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: driver}}}),
			mount("inline/.."),
			withVolume(corev1.Volume{Name: "nodriver", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{}}}),
			mount("nodriver"),
			mount("no-such-volume"), // a mount of a volume the pod does not define
			func(p *corev1.Pod) {
				// A duplicate volume name: only the first counts.
				p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "a/b", VolumeSource: corev1.VolumeSource{
					CSI: &corev1.CSIVolumeSource{Driver: "other"}}})
				p.Spec.Containers = append(p.Spec.Containers, corev1.Container{}) // empty container
			}),
		newPVC("c-dotdot", dotdot), newPV(dotdot, "c-dotdot", "h-dotdot/../x"),
		newPVC("c-huge", "pv-huge"), newPV("pv-huge", "c-huge", huge),
		newPVC("c-nohandle", "pv-nohandle"), newPV("pv-nohandle", "c-nohandle", ""),
		newPod("empty", func(p *corev1.Pod) { p.Spec.Containers = nil }),
	}
	s := startStack(ctx, t, fakeClient(objs...), stackOptions{})

	got, ok := s.store.Pod("uid-p")
	if !ok {
		t.Fatal("pod p is not known")
	}
	want := []useSummary{
		fsUse("../escape", "h-dotdot/../x", dotdot),
		fsUse("a/b", huge, "pv-huge"),
		{Spec: "inline/..", Name: volume.InlineName("uid-p", "inline/.."), Access: volume.Filesystem, Inline: true},
	}
	if diff := cmp.Diff(want, summarize(got.Uses), sortUses()); diff != "" {
		t.Errorf("uses (-want +got):\n%s", diff)
	}
	wantErrs := []string{
		"noclaim: the volume names no PVC",
		`nodriver: CSI inline volume has no driver`,
		`nohandle: PV "pv-nohandle" has no CSI driver or volumeHandle`,
	}
	if diff := cmp.Diff(wantErrs, errorsOf(got)); diff != "" {
		t.Errorf("errors (-want +got):\n%s", diff)
	}
	u, ok := s.store.PodVolume(volume.PodKey{Volume: pvName(huge), Pod: "uid-p"})
	if !ok || len(u.Source.Handle) != len(huge) {
		t.Errorf("the 200 KiB handle did not arrive intact (ok=%v, len=%d)", ok, len(u.Source.Handle))
	}
	if inline, ok := s.store.PodVolume(volume.PodKey{Volume: volume.InlineName("uid-p", "inline/.."), Pod: "uid-p"}); !ok ||
		inline.Source.Handle != volume.InlineHandle("uid-p", "inline/..") || strings.Contains(inline.Source.Handle, "/") {
		t.Errorf("inline handle = %q, want the hash of pod UID and name", inline.Source.Handle)
	}
	if p, ok := s.store.Pod("uid-empty"); !ok || len(p.Uses)+len(p.Errors) != 0 {
		t.Errorf("pod without containers: %+v, %v; want known with nothing", p, ok)
	}
}

func sortUses() cmp.Option {
	return cmp.Transformer("sortBySpec", func(in []useSummary) []useSummary {
		out := slices.Clone(in)
		slices.SortFunc(out, func(a, b useSummary) int { return strings.Compare(a.Spec, b.Spec) })
		return out
	})
}
