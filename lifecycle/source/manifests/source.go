package manifests

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/source"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// defaultDebounce is how long after the last event of a file it is read, so
// that a file written in several pieces is read once, complete.
const defaultDebounce = 100 * time.Millisecond

// Config configures a Source.
type Config struct {
	// Dir is the manifest directory; it must exist. Required.
	Dir string
	// NodeName is this node: pods without spec.nodeName are given it, pods
	// that name another node are ignored. Required.
	NodeName string
	// Debounce is how long after a file's last change it is read; 0 means
	// 100ms.
	Debounce time.Duration
}

// Validate checks the required fields.
func (c Config) Validate() error {
	var errs []error
	if c.Dir == "" {
		errs = append(errs, errors.New("manifests: Dir is required"))
	}
	if c.NodeName == "" {
		errs = append(errs, errors.New("manifests: NodeName is required"))
	}
	if c.Debounce < 0 {
		errs = append(errs, fmt.Errorf("manifests: Debounce must not be negative, got %v", c.Debounce))
	}
	return errors.Join(errs...)
}

// Source serves the pods, claims, volumes, Secrets and CSIDriver objects
// of a manifest directory, and reports their changes. It implements the
// populator's Source (Pods and Objects), operations' Secrets, and, through
// Policies, the CSIDriver policies. Objects returned by its getters are
// shared: never modify them.
type Source struct {
	cfg     Config
	logger  klog.Logger
	watcher *fsnotify.Watcher
	queue   workqueue.TypedDelayingInterface[string]
	runOnce sync.Once

	// mu protects files, view, refs and the handler lists.
	mu sync.RWMutex
	// files holds the objects of every manifest file that parsed, by base
	// name; a file that stopped parsing keeps its last good objects.
	files map[string][]object
	view  *view
	idx   *index
	// refs are the objects each pod references (AddReferences), and
	// pvcUsers and pvUsers the pods referencing each claim and volume.
	refs           map[types.UID]source.References
	pvcUsers       map[cache.ObjectName]map[types.UID]struct{}
	pvUsers        map[string]map[types.UID]struct{}
	podHandlers    []func(types.UID)
	driverHandlers []func(driver string)
}

// New reads every manifest in cfg.Dir and starts watching the directory;
// Run handles the changes. It fails when the directory cannot be read or a
// manifest does not parse (a *ParseError naming the file and line): at
// start-up a broken manifest is the user's to fix. Later, a file that stops
// parsing is logged and keeps what it described before.
func New(ctx context.Context, cfg Config) (*Source, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Debounce == 0 {
		cfg.Debounce = defaultDebounce
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("manifest directory: %w", err)
	}
	cfg.Dir = dir
	if info, err := os.Stat(cfg.Dir); err != nil {
		return nil, fmt.Errorf("manifest directory: %w", err)
	} else if !info.IsDir() {
		return nil, fmt.Errorf("manifest directory %s is not a directory", cfg.Dir)
	}
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watching manifest directory %s: %w", cfg.Dir, err)
	}
	// Watch before the first read: a change in between is seen by Run.
	if err := watcher.Add(cfg.Dir); err != nil {
		_ = watcher.Close()
		return nil, fmt.Errorf("watching manifest directory %s: %w", cfg.Dir, err)
	}
	s := &Source{
		cfg:     cfg,
		logger:  klog.FromContext(ctx).WithName("manifests"),
		watcher: watcher,
		queue: workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[string]{
			Name: "manifests",
		}),
		files:    map[string][]object{},
		view:     newEmptyView(),
		idx:      newIndex(cfg.NodeName),
		refs:     map[types.UID]source.References{},
		pvcUsers: map[cache.ObjectName]map[types.UID]struct{}{},
		pvUsers:  map[string]map[types.UID]struct{}{},
	}
	files, errs := s.readAll()
	// An empty file at start-up simply holds nothing.
	errs = slices.DeleteFunc(errs, func(err error) bool { return errors.Is(err, errEmptyFile) })
	if len(errs) > 0 {
		_ = watcher.Close()
		s.queue.ShutDown()
		if len(errs) > 1 {
			return nil, fmt.Errorf("%w (and %d more manifests with errors)", errs[0], len(errs)-1)
		}
		return nil, errs[0]
	}
	var notes []string
	for _, name := range slices.Sorted(maps.Keys(files)) {
		s.files[name] = files[name]
		notes = append(notes, s.idx.setFile(s.view, name, nil, files[name], &changes{})...)
	}
	s.logNotes(notes)
	s.logger.V(2).Info("Read manifest directory", "dir", cfg.Dir, "files", len(files), "pods", len(s.view.pods))
	return s, nil
}

// readAll parses every manifest file of the directory, in name order. It
// returns the files that parsed and an error per file that did not.
func (s *Source) readAll() (map[string][]object, []error) {
	entries, err := os.ReadDir(s.cfg.Dir)
	if err != nil {
		return nil, []error{fmt.Errorf("reading manifest directory: %w", err)}
	}
	files := map[string][]object{}
	var errs []error
	for _, e := range entries {
		if e.IsDir() || !isManifestName(e.Name()) {
			continue
		}
		objs, err := s.readFile(e.Name())
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			errs = append(errs, err)
		default:
			files[e.Name()] = objs
		}
	}
	return files, errs
}

// errEmptyFile is returned by readFile for a file of zero bytes.
var errEmptyFile = errors.New("manifest file is empty")

// readFile reads and parses one manifest file by base name. A file of zero
// bytes yields errEmptyFile: it is most likely being written (truncated,
// then written), so a change to it is not applied; remove a file to remove
// its objects.
func (s *Source) readFile(name string) ([]object, error) {
	path := filepath.Join(s.cfg.Dir, name)
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading manifest: %w", err)
	}
	if len(data) == 0 {
		return nil, &ParseError{File: path, Line: 1, Err: errEmptyFile}
	}
	return parseFile(path, data)
}

// HasSynced is always true: New reads the whole directory.
func (s *Source) HasSynced() bool { return true }

// Pod returns this node's pod with the given UID.
func (s *Source) Pod(uid types.UID) (*corev1.Pod, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	pod, ok := s.view.pods[uid]
	return pod, ok
}

// PodByName returns this node's pod namespace/name.
func (s *Source) PodByName(namespace, name string) (*corev1.Pod, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	uid, ok := s.view.podNames[cache.ObjectName{Namespace: namespace, Name: name}]
	if !ok {
		return nil, false
	}
	return s.view.pods[uid], true
}

// Pods returns every pod of this node, sorted by namespace and name.
func (s *Source) Pods() []*corev1.Pod {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]*corev1.Pod, 0, len(s.view.pods))
	for _, name := range slices.SortedFunc(maps.Keys(s.view.podNames), compareNames) {
		out = append(out, s.view.pods[s.view.podNames[name]])
	}
	return out
}

// PVC returns a claim, bound to its volume when the manifests bind them
// (see the package documentation); the API's NotFound when no manifest
// defines it.
func (s *Source) PVC(namespace, name string) (*corev1.PersistentVolumeClaim, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	pvc, ok := s.view.pvcs[cache.ObjectName{Namespace: namespace, Name: name}]
	if !ok {
		return nil, apierrors.NewNotFound(corev1.Resource("persistentvolumeclaims"), name)
	}
	return pvc, nil
}

// PV returns a PersistentVolume; the API's NotFound when no manifest
// defines it.
func (s *Source) PV(name string) (*corev1.PersistentVolume, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	pv, ok := s.view.pvs[name]
	if !ok {
		return nil, apierrors.NewNotFound(corev1.Resource("persistentvolumes"), name)
	}
	return pv, nil
}

// GetSecret returns the data of a Secret defined in the manifests (data
// and stringData merged). Errors name the Secret, never its content; a
// missing Secret is the API's NotFound.
func (s *Source) GetSecret(_ context.Context, namespace, name string) (map[string]string, error) {
	if name == "" || namespace == "" {
		return nil, fmt.Errorf("%w: Secret reference %q/%q needs a namespace and a name", volume.ErrInvalidSpec, namespace, name)
	}
	s.mu.RLock()
	secret, ok := s.view.secrets[cache.ObjectName{Namespace: namespace, Name: name}]
	s.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("getting Secret %s/%s: %w", namespace, name, apierrors.NewNotFound(corev1.Resource("secrets"), name))
	}
	data := make(map[string]string, len(secret.Data))
	for k, v := range secret.Data {
		data[k] = string(v)
	}
	return data, nil
}

// AddReferences adds to the claims and volumes a pod references: when one
// of them changes in the manifests, the pod is reported to OnPodChange.
func (s *Source) AddReferences(pod types.UID, refs source.References) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.refs[pod]
	for _, n := range refs.PVCs {
		if !slices.Contains(cur.PVCs, n) {
			cur.PVCs = append(cur.PVCs, n)
			addUser(s.pvcUsers, n, pod)
		}
	}
	for _, n := range refs.PVs {
		if !slices.Contains(cur.PVs, n) {
			cur.PVs = append(cur.PVs, n)
			addUser(s.pvUsers, n, pod)
		}
	}
	s.refs[pod] = cur
}

func addUser[K comparable](users map[K]map[types.UID]struct{}, key K, pod types.UID) {
	if users[key] == nil {
		users[key] = map[types.UID]struct{}{}
	}
	users[key][pod] = struct{}{}
}

func removeUser[K comparable](users map[K]map[types.UID]struct{}, key K, pod types.UID) {
	delete(users[key], pod)
	if len(users[key]) == 0 {
		delete(users, key)
	}
}

// SetReferences replaces the claims and volumes a pod references; empty
// References forget the pod. VolumeAttachments are not watched here: in
// standalone mode the agent attaches volumes itself (lifecycle/localattach).
func (s *Source) SetReferences(pod types.UID, refs source.References) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.refs[pod]
	for _, n := range old.PVCs {
		removeUser(s.pvcUsers, n, pod)
	}
	for _, n := range old.PVs {
		removeUser(s.pvUsers, n, pod)
	}
	if len(refs.PVCs) == 0 && len(refs.PVs) == 0 {
		delete(s.refs, pod)
		return
	}
	s.refs[pod] = source.References{PVCs: slices.Clone(refs.PVCs), PVs: slices.Clone(refs.PVs)}
	for _, n := range refs.PVCs {
		addUser(s.pvcUsers, n, pod)
	}
	for _, n := range refs.PVs {
		addUser(s.pvUsers, n, pod)
	}
}

// OnPodChange subscribes fn to "this pod needs re-evaluation": its
// manifest was added, changed or removed, or a claim or volume it
// references changed. fn must not block.
func (s *Source) OnPodChange(fn func(uid types.UID)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.podHandlers = append(s.podHandlers, fn)
}

// users returns the pods that reference any of the changed claims or
// volumes. mu must be held.
func (s *Source) usersLocked(c changes) []types.UID {
	var out []types.UID
	for _, n := range c.pvcs {
		for uid := range s.pvcUsers[n] {
			out = append(out, uid)
		}
	}
	for _, n := range c.pvs {
		for uid := range s.pvUsers[n] {
			out = append(out, uid)
		}
	}
	return out
}
