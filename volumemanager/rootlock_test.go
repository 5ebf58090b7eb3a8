package volumemanager

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
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

// TestRootLockRefusesWhatIsNotARegularFile: a symlink, a FIFO, a
// directory or a hard link at the lock path makes the lock fail with an
// error that names the path and what is there, and nothing is written:
// the file a planted link points to keeps its content.
func TestRootLockRefusesWhatIsNotARegularFile(t *testing.T) {
	const content = "host file\n"
	for name, tc := range map[string]struct {
		plant func(t *testing.T, lock, outside string)
		want  string
	}{
		"symlink to a file outside": {
			plant: func(t *testing.T, lock, outside string) { mustNoErr(t, os.Symlink(outside, lock)) },
			want:  "a symlink",
		},
		"dangling symlink": {
			plant: func(t *testing.T, lock, outside string) {
				mustNoErr(t, os.Remove(outside))
				mustNoErr(t, os.Symlink(outside, lock))
			},
			want: "a symlink",
		},
		"FIFO": {
			plant: func(t *testing.T, lock, _ string) { mustNoErr(t, unix.Mkfifo(lock, 0o600)) },
			want:  "a FIFO",
		},
		"directory": {
			plant: func(t *testing.T, lock, _ string) { mustNoErr(t, os.Mkdir(lock, 0o700)) },
			want:  "a directory",
		},
		"hard link to a file outside": {
			plant: func(t *testing.T, lock, outside string) { mustNoErr(t, os.Link(outside, lock)) },
			want:  "2 hard links",
		},
	} {
		t.Run(name, func(t *testing.T) {
			base := t.TempDir()
			root := filepath.Join(base, "root")
			mustNoErr(t, os.Mkdir(root, 0o750))
			outside := filepath.Join(base, "host-file")
			mustNoErr(t, os.WriteFile(outside, []byte(content), 0o644))
			tc.plant(t, LockFile(root), outside)

			l, err := lockRoot(root)
			if err == nil {
				l.release()
				t.Error("the lock was taken")
			} else if msg := err.Error(); !strings.Contains(msg, LockFile(root)) || !strings.Contains(msg, tc.want) {
				t.Errorf("error %q does not name the lock file and %q", msg, tc.want)
			}
			b, err := os.ReadFile(outside)
			switch {
			case errors.Is(err, fs.ErrNotExist) && name == "dangling symlink":
			case err != nil:
				t.Fatal(err)
			case string(b) != content:
				t.Errorf("the file outside the root directory now holds %q, want %q", b, content)
			}
		})
	}
}

// TestCheckLockFDRefusesAFIFO: the check on the open descriptor, which
// holds when a FIFO replaces the lock file between the lstat and the open,
// refuses it.
func TestCheckLockFDRefusesAFIFO(t *testing.T) {
	path := filepath.Join(t.TempDir(), LockFileName)
	mustNoErr(t, unix.Mkfifo(path, 0o600))
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unix.Close(fd) }()
	if err := checkLockFD(path, fd); err == nil || !strings.Contains(err.Error(), "a FIFO") {
		t.Errorf("checkLockFD of a FIFO = %v, want an error saying it is a FIFO", err)
	}
}

// TestRootLockKeepsTheHolderOnAFailedLock: a second lock attempt does not
// truncate the file before it holds the lock, so the holder's PID stays.
func TestRootLockKeepsTheHolderOnAFailedLock(t *testing.T) {
	root := t.TempDir()
	first, err := lockRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	defer first.release()
	want := strconv.Itoa(os.Getpid()) + "\n"
	for range 2 {
		if _, err := lockRoot(root); err == nil {
			t.Fatal("second lock of one root directory succeeded")
		}
	}
	if b, err := os.ReadFile(LockFile(root)); err != nil || string(b) != want {
		t.Errorf("lock file holds %q (%v), want %q", b, err, want)
	}
}

func mustNoErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestNewRefusesASymlinkedLockFile: an agent whose root directory has a
// symlink at the lock path does not start, says why, and leaves the file
// the link points to as it was.
func TestNewRefusesASymlinkedLockFile(t *testing.T) {
	base := t.TempDir()
	root, manifests := filepath.Join(base, "root"), filepath.Join(base, "manifests")
	for _, d := range []string{root, manifests} {
		mustNoErr(t, os.Mkdir(d, 0o750))
	}
	outside := filepath.Join(base, "host-file")
	mustNoErr(t, os.WriteFile(outside, []byte("host file\n"), 0o644))
	mustNoErr(t, os.Symlink(outside, LockFile(root)))

	vm, err := New(t.Context(), Config{NodeName: "n", RootDir: root, Manifests: manifests, RegistrationDir: filepath.Join(root, "plugins_registry")})
	if err == nil {
		vm.lock.release()
		t.Error("New started with a symlink at the lock path")
	} else if ce, ok := errors.AsType[*ConfigError](err); !ok || ce.Field != "RootDir" || !strings.Contains(err.Error(), "a symlink") {
		t.Errorf("New = %v, want a ConfigError of RootDir saying the lock file is a symlink", err)
	}
	if b, err := os.ReadFile(outside); err != nil || string(b) != "host file\n" {
		t.Errorf("the file the link points to holds %q (%v), want it unchanged", b, err)
	}
}
