package loopdev

import "golang.org/x/sys/unix"

func bindReadOnly(from, to string) error {
	if err := unix.Mount(from, to, "", unix.MS_BIND, ""); err != nil {
		return err
	}
	if err := unix.Mount("", to, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		_ = unix.Unmount(to, 0)
		return err
	}
	return nil
}

func unmount(p string) error { return unix.Unmount(p, 0) }
