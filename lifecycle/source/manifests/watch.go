package manifests

import (
	"context"
	"errors"
	"io/fs"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/fsnotify/fsnotify"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// rescanKey asks the worker to read the whole directory again.
const rescanKey = ""

// Run watches the directory and applies every change until ctx ends: a
// file's objects are replaced when it changes and dropped when it goes; a
// file that stops parsing is logged and keeps its previous objects. Run
// returns nil when ctx ends; call it once.
func (s *Source) Run(ctx context.Context) error {
	ran := false
	s.runOnce.Do(func() { ran = true })
	if !ran {
		return errors.New("manifests: Run called more than once")
	}
	defer func() { _ = s.watcher.Close() }()
	logger := s.logger
	logger.V(2).Info("Watching manifest directory", "dir", s.cfg.Dir)
	var wg sync.WaitGroup
	wg.Go(func() {
		for s.processNext() {
		}
	})
	defer wg.Wait()
	defer s.queue.ShutDown()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-s.watcher.Events:
			if !ok {
				return nil
			}
			s.event(ev)
		case err, ok := <-s.watcher.Errors:
			if !ok {
				return nil
			}
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				logger.Info("Missed manifest directory events; reading it again", "dir", s.cfg.Dir)
				s.queue.Add(rescanKey)
				continue
			}
			logger.Error(err, "Watching the manifest directory failed", "dir", s.cfg.Dir)
		}
	}
}

// event schedules the read of the file an event names. A ConfigMap volume
// swaps a "..data" symlink instead of writing its files, so an event on a
// name starting with ".." rereads everything.
func (s *Source) event(ev fsnotify.Event) {
	if ev.Name == s.cfg.Dir {
		if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
			s.logger.Error(nil, "Manifest directory was removed; its pods are gone until it is created again and the agent restarted", "dir", s.cfg.Dir)
		}
		return
	}
	if filepath.Dir(ev.Name) != s.cfg.Dir {
		return
	}
	name := filepath.Base(ev.Name)
	switch {
	case isManifestName(name):
		s.logger.V(5).Info("Manifest event", "file", ev.Name, "op", ev.Op.String())
		s.queue.AddAfter(name, s.cfg.Debounce)
	case strings.HasPrefix(name, ".."):
		s.queue.AddAfter(rescanKey, s.cfg.Debounce)
	}
}

func (s *Source) processNext() bool {
	key, shutdown := s.queue.Get()
	if shutdown {
		return false
	}
	defer s.queue.Done(key)
	if key == rescanKey {
		s.rescan()
	} else {
		s.reload(key)
	}
	return true
}

// reload reads one file again and applies the result.
func (s *Source) reload(name string) {
	path := filepath.Join(s.cfg.Dir, name)
	objs, err := s.readFile(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		s.logger.V(2).Info("Manifest removed", "file", path)
		s.apply(map[string][]object{name: nil})
	case errors.Is(err, errEmptyFile):
		s.logger.V(2).Info("Manifest is empty, probably being written; what it described before stays", "file", path)
	case err != nil:
		s.logger.Error(err, "Ignoring a manifest that cannot be used; what it described before stays", "file", path)
	default:
		s.logger.V(2).Info("Manifest read", "file", path, "objects", len(objs))
		s.apply(map[string][]object{name: objs})
	}
}

// rescan reads the whole directory again: files that went are dropped,
// files that do not parse keep their previous objects.
func (s *Source) rescan() {
	files, errs := s.readAll()
	if files == nil && len(errs) > 0 {
		s.logger.Error(errors.Join(errs...), "Reading the manifest directory failed", "dir", s.cfg.Dir)
		return
	}
	for _, err := range errs {
		if !errors.Is(err, errEmptyFile) {
			s.logger.Error(err, "Ignoring a manifest that cannot be used; what it described before stays")
		}
	}
	s.mu.RLock()
	edits := map[string][]object{}
	for name := range s.files {
		if _, ok := files[name]; !ok && !failed(errs, filepath.Join(s.cfg.Dir, name)) {
			edits[name] = nil
		}
	}
	s.mu.RUnlock()
	maps.Copy(edits, files)
	s.apply(edits)
}

// failed says whether one of errs is a ParseError of file (which includes
// an empty file, see readFile).
func failed(errs []error, file string) bool {
	return slices.ContainsFunc(errs, func(err error) bool {
		var pe *ParseError
		return errors.As(err, &pe) && pe.File == file
	})
}

// apply replaces the objects of the files in edits (nil: the file is
// gone), updates the view file by file (incremental.go: the cost is that of
// the files' objects, not of the directory) and tells the subscribers what
// changed: the pods added, removed or changed, the pods referencing a
// claim or volume that changed, and the drivers whose policy changed.
func (s *Source) apply(edits map[string][]object) {
	s.mu.Lock()
	var (
		c     changes
		notes []string
	)
	for _, name := range slices.Sorted(maps.Keys(edits)) {
		old := s.files[name]
		objs := edits[name]
		if objs == nil {
			delete(s.files, name)
		} else {
			s.files[name] = objs
		}
		notes = append(notes, s.idx.setFile(s.view, name, old, objs, &c)...)
	}
	pods := append(c.pods, s.usersLocked(c)...)
	slices.Sort(pods)
	pods = slices.Compact(pods)
	drivers := slices.Compact(slices.Sorted(slices.Values(c.drivers)))
	podHandlers, driverHandlers := s.podHandlers, s.driverHandlers
	s.mu.Unlock()

	s.logNotes(notes)
	if len(pods) > 0 || len(drivers) > 0 {
		s.logger.V(4).Info("Manifests changed", "pods", len(pods), "drivers", drivers)
	}
	for _, fn := range podHandlers {
		for _, uid := range pods {
			fn(uid)
		}
	}
	for _, fn := range driverHandlers {
		for _, name := range drivers {
			fn(name)
		}
	}
}

// logNotes logs the notes of a change: objects left out, and why.
func (s *Source) logNotes(notes []string) {
	for _, n := range notes {
		s.logger.Error(nil, "Ignoring a manifest object", "reason", n)
	}
}

// Policies returns the CSIDriver policies the manifests define.
func (s *Source) Policies() *Policies { return &Policies{s: s} }

// Policies answers each driver's policy from the CSIDriver objects in the
// manifests, with the kubelet's defaults for drivers that have none; it
// implements the lifecycle's Policies.
type Policies struct{ s *Source }

// Get returns the policy of the named driver.
func (p *Policies) Get(driverName string) volume.Policy {
	p.s.mu.RLock()
	defer p.s.mu.RUnlock()
	return volume.PolicyFromCSIDriver(p.s.view.drivers[driverName])
}

// OnChange subscribes fn to changes of a driver's policy (a CSIDriver
// manifest added, removed or changed in a way that changes the policy).
// fn must not block.
func (p *Policies) OnChange(fn func(driverName string)) {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	p.s.driverHandlers = append(p.s.driverHandlers, fn)
}

// HasSynced is always true: the manifests are read before New returns.
func (p *Policies) HasSynced() bool { return true }
