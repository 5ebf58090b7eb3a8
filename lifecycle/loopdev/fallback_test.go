package loopdev

import (
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// loopState is what a configured loop device shows: its backing file, its
// read-only and autoclear flags (from sysfs), and the name and flags that
// LOOP_GET_STATUS64 reports.
type loopState struct {
	backingFile, ro, autoclear string
	statusName                 string
	statusFlags                uint32
}

func readLoopState(t *testing.T, dev string) loopState {
	t.Helper()
	sys := filepath.Join("/sys/block", filepath.Base(dev))
	read := func(p string) string {
		data, err := os.ReadFile(filepath.Join(sys, p))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(data))
	}
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	info, err := unix.IoctlLoopGetStatus64(int(f.Fd()))
	if err != nil {
		t.Fatalf("LOOP_GET_STATUS64 %s: %v", dev, err)
	}
	return loopState{
		backingFile: read("loop/backing_file"),
		ro:          read("ro"),
		autoclear:   read("loop/autoclear"),
		statusName:  unix.ByteSliceToString(info.File_name[:]),
		statusFlags: info.Flags,
	}
}

// withoutLoopConfigure makes LOOP_CONFIGURE answer errno, as a kernel
// before 5.8 does, for the rest of the test; the returned counter says how
// often it was asked.
func withoutLoopConfigure(t *testing.T, errno unix.Errno) *atomic.Int32 {
	t.Helper()
	var calls atomic.Int32
	saved := loopConfigure
	loopConfigure = func(int, *unix.LoopConfig) error {
		calls.Add(1)
		return errno
	}
	t.Cleanup(func() { loopConfigure = saved })
	return &calls
}

// attachState attaches a loop device to file, reads its state and
// detaches it again.
func attachState(t *testing.T, file string) loopState {
	t.Helper()
	dev, err := Attach(file)
	if err != nil {
		t.Fatal(err)
	}
	st := readLoopState(t, dev)
	if err := Detach(file); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestAttachWithoutLoopConfigure: on a kernel without LOOP_CONFIGURE
// (EINVAL from the loop driver before 5.8, ENOTTY from the block layer),
// Attach falls back to LOOP_SET_FD and LOOP_SET_STATUS64, and the device
// is configured as LOOP_CONFIGURE configures it: the same backing file,
// read-only flag, autoclear flag and status name and flags, for a
// writable and for a read-only file.
func TestAttachWithoutLoopConfigure(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices")
	}
	dir := t.TempDir()
	rw := filepath.Join(dir, "rw.img")
	if err := os.WriteFile(rw, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	ro := filepath.Join(dir, "ro-view")
	if err := os.WriteFile(ro, nil, 0o400); err != nil {
		t.Fatal(err)
	}
	if err := bindReadOnly(rw, ro); err != nil {
		t.Fatalf("read-only bind mount: %v", err)
	}
	t.Cleanup(func() { _ = unmount(ro) })

	for _, file := range []string{rw, ro} {
		t.Run(filepath.Base(file), func(t *testing.T) {
			t.Cleanup(func() { _ = Detach(file) })
			want := attachState(t, file)
			if want.backingFile == "" || want.statusName != file {
				t.Fatalf("with LOOP_CONFIGURE: %+v", want)
			}
			for _, errno := range []unix.Errno{unix.EINVAL, unix.ENOTTY} {
				calls := withoutLoopConfigure(t, errno)
				got := attachState(t, file)
				if calls.Load() == 0 {
					t.Fatalf("%v: LOOP_CONFIGURE was not tried first", errno)
				}
				if got != want {
					t.Errorf("LOOP_CONFIGURE answering %v: the fallback configured %+v, LOOP_CONFIGURE %+v", errno, got, want)
				}
			}
		})
	}
	if st := attachState(t, ro); st.ro != "1" || st.statusFlags&unix.LO_FLAGS_READ_ONLY == 0 {
		t.Errorf("read-only file: %+v, want ro 1 and LO_FLAGS_READ_ONLY", st)
	}
}

// TestAttachLoopConfigureOtherError: an error of LOOP_CONFIGURE that does
// not mean "unknown ioctl" is returned, not papered over by the fallback.
func TestAttachLoopConfigureOtherError(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices")
	}
	img := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Detach(img) })
	withoutLoopConfigure(t, unix.EIO)
	if dev, err := Attach(img); err == nil {
		t.Fatalf("Attach = %s, want the EIO of LOOP_CONFIGURE", dev)
	}
	if dev, err := Find(img); err == nil {
		t.Errorf("a loop device (%s) backs the file after a failed Attach", dev)
	}
}
