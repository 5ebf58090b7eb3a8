package registry

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/fsnotify/fsnotify"
	"k8s.io/klog/v2"
)

// watcher turns the registration directory into socket paths to handle: the
// sockets present at start (walk), then every create, remove or rename event.
// Only the directory itself is watched, as node-driver-registrar places its
// socket there; dot-files and files that are not sockets are ignored.
type watcher struct {
	dir     string
	fs      *fsnotify.Watcher
	enqueue func(path string)
}

func newWatcher(dir string, enqueue func(string)) (*watcher, error) {
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("registry: start fsnotify: %w", err)
	}
	// Watch before walking: a socket created in between is seen at least once,
	// and the queue folds duplicates.
	if err := fsw.Add(dir); err != nil {
		_ = fsw.Close()
		return nil, fmt.Errorf("registry: watch %s: %w", dir, err)
	}
	return &watcher{dir: dir, fs: fsw, enqueue: enqueue}, nil
}

// walk returns the sockets already in the directory.
func (w *watcher) walk(ctx context.Context) ([]string, error) {
	entries, err := os.ReadDir(w.dir)
	if err != nil {
		return nil, fmt.Errorf("registry: read %s: %w", w.dir, err)
	}
	var sockets []string
	for _, e := range entries {
		path := filepath.Join(w.dir, e.Name())
		if w.wanted(ctx, path) {
			sockets = append(sockets, path)
		}
	}
	return sockets, nil
}

// wanted says whether path is a registration socket worth a handshake.
func (w *watcher) wanted(ctx context.Context, path string) bool {
	logger := klog.FromContext(ctx)
	if strings.HasPrefix(filepath.Base(path), ".") {
		logger.V(5).Info("Ignoring dot-file in registration directory", "path", path)
		return false
	}
	fi, err := os.Lstat(path)
	if err != nil {
		logger.V(5).Info("Ignoring vanished file in registration directory", "path", path, "err", err)
		return false
	}
	if fi.Mode()&os.ModeSocket == 0 {
		logger.V(4).Info("Ignoring file that is not a socket in registration directory", "path", path, "mode", fi.Mode().String())
		return false
	}
	return true
}

func (w *watcher) run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.fs.Events:
			if !ok {
				return
			}
			logger.V(6).Info("Registration directory event", "event", ev.String())
			switch {
			case ev.Has(fsnotify.Create):
				if w.wanted(ctx, ev.Name) {
					w.enqueue(ev.Name)
				}
			case ev.Has(fsnotify.Remove), ev.Has(fsnotify.Rename):
				if !strings.HasPrefix(filepath.Base(ev.Name), ".") {
					w.enqueue(ev.Name)
				}
			}
		case err, ok := <-w.fs.Errors:
			if !ok {
				return
			}
			logger.Error(err, "Watching the registration directory failed", "dir", w.dir)
		}
	}
}

func (w *watcher) close() error { return w.fs.Close() }
