// Package loopdev attaches, finds and detaches loop devices with the
// kernel's ioctls (no losetup binary needed). Which loop device backs a
// file is read from sysfs every time, never recorded, so a restart or a
// device detached behind our back cannot leave a stale answer.
//
// The agent uses it as the kubelet's volumepathhandler AttachFileDevice
// does: a loop device over a block volume's map file holds the device open
// while a pod uses it, so that the device cannot silently go away and be
// replaced by another one of the same name.
//
// A device is configured with LOOP_CONFIGURE (Linux 5.8), or on older
// kernels (RHEL 8's 4.18) with LOOP_SET_FD and LOOP_SET_STATUS64, as
// util-linux's losetup does.
package loopdev

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

const (
	loopControl = "/dev/loop-control"
	sysBlock    = "/sys/block"
	// attachAttempts bounds the retries when another process takes the
	// free device first.
	attachAttempts = 32
)

// ErrNotFound is returned by Find when no loop device is backed by the file.
var ErrNotFound = errors.New("no loop device backs the file")

// Find returns the loop device (e.g. /dev/loop3) whose backing file is
// backingFile (an absolute path), or an error wrapping ErrNotFound.
func Find(backingFile string) (string, error) {
	resolved, err := filepath.EvalSymlinks(backingFile)
	if err != nil {
		resolved = backingFile
	}
	entries, err := os.ReadDir(sysBlock)
	if err != nil {
		return "", fmt.Errorf("listing %s: %w", sysBlock, err)
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "loop") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(sysBlock, e.Name(), "loop", "backing_file"))
		if err != nil {
			continue // not attached, or detached while we looked
		}
		b := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(string(data)), "(deleted)"))
		if b == backingFile || b == resolved {
			return "/dev/" + e.Name(), nil
		}
	}
	return "", fmt.Errorf("%w: %s", ErrNotFound, backingFile)
}

// Attach returns the loop device backed by backingFile, attaching a free
// one if none is. The file is opened read-write, or read-only (and the
// loop device made read-only) when it cannot be written.
func Attach(backingFile string) (string, error) {
	if dev, err := Find(backingFile); err == nil {
		return dev, nil
	} else if !errors.Is(err, ErrNotFound) {
		return "", err
	}
	ctl, err := os.OpenFile(loopControl, os.O_RDWR, 0)
	if err != nil {
		return "", fmt.Errorf("opening %s: %w", loopControl, err)
	}
	defer ctl.Close()
	var flags uint32
	backing, err := os.OpenFile(backingFile, os.O_RDWR, 0)
	if errors.Is(err, unix.EROFS) || errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
		backing, err = os.OpenFile(backingFile, os.O_RDONLY, 0)
		flags = unix.LO_FLAGS_READ_ONLY
	}
	if err != nil {
		return "", fmt.Errorf("opening the backing file: %w", err)
	}
	defer backing.Close()

	for range attachAttempts {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", fmt.Errorf("LOOP_CTL_GET_FREE: %w", err)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		err = configure(dev, backing, backingFile, flags)
		if errors.Is(err, unix.EBUSY) {
			continue // someone else configured it between GET_FREE and CONFIGURE
		}
		if err != nil {
			return "", err
		}
		return dev, nil
	}
	return "", fmt.Errorf("no free loop device after %d attempts", attachAttempts)
}

// loopConfigure is the LOOP_CONFIGURE ioctl; tests replace it to act as a
// kernel without it.
var loopConfigure = unix.IoctlLoopConfigure

// configure sets up dev over backing in one LOOP_CONFIGURE (Linux 5.8 and
// later). Where the kernel does not know it it falls back to the two steps
// older kernels have, LOOP_SET_FD and LOOP_SET_STATUS64, with the same
// flags. "Does not know it" is read as util-linux's losetup reads it:
// EINVAL (what the loop driver before 5.8 answers an ioctl it does not
// have), ENOTTY or ENOSYS.
func configure(dev string, backing *os.File, backingFile string, flags uint32) error {
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", dev, err)
	}
	defer f.Close()
	cfg := unix.LoopConfig{Fd: uint32(backing.Fd())}
	cfg.Info.Flags = flags
	copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], backingFile)
	err = loopConfigure(int(f.Fd()), &cfg)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOTTY) && !errors.Is(err, unix.ENOSYS) {
		return fmt.Errorf("LOOP_CONFIGURE %s: %w", dev, err)
	}
	return setFDAndStatus(f, dev, backing, &cfg.Info)
}

// statusAttempts bounds the retries of LOOP_SET_STATUS64 while the kernel
// answers EAGAIN (it could not drop the device's page cache yet).
const statusAttempts = 8

// setFDAndStatus is configure for kernels before 5.8: LOOP_SET_FD binds the
// backing file (the device is read-only when the file was opened
// read-only, as LOOP_CONFIGURE's LO_FLAGS_READ_ONLY makes it), then
// LOOP_SET_STATUS64 sets the name and the flags it may set. A failure of
// the second step clears the device again, so that no half-configured
// device is left behind.
func setFDAndStatus(f *os.File, dev string, backing *os.File, info *unix.LoopInfo64) error {
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_SET_FD, int(backing.Fd())); err != nil {
		return fmt.Errorf("LOOP_SET_FD %s: %w", dev, err)
	}
	var err error
	for i := range statusAttempts {
		if err = unix.IoctlLoopSetStatus64(int(f.Fd()), info); !errors.Is(err, unix.EAGAIN) {
			break
		}
		time.Sleep(time.Duration(i+1) * 50 * time.Millisecond)
	}
	if err != nil {
		if clrErr := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0); clrErr != nil {
			return fmt.Errorf("LOOP_SET_STATUS64 %s: %w (and LOOP_CLR_FD: %w)", dev, err, clrErr)
		}
		return fmt.Errorf("LOOP_SET_STATUS64 %s: %w", dev, err)
	}
	return nil
}

// Detach detaches the loop device backed by backingFile, if there is one.
func Detach(backingFile string) error {
	return ioctl(backingFile, unix.LOOP_CLR_FD, "LOOP_CLR_FD", unix.ENXIO)
}

// RefreshCapacity makes the loop device backed by backingFile, if any, pick
// up a new size of the file.
func RefreshCapacity(backingFile string) error {
	return ioctl(backingFile, unix.LOOP_SET_CAPACITY, "LOOP_SET_CAPACITY", nil)
}

// ioctl runs req on the loop device backed by backingFile, if there is
// one; the error ok (a race with another detach) counts as success.
func ioctl(backingFile string, req uint, name string, ok error) error {
	dev, err := Find(backingFile)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	f, err := os.OpenFile(dev, os.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", dev, err)
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), req, 0); err != nil && (ok == nil || !errors.Is(err, ok)) {
		return fmt.Errorf("%s %s: %w", name, dev, err)
	}
	return nil
}
