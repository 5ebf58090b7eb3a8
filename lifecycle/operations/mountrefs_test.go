package operations

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
	"k8s.io/mount-utils"
)

// TestPropagationCopiesDoNotKeepAVolumeStaged, with real mounts: an agent
// that sees the host's root through a HostToContainer mount (host/, a
// recursive slave bind) sees the staging mount a second time there. That
// copy is not a use of the volume (the staging path's unmount takes it
// away), while a pod's bind of the staging path is, until it is unmounted.
// Found under kind: the example runtime's /host kept every volume staged.
func TestPropagationCopiesDoNotKeepAVolumeStaged(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	base := t.TempDir()
	mustMount := func(src, dst, fstype string, flags uintptr) {
		t.Helper()
		if err := os.MkdirAll(dst, 0o750); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount(src, dst, fstype, flags, ""); err != nil {
			t.Fatalf("mount %s on %s (flags %#x): %v", src, dst, flags, err)
		}
	}
	// A private tmpfs, so that nothing below propagates out of the test.
	mustMount("tmpfs", base, "tmpfs", 0)
	t.Cleanup(func() { _ = unix.Unmount(base, unix.MNT_DETACH) })
	mustMount("", base, "", unix.MS_PRIVATE)
	root, host := filepath.Join(base, "root"), filepath.Join(base, "host")
	mustMount("tmpfs", root, "tmpfs", 0)
	mustMount("", root, "", unix.MS_SHARED)
	stage := filepath.Join(root, "stage")
	mustMount("tmpfs", stage, "tmpfs", 0)
	// The agent's view of the host's root: mounts made under root later
	// appear under host too, as slaves.
	mustMount(root, host, "", unix.MS_BIND|unix.MS_REC)
	mustMount("", host, "", unix.MS_SLAVE|unix.MS_REC)
	target := filepath.Join(root, "pod", "mount")
	mustMount(stage, target, "", unix.MS_BIND)

	o := &Operations{mounts: mount.New("")}
	all, err := o.mounts.GetMountRefs(stage)
	if err != nil {
		t.Fatal(err)
	}
	copyOfStage, copyOfTarget := filepath.Join(host, "stage"), filepath.Join(host, "pod", "mount")
	for _, want := range []string{target, copyOfStage, copyOfTarget} {
		if !slices.Contains(all, want) {
			t.Fatalf("the mount table's references of %s are %v, want %s among them: the setup is not what this test is about", stage, all, want)
		}
	}
	refs, err := o.deviceMountRefs(stage)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(refs, []string{target}) {
		t.Errorf("with the pod's bind mounted, the staging path's users are %v, want only %s", refs, target)
	}
	if err := unix.Unmount(target, 0); err != nil {
		t.Fatal(err)
	}
	if refs, err = o.deviceMountRefs(stage); err != nil {
		t.Fatal(err)
	}
	if len(refs) != 0 {
		t.Errorf("with the pod's bind unmounted, the staging path's users are %v, want none (its copy under %s is not one)", refs, host)
	}
	// And the copy does go with the staging mount.
	if err := unix.Unmount(stage, 0); err != nil {
		t.Fatal(err)
	}
	if mounted, err := o.mounts.IsMountPoint(copyOfStage); err != nil || mounted {
		t.Errorf("%s after the staging path's unmount: mounted %v, %v", copyOfStage, mounted, err)
	}
}

// TestWithoutPropagationCopies: only slaves of the staging mount's own
// peer group are left out; a mount that is not shared keeps every ref, and
// a ref missing from the table is kept.
func TestWithoutPropagationCopies(t *testing.T) {
	infos := []mount.MountInfo{
		{MountPoint: "/stage", OptionalFields: []string{"shared:7"}},
		{MountPoint: "/pod/a", OptionalFields: []string{"shared:7"}},
		{MountPoint: "/host/stage", OptionalFields: []string{"shared:3", "master:7"}},
		{MountPoint: "/other", OptionalFields: []string{"master:8"}},
		{MountPoint: "/private"},
	}
	refs := []string{"/pod/a", "/host/stage", "/other", "/unknown"}
	if got, want := withoutPropagationCopies("/stage", refs, infos), []string{"/pod/a", "/other", "/unknown"}; !slices.Equal(got, want) {
		t.Errorf("shared staging mount: %v, want %v", got, want)
	}
	if got := withoutPropagationCopies("/private", refs, infos); !slices.Equal(got, refs) {
		t.Errorf("private staging mount: %v, want every ref %v", got, refs)
	}
}
