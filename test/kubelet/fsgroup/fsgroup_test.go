package fsgroup_test

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/kubernetes/pkg/volume"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/fsgroup"
)

// benchFiles is the size of the benchmark's tree, as the issue asks.
const benchFiles = 100_000

const gid = 2000

// kubeletMounter is what the kubelet's VolumeOwnership reads of its
// volume.Mounter: GetAttributes().ReadOnly, false for a writable volume.
type kubeletMounter struct{ volume.Mounter }

func (kubeletMounter) GetAttributes() volume.Attributes { return volume.Attributes{} }

// kubeletChange is the kubelet's recursive ownership change, its own code:
// pkg/volume NewVolumeOwnership(...).ChangePermissions, which replaced
// SetVolumeOwnership (same algorithm) in Kubernetes 1.32.
func kubeletChange(dir string, policy *v1.PodFSGroupChangePolicy) error {
	g := int64(gid)
	return volume.NewVolumeOwnership(kubeletMounter{}, dir, &g, policy, nil).ChangePermissions()
}

// agentChange is csi-volmgr's.
func agentChange(t testing.TB, dir string, workers int) fsgroup.Result {
	res, err := fsgroup.Change(t.Context(), dir, gid, fsgroup.Options{Workers: workers})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func needRoot(t testing.TB) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to change groups")
	}
}

// makeTree makes n files below root: directories of 1000 files two levels
// deep, with the modes a volume holds (0644, 0600, 0755 executables, a
// setuid one, read-only 0444), a few symbolic links (one pointing out of
// the tree), a FIFO and a sticky directory. Everything is owned by root.
func makeTree(t testing.TB, root string, n int) {
	t.Helper()
	modes := []os.FileMode{0o644, 0o600, 0o755, 0o444}
	for i := 0; i < n; i++ {
		dir := filepath.Join(root, fmt.Sprintf("d%03d", i/10000), fmt.Sprintf("e%03d", (i/1000)%10))
		if i%1000 == 0 {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		p := filepath.Join(dir, fmt.Sprintf("f%05d", i))
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, modes[i%len(modes)]); err != nil {
			t.Fatal(err)
		}
	}
	extras := []func() error{
		func() error { return os.Symlink("d000", filepath.Join(root, "link-dir")) },
		func() error { return os.Symlink("/etc/hostname", filepath.Join(root, "link-out")) },
		func() error { return syscall.Mkfifo(filepath.Join(root, "fifo"), 0o640) },
		func() error { return os.Mkdir(filepath.Join(root, "sticky"), 0o755) },
		func() error { return os.Chmod(filepath.Join(root, "sticky"), os.ModeSticky|0o777) },
		func() error { return os.WriteFile(filepath.Join(root, "setuid"), nil, 0o755) },
		func() error { return os.Chmod(filepath.Join(root, "setuid"), os.ModeSetuid|0o755) },
		func() error { return os.Chmod(root, 0o755) },
	}
	for _, f := range extras {
		if err := f(); err != nil {
			t.Fatal(err)
		}
	}
}

// entry is one path's group and mode bits.
type entry struct {
	path string
	gid  uint32
	mode uint32
}

// snapshot lists every path below root with its group and mode, without
// following links.
func snapshot(t testing.TB, root string) []entry {
	t.Helper()
	var out []entry
	err := filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		out = append(out, entry{path: rel, gid: st.Gid, mode: st.Mode})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// reset gives everything below root back to root's group and the modes
// makeTree made, the state before an ownership change.
func reset(t testing.TB, root string, before []entry) {
	t.Helper()
	for _, e := range before {
		p := filepath.Join(root, e.path)
		if err := os.Lchown(p, 0, 0); err != nil {
			t.Fatal(err)
		}
		if e.mode&syscall.S_IFMT != syscall.S_IFLNK {
			if err := syscall.Chmod(p, e.mode&0o7777); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestOwnershipSameAsKubelet: on two identical trees, csi-volmgr's change
// leaves every file with the group and mode the kubelet's own code gives
// it, and neither touches what a symbolic link points to.
func TestOwnershipSameAsKubelet(t *testing.T) {
	needRoot(t)
	base := t.TempDir()
	kubelet, agent := filepath.Join(base, "kubelet"), filepath.Join(base, "agent")
	for _, root := range []string{kubelet, agent} {
		if err := os.Mkdir(root, 0o755); err != nil {
			t.Fatal(err)
		}
		makeTree(t, root, 3000)
	}
	var outside syscall.Stat_t
	if err := syscall.Stat("/etc/hostname", &outside); err != nil {
		t.Fatal(err)
	}
	if err := kubeletChange(kubelet, nil); err != nil {
		t.Fatal(err)
	}
	res := agentChange(t, agent, 0)
	want, got := snapshot(t, kubelet), snapshot(t, agent)
	if len(want) != len(got) || res.Files != int64(len(got)) {
		t.Fatalf("kubelet's tree has %d entries, the agent's %d, the agent visited %d", len(want), len(got), res.Files)
	}
	diffs := 0
	for i := range want {
		if want[i] != got[i] {
			diffs++
			if diffs <= 10 {
				t.Errorf("%s: kubelet gid %d mode %#o, agent gid %d mode %#o", want[i].path, want[i].gid, want[i].mode, got[i].gid, got[i].mode)
			}
		}
	}
	if diffs > 0 {
		t.Errorf("%d of %d entries differ", diffs, len(want))
	}
	if i := slices.IndexFunc(got, func(e entry) bool { return e.gid != gid }); i >= 0 {
		t.Errorf("%s has group %d after the change", got[i].path, got[i].gid)
	}
	var after syscall.Stat_t
	if err := syscall.Stat("/etc/hostname", &after); err != nil {
		t.Fatal(err)
	}
	if after.Gid != outside.Gid || after.Mode != outside.Mode {
		t.Error("a file outside the volume, behind a symbolic link, was changed")
	}
}

// BenchmarkFSGroupOwnership gives a tree of 100,000 files to an fsGroup
// with the kubelet's own code (pkg/volume VolumeOwnership, run here in the
// same process) and with csi-volmgr's lifecycle/fsgroup, on the same tree
// reset between runs, and reports both and their ratio:
//
//   - fresh: every file must change (a new volume, fsGroupChangePolicy
//     Always or a root mismatch);
//   - owned: every file is already in place (Always on a volume that was
//     changed before: every pod start walks it again).
//
// Each figure is the best of two runs, taken alternately, so neither side
// gets the warmer page cache. agent_1worker is csi-volmgr without parallel
// workers, the algorithm alone.
func BenchmarkFSGroupOwnership(b *testing.B) {
	needRoot(b)
	root := filepath.Join(b.TempDir(), "vol")
	if err := os.Mkdir(root, 0o755); err != nil {
		b.Fatal(err)
	}
	makeTree(b, root, benchFiles)
	before := snapshot(b, root)
	b.Logf("tree: %d entries (%d files) on %s", len(before), benchFiles, root)

	timed := func(fresh bool, run func()) time.Duration {
		if fresh {
			reset(b, root, before)
		}
		start := time.Now()
		run()
		return time.Since(start)
	}
	kubeletRun := func() {
		if err := kubeletChange(root, nil); err != nil {
			b.Fatal(err)
		}
	}
	agentRun := func(workers int) func() {
		return func() {
			if res := agentChange(b, root, workers); res.Files != int64(len(before)) {
				b.Fatalf("agent visited %d entries, want %d", res.Files, len(before))
			}
		}
	}
	best := func(ds ...time.Duration) time.Duration { return slices.Min(ds) }
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		var k, a, a1, ko, ao [2]time.Duration
		for round := range 2 {
			if round == 0 {
				k[round], a[round] = timed(true, kubeletRun), timed(true, agentRun(0))
			} else {
				a[round], k[round] = timed(true, agentRun(0)), timed(true, kubeletRun)
			}
			a1[round] = timed(true, agentRun(1))
			// Owned: the tree was just changed.
			ko[round], ao[round] = timed(false, kubeletRun), timed(false, agentRun(0))
		}
		kb, ab, a1b, kob, aob := best(k[:]...), best(a[:]...), best(a1[:]...), best(ko[:]...), best(ao[:]...)
		b.ReportMetric(float64(ab.Nanoseconds()), "ns/op") // the agent's fresh change, not the resets around it
		b.ReportMetric(kb.Seconds(), "kubelet_fresh_s")
		b.ReportMetric(ab.Seconds(), "agent_fresh_s")
		b.ReportMetric(a1b.Seconds(), "agent_1worker_fresh_s")
		b.ReportMetric(kb.Seconds()/ab.Seconds(), "x_kubelet_fresh")
		b.ReportMetric(kob.Seconds(), "kubelet_owned_s")
		b.ReportMetric(aob.Seconds(), "agent_owned_s")
		b.ReportMetric(kob.Seconds()/aob.Seconds(), "x_kubelet_owned")
		b.StartTimer()
	}
}
