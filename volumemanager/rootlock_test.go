package volumemanager

import (
	"strings"
	"testing"
)

// TestRootLockIsExclusive: a second lock of a root directory fails with an
// error that names the lock file and its holder, until the first is
// released.
func TestRootLockIsExclusive(t *testing.T) {
	root := t.TempDir()
	first, err := lockRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	_, err = lockRoot(root)
	if err == nil {
		t.Fatal("second lock of one root directory succeeded")
	}
	if msg := err.Error(); !strings.Contains(msg, LockFile(root)) || !strings.Contains(msg, "held by PID") {
		t.Errorf("error %q does not name the lock file and its holder", msg)
	}
	first.release()
	again, err := lockRoot(root)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	again.release()
}
