package plugin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Loop devices are managed with the kernel's ioctls rather than losetup(8), so the plugin needs no tools.
// Which loop device backs a file is read from sysfs every time it is needed instead of being recorded,
// so a plugin restart, or a device detached behind the plugin's back, can never leave a stale answer.

const (
	loopControl = "/dev/loop-control"
	sysBlock    = "/sys/block"
	// loopAttachAttempts bounds the retries when another process grabs the free device first.
	loopAttachAttempts = 32
)

// errNoLoopDevice is returned by findLoopDevice when no loop device is backed by the file.
var errNoLoopDevice = errors.New("no loop device backs the file")

// findLoopDevice returns the loop device (e.g. /dev/loop3) whose backing file is backingFile,
// which must be an absolute path without symlinks.
func findLoopDevice(backingFile string) (string, error) {
	entries, err := os.ReadDir(sysBlock)
	if err != nil {
		return "", fmt.Errorf("list %s: %w", sysBlock, err)
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "loop") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(sysBlock, e.Name(), "loop", "backing_file"))
		if err != nil {
			// Not attached (no "loop" directory content) or detached while we looked.
			continue
		}
		if strings.TrimSpace(string(data)) == backingFile {
			return "/dev/" + e.Name(), nil
		}
	}
	return "", errNoLoopDevice
}

// attachLoopDevice returns the loop device backed by backingFile, attaching a free one if none is.
func attachLoopDevice(backingFile string) (string, error) {
	if dev, err := findLoopDevice(backingFile); err == nil {
		return dev, nil
	} else if !errors.Is(err, errNoLoopDevice) {
		return "", err
	}

	ctl, err := os.OpenFile(loopControl, os.O_RDWR, 0)
	if err != nil {
		return "", fmt.Errorf("open %s: %w", loopControl, err)
	}
	defer ctl.Close()
	backing, err := os.OpenFile(backingFile, os.O_RDWR, 0)
	if err != nil {
		return "", fmt.Errorf("open backing file: %w", err)
	}
	defer backing.Close()

	for range loopAttachAttempts {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", fmt.Errorf("LOOP_CTL_GET_FREE: %w", err)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		err = configureLoop(dev, backing, backingFile)
		if errors.Is(err, unix.EBUSY) {
			continue // Someone else configured it between GET_FREE and CONFIGURE.
		}
		if err != nil {
			return "", err
		}
		return dev, nil
	}
	return "", fmt.Errorf("no free loop device after %d attempts", loopAttachAttempts)
}

func configureLoop(dev string, backing *os.File, backingFile string) error {
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dev, err)
	}
	defer f.Close()
	cfg := unix.LoopConfig{Fd: uint32(backing.Fd())}
	copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], backingFile)
	if err := unix.IoctlLoopConfigure(int(f.Fd()), &cfg); err != nil {
		return fmt.Errorf("LOOP_CONFIGURE %s: %w", dev, err)
	}
	return nil
}

// detachLoopDevice detaches the loop device backed by backingFile, if there is one.
func detachLoopDevice(backingFile string) error {
	dev, err := findLoopDevice(backingFile)
	if errors.Is(err, errNoLoopDevice) {
		return nil
	}
	if err != nil {
		return err
	}
	f, err := os.OpenFile(dev, os.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dev, err)
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("LOOP_CLR_FD %s: %w", dev, err)
	}
	return nil
}

// refreshLoopCapacity makes an attached loop device pick up a new size of its backing file.
func refreshLoopCapacity(backingFile string) error {
	dev, err := findLoopDevice(backingFile)
	if errors.Is(err, errNoLoopDevice) {
		return nil
	}
	if err != nil {
		return err
	}
	f, err := os.OpenFile(dev, os.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dev, err)
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_SET_CAPACITY, 0); err != nil {
		return fmt.Errorf("LOOP_SET_CAPACITY %s: %w", dev, err)
	}
	return nil
}
