package loopdev

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestAttachFindDetach attaches a loop device to a file, finds it again
// (twice attaching gives the same device), and detaches it.
func TestAttachFindDetach(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices")
	}
	img := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Find(img); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Find before Attach = %v, want ErrNotFound", err)
	}
	dev, err := Attach(img)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Detach(img) })
	if again, err := Attach(img); err != nil || again != dev {
		t.Errorf("second Attach = %q, %v; want the same %s", again, err, dev)
	}
	if found, err := Find(img); err != nil || found != dev {
		t.Errorf("Find = %q, %v; want %s", found, err, dev)
	}
	if err := RefreshCapacity(img); err != nil {
		t.Errorf("RefreshCapacity: %v", err)
	}
	if err := Detach(img); err != nil {
		t.Fatal(err)
	}
	if _, err := Find(img); !errors.Is(err, ErrNotFound) {
		t.Errorf("Find after Detach = %v, want ErrNotFound", err)
	}
	if err := Detach(img); err != nil {
		t.Errorf("Detach of a file without loop device = %v, want nil", err)
	}
}

// TestAttachReadOnly: a file that cannot be written gets a read-only loop
// device.
func TestAttachReadOnly(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices")
	}
	dir := t.TempDir()
	img := filepath.Join(dir, "ro.img")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o400); err != nil {
		t.Fatal(err)
	}
	// Root may write a 0400 file; an immutable-free way to refuse writes
	// is a read-only bind mount of it.
	ro := filepath.Join(dir, "ro-view")
	if err := os.WriteFile(ro, nil, 0o400); err != nil {
		t.Fatal(err)
	}
	if err := bindReadOnly(img, ro); err != nil {
		t.Skipf("cannot make a read-only bind mount here: %v", err)
	}
	t.Cleanup(func() { _ = unmount(ro) })
	dev, err := Attach(ro)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Detach(ro) })
	data, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "ro"))
	if err != nil || string(data) != "1\n" {
		t.Errorf("%s read-only flag = %q, %v; want 1", dev, data, err)
	}
}
