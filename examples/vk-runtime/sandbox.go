package main

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// sandboxCommand is the hidden subcommand a container's process starts
// as, in a mount namespace of its own (CLONE_NEWNS): it builds the
// container's view of the file system and then execs the container's
// command in place, so the runtime waits on and signals the command itself.
const sandboxCommand = "sandbox"

// hostDirs are the host directories a container sees, read-only (or the
// symbolic links a merged-/usr host has for them), taken from the
// runtime's --host-root.
var hostDirs = []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc"}

// bind is one bind mount of a host path into the container.
type bind struct {
	src, dst string
	readOnly bool
	device   bool
}

// String is the --bind/--device argument: src:dst[:ro].
func (b bind) String() string {
	s := b.src + ":" + b.dst
	if b.readOnly {
		s += ":ro"
	}
	return s
}

func parseBind(v string, device bool) (bind, error) {
	parts := strings.Split(v, ":")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || !filepath.IsAbs(parts[1]) || (len(parts) == 3 && parts[2] != "ro") {
		return bind{}, fmt.Errorf("bad bind %q: want HOSTPATH:ABSOLUTE-CONTAINER-PATH[:ro]", v)
	}
	return bind{src: parts[0], dst: filepath.Clean(parts[1]), readOnly: len(parts) == 3, device: device}, nil
}

type bindList struct {
	binds  *[]bind
	device bool
}

func (l bindList) String() string { return "" }

func (l bindList) Set(v string) error {
	b, err := parseBind(v, l.device)
	if err == nil {
		*l.binds = append(*l.binds, b)
	}
	return err
}

// runSandbox is the sandbox subcommand: sandbox --root DIR [--host-root
// DIR] [--bind SRC:DST[:ro]]... [--device SRC:DST]... [--uid N] [--gid N]
// [--groups N,...] -- COMMAND [ARG]... It must run as root in a new mount
// namespace. The container's root is a tmpfs on DIR with the system
// directories of --host-root bound read-only, /dev, /proc, a private /tmp,
// and every volume bound at its mountPath (every block volume at its
// devicePath); then it changes root into it, takes the container's user,
// group and supplemental groups and execs COMMAND.
func runSandbox(args []string) error {
	fs := flag.NewFlagSet(sandboxCommand, flag.ContinueOnError)
	root := fs.String("root", "", "directory the container's root is built on")
	hostRoot := fs.String("host-root", "/", "directory whose system directories (usr, etc, bin, lib...) the container sees")
	var binds []bind
	fs.Var(bindList{binds: &binds}, "bind", "HOSTPATH:MOUNTPATH[:ro], repeatable")
	fs.Var(bindList{binds: &binds, device: true}, "device", "HOSTDEVICE:DEVICEPATH, repeatable")
	var id identity
	fs.Func("uid", "user ID the command runs as", intFlag(&id.uid))
	fs.Func("gid", "group ID the command runs as", intFlag(&id.gid))
	fs.Func("groups", "supplemental group IDs, comma-separated", func(v string) error {
		for g := range strings.SplitSeq(v, ",") {
			var n int64
			if err := intFlag(&n)(g); err != nil {
				return err
			}
			id.groups = append(id.groups, n)
		}
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return err
	}
	command := fs.Args()
	if *root == "" || len(command) == 0 {
		return errors.New("sandbox: --root and a command are required")
	}
	if err := buildRoot(*root, *hostRoot, binds); err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	if err := unix.Chroot(*root); err != nil {
		return fmt.Errorf("sandbox: chroot %s: %w", *root, err)
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	if os.Getenv("PATH") == "" {
		_ = os.Setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	}
	path, err := exec.LookPath(command[0])
	if err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	if err := id.take(); err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	return syscall.Exec(path, command, os.Environ())
}

// intFlag parses a non-negative ID into p.
func intFlag(p *int64) func(string) error {
	return func(v string) error {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || n > math.MaxUint32-1 {
			return fmt.Errorf("%q is not a user or group ID", v)
		}
		*p = n
		return nil
	}
}

// take makes the process (every thread of it: the syscall package's
// set*id calls reach them all) run as id, dropping root last.
func (id identity) take() error {
	groups := make([]int, len(id.groups))
	for i, g := range id.groups {
		groups[i] = int(g)
	}
	if err := syscall.Setgroups(groups); err != nil {
		return fmt.Errorf("setgroups %v: %w", id.groups, err)
	}
	if err := syscall.Setgid(int(id.gid)); err != nil {
		return fmt.Errorf("setgid %d: %w", id.gid, err)
	}
	if err := syscall.Setuid(int(id.uid)); err != nil {
		return fmt.Errorf("setuid %d: %w", id.uid, err)
	}
	return nil
}

// buildRoot builds the container's root file system on root, with the
// system directories of hostRoot.
func buildRoot(root, hostRoot string, binds []bind) error {
	// Nothing mounted here propagates to the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("mounting the root tmpfs: %w", err)
	}
	for _, d := range hostDirs {
		src, dst := filepath.Join(hostRoot, d), filepath.Join(root, d)
		fi, err := os.Lstat(src)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue
		case err != nil:
			return err
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(src)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, dst); err != nil {
				return err
			}
		default:
			if err := bindMount(src, dst, true, false); err != nil {
				return err
			}
		}
	}
	if err := bindMount("/dev", filepath.Join(root, "dev"), false, false); err != nil {
		return err
	}
	for _, m := range []struct{ dir, fstype string }{{"proc", "proc"}, {"tmp", "tmpfs"}} {
		dst := filepath.Join(root, m.dir)
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.fstype, dst, m.fstype, 0, ""); err != nil {
			return fmt.Errorf("mounting %s on /%s: %w", m.fstype, m.dir, err)
		}
	}
	for _, b := range binds {
		if err := bindMount(b.src, filepath.Join(root, b.dst), b.readOnly, b.device); err != nil {
			return fmt.Errorf("volume at %s: %w", b.dst, err)
		}
	}
	return nil
}

// bindMount binds src (a directory, or a device file) at dst, creating
// dst, and makes it read-only if asked.
func bindMount(src, dst string, readOnly, file bool) error {
	if file {
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		f, err := os.OpenFile(dst, os.O_CREATE|os.O_RDONLY, 0o600)
		if err != nil {
			return err
		}
		_ = f.Close()
	} else if err := os.MkdirAll(dst, 0o755); err != nil {
		return fmt.Errorf("creating %s (a mount path below a host directory is not supported): %w", dst, err)
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("binding %s at %s: %w", src, dst, err)
	}
	if readOnly {
		if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("making %s read-only: %w", dst, err)
		}
	}
	return nil
}
