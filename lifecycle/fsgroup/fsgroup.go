// Package fsgroup gives the files of a mounted volume to a pod's fsGroup,
// as the kubelet does after NodePublishVolume for drivers without the
// VOLUME_MOUNT_GROUP capability (pkg/volume/volume_linux.go
// VolumeOwnership.ChangePermissions): every file and directory gets the
// group fsGroup and the group read/write bits, directories also the group
// execute and setgid bits, so that what the pod creates later inherits the
// group.
//
// It does what the kubelet does, with three differences:
//
//   - It never follows a symbolic link, even one swapped in while it walks
//     (the volume may already be in use by another pod): every step is
//     relative to an open directory, directories are opened with
//     O_NOFOLLOW, files are changed with fchownat and fchmodat2
//     (AT_SYMLINK_NOFOLLOW). The kubelet's walk uses paths (Lstat, then
//     Lchown and Chmod by name), so a file replaced by a symbolic link
//     between the Lstat and the Chmod has its target's mode changed.
//   - A file that already has the group and the bits is not changed: no
//     chown, no chmod, no ctime update. The kubelet changes every file.
//   - Directories are walked by several workers, and the walk can be
//     interrupted (its context) and watched (Options.Progress). The root is
//     changed last, so that an interrupted or failed walk leaves the root
//     unchanged and OnRootMismatch walks again next time.
package fsgroup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// The bits the kubelet adds (volume_linux.go rwMask, execMask and
// os.ModeSetgid): files get group read/write, directories also group
// execute and setgid. (The kubelet's masks add the owner's bits too.)
const (
	fileBits = 0o660
	dirBits  = unix.S_ISGID | 0o770
)

// DefaultWorkers is the number of directories changed in parallel when
// Options.Workers is 0.
const DefaultWorkers = 4

// readBatch is how many directory entries are read at a time; the context
// is checked between batches.
const readBatch = 1024

// Options tune a Change.
type Options struct {
	// OnRootMismatch is fsGroupChangePolicy OnRootMismatch: when the root
	// already has the group and the bits, nothing is walked.
	OnRootMismatch bool
	// Workers is the number of directories changed in parallel; 0 means
	// DefaultWorkers.
	Workers int
	// Progress, if set, is incremented once per file or directory done, as
	// the walk goes; another goroutine may read it.
	Progress *atomic.Int64
}

// Result says what a Change did.
type Result struct {
	// Skipped says OnRootMismatch found the root in place and nothing was
	// walked.
	Skipped bool
	// Files counts the files and directories visited, the root included.
	Files int64
	// Changed counts those whose group or mode was changed.
	Changed int64
	// Failed counts those whose change failed. As the kubelet, such
	// failures are logged and do not fail the change (a volume may hold
	// files the node's root cannot change, e.g. on NFS with root_squash).
	Failed int64
}

// RootMatches reports whether root has group gid and the bits a finished
// Change gives it: the kubelet's requiresPermissionChange, negated. A root
// that is not a directory never matches.
func RootMatches(root string, gid int64) (bool, error) {
	var st unix.Stat_t
	if err := unix.Stat(root, &st); err != nil {
		return false, &os.PathError{Op: "stat", Path: root, Err: err}
	}
	return rootInPlace(&st, gid), nil
}

func rootInPlace(st *unix.Stat_t, gid int64) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFDIR && int64(st.Gid) == gid && st.Mode&dirBits == dirBits
}

// Change gives every file and directory below root (root included) the
// group gid and the group bits, never following symbolic links. It returns
// when everything was visited, or with ctx's error (wrapped) when ctx ends
// first, or with the first error that stops the walk (a directory that
// cannot be read). In both cases the root is left unchanged.
func Change(ctx context.Context, root string, gid int64, opts Options) (Result, error) {
	if gid < 0 || gid > int64(^uint32(0)>>1) {
		return Result{}, fmt.Errorf("fsGroup %d is not a valid group ID", gid)
	}
	rootFD, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return Result{}, &os.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(rootFD)
	var st unix.Stat_t
	if err := unix.Fstat(rootFD, &st); err != nil {
		return Result{}, &os.PathError{Op: "stat", Path: root, Err: err}
	}
	if opts.OnRootMismatch && rootInPlace(&st, gid) {
		return Result{Skipped: true}, nil
	}
	listFD, err := unix.Dup(rootFD)
	if err != nil {
		return Result{}, &os.PathError{Op: "dup", Path: root, Err: err}
	}
	unix.CloseOnExec(listFD)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := &walker{
		ctx: ctx, cancel: cancel, root: root, gid: int(gid),
		progress: opts.Progress, logger: klog.FromContext(ctx),
		jobs: make(chan job, 64),
	}
	workers := opts.Workers
	if workers <= 0 {
		workers = DefaultWorkers
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for j := range w.jobs {
				w.dir(j)
				w.pending.Done()
			}
		})
	}
	w.pending.Add(1)
	w.jobs <- job{f: os.NewFile(uintptr(listFD), root), rel: "."}
	w.pending.Wait()
	close(w.jobs)
	wg.Wait()

	if err := w.stopErr(); err != nil {
		return w.result(), err
	}
	// The root last: until here an interrupted walk left it as it was.
	w.fixDir(rootFD, &st, ".")
	w.done()
	w.logFailures()
	return w.result(), nil
}

// job is a directory to walk, open.
type job struct {
	f *os.File
	// rel is its path relative to the root, for messages.
	rel string
}

type walker struct {
	ctx      context.Context
	cancel   context.CancelFunc
	root     string
	gid      int
	progress *atomic.Int64
	logger   klog.Logger

	jobs    chan job
	pending sync.WaitGroup

	files, changed, failed atomic.Int64
	// noFchmodat2 is set once fchmodat2 turned out to be missing (Linux
	// before 6.6): modes are then changed through /proc/self/fd.
	noFchmodat2 atomic.Bool

	mu          sync.Mutex
	err         error
	firstFailed error
}

func (w *walker) result() Result {
	return Result{Files: w.files.Load(), Changed: w.changed.Load(), Failed: w.failed.Load()}
}

// stopErr is why the walk stopped early, nil if it did not.
func (w *walker) stopErr() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	if err := w.ctx.Err(); err != nil {
		return fmt.Errorf("changing the group of %s interrupted after %d files: %w", w.root, w.files.Load(), err)
	}
	return nil
}

// stop ends the walk with err.
func (w *walker) stop(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
	w.cancel()
}

// failedOn records a change that failed; the walk goes on.
func (w *walker) failedOn(rel string, err error) {
	w.failed.Add(1)
	w.mu.Lock()
	if w.firstFailed == nil {
		w.firstFailed = fmt.Errorf("%s: %w", filepath.Join(w.root, rel), err)
	}
	w.mu.Unlock()
}

func (w *walker) logFailures() {
	if n := w.failed.Load(); n > 0 {
		w.logger.Error(w.firstFailed, "Could not change the group or mode of some files of the volume", "failed", n, "root", w.root)
	}
}

func (w *walker) done() {
	w.files.Add(1)
	if w.progress != nil {
		w.progress.Add(1)
	}
}

// dir walks one open directory and closes it.
func (w *walker) dir(j job) {
	defer j.f.Close()
	fd := int(j.f.Fd())
	for w.ctx.Err() == nil {
		entries, err := j.f.ReadDir(readBatch)
		for _, e := range entries {
			w.entry(fd, j.rel, e.Name(), e.Type())
		}
		if errors.Is(err, io.EOF) || (err == nil && len(entries) == 0) {
			return
		}
		if err != nil {
			w.stop(fmt.Errorf("reading directory %s: %w", filepath.Join(w.root, j.rel), err))
			return
		}
	}
}

// entry changes one entry of the directory dirFD and, for a directory,
// walks it (here or on another worker).
func (w *walker) entry(dirFD int, parent, name string, typ os.FileMode) {
	rel := filepath.Join(parent, name)
	if typ.IsDir() {
		if w.subdir(dirFD, rel, name) {
			return
		}
		// Not a directory any more: changed under us; treat it as what it is now.
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dirFD, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if !errors.Is(err, unix.ENOENT) {
			w.failedOn(rel, err)
		}
		return
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if w.subdir(dirFD, rel, name) {
			return
		}
		return // it went away or is no directory any more; nothing safe to do
	}
	w.fixAt(dirFD, name, &st, rel)
	w.done()
}

// subdir opens the directory name of dirFD without following a symbolic
// link, changes it and walks it. false means it is not a directory (any
// more), or is gone.
func (w *walker) subdir(dirFD int, rel, name string) bool {
	fd, err := unix.Openat(dirFD, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.ELOOP):
		return false
	case err != nil:
		w.stop(fmt.Errorf("opening directory %s: %w", filepath.Join(w.root, rel), err))
		return true
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		w.stop(fmt.Errorf("stat %s: %w", filepath.Join(w.root, rel), err))
		return true
	}
	w.fixDir(fd, &st, rel)
	w.done()
	j := job{f: os.NewFile(uintptr(fd), rel), rel: rel}
	w.pending.Add(1)
	select {
	case w.jobs <- j:
	default:
		// Every worker is busy and the queue is full: walk it here.
		w.dir(j)
		w.pending.Done()
	}
	return true
}

// fixDir changes an open directory. As the kubelet, a failed chown does
// not keep the mode from being changed.
func (w *walker) fixDir(fd int, st *unix.Stat_t, rel string) {
	var errs []error
	chowned := false
	if int(st.Gid) != w.gid {
		if err := unix.Fchown(fd, -1, w.gid); err != nil {
			errs = append(errs, fmt.Errorf("chown: %w", err))
		} else {
			chowned = true
		}
	}
	mode := st.Mode & 0o7777
	chmodded := false
	if mode|dirBits != mode || chowned {
		if err := unix.Fchmod(fd, mode|dirBits); err != nil {
			errs = append(errs, fmt.Errorf("chmod: %w", err))
		} else {
			chmodded = true
		}
	}
	w.account(rel, chowned || chmodded, errs)
}

// fixAt changes the non-directory name of dirFD whose stat is st. A
// symbolic link gets the group (as the kubelet's Lchown) but no mode.
func (w *walker) fixAt(dirFD int, name string, st *unix.Stat_t, rel string) {
	var errs []error
	chowned := false
	if int(st.Gid) != w.gid {
		err := unix.Fchownat(dirFD, name, -1, w.gid, unix.AT_SYMLINK_NOFOLLOW)
		switch {
		case errors.Is(err, unix.ENOENT):
			return // gone since the fstatat
		case err != nil:
			errs = append(errs, fmt.Errorf("chown: %w", err))
		default:
			chowned = true
		}
	}
	chmodded := false
	mode := st.Mode & 0o7777
	// chown clears setuid and setgid of a file: set them again, as the
	// kubelet's Chmod(mode|mask) does.
	if st.Mode&unix.S_IFMT != unix.S_IFLNK &&
		(mode|fileBits != mode || (chowned && mode&(unix.S_ISUID|unix.S_ISGID) != 0)) {
		err := w.chmodAt(dirFD, name, mode|fileBits)
		switch {
		case errors.Is(err, unix.ENOENT):
		case err != nil:
			errs = append(errs, fmt.Errorf("chmod: %w", err))
		default:
			chmodded = true
		}
	}
	w.account(rel, chowned || chmodded, errs)
}

// account counts an entry as changed and/or failed.
func (w *walker) account(rel string, changed bool, errs []error) {
	if changed {
		w.changed.Add(1)
	}
	if len(errs) > 0 {
		w.failedOn(rel, errors.Join(errs...))
	}
}

// chmodAt changes the mode of name in dirFD without following a symbolic
// link: fchmodat2 with AT_SYMLINK_NOFOLLOW, or on kernels without it, the
// file opened with O_PATH|O_NOFOLLOW and changed through /proc/self/fd.
func (w *walker) chmodAt(dirFD int, name string, mode uint32) error {
	if !w.noFchmodat2.Load() {
		err := unix.Fchmodat(dirFD, name, mode, unix.AT_SYMLINK_NOFOLLOW)
		if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOSYS) {
			return err
		}
		// EOPNOTSUPP is also fchmodat2's answer for a symbolic link: one
		// swapped in since the fstatat is left alone.
		var st unix.Stat_t
		if err := unix.Fstatat(dirFD, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return nil
		}
		w.noFchmodat2.Store(true)
	}
	fd, err := unix.Openat(dirFD, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return nil
	}
	return unix.Chmod(fmt.Sprintf("/proc/self/fd/%d", fd), mode)
}
