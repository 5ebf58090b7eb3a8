package source

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// Config configures a Source.
type Config struct {
	// Client talks to the API server. Required.
	Client kubernetes.Interface
	// NodeName is the node whose pods the Source serves. Required.
	NodeName string
	// ClusterWideInformers caches all PersistentVolumeClaims,
	// PersistentVolumes and VolumeAttachments of the cluster through
	// cluster-wide informers instead of watching each referenced object by
	// name. It saves one watch per referenced object, at the price of
	// memory and API server load that grow with the cluster: only for small
	// clusters.
	ClusterWideInformers bool
	// SettledObjectResync, when positive, ends the by-name watch of a
	// referenced object once it settled (a claim or volume bound, an
	// attachment attached; settle.go) and reads it again with a GET about
	// this often instead; 0 watches every referenced object for as long
	// as it is referenced. A settled claim is read again at most a minute
	// apart (settle.go).
	SettledObjectResync time.Duration
	// GetOnly reads the referenced PersistentVolumeClaims,
	// PersistentVolumes and VolumeAttachments with GETs only, the way the
	// kubelet reads: no LIST (every first read is a GET) and no WATCH. It
	// is how the agent reads as its Node (user system:node:<name>, group
	// system:nodes) under the API server's Node authorizer, which lets a
	// node GET only those objects related to its pods and nothing else.
	// An object that is not settled (or missing) is polled with GETs, from
	// 500 ms apart up to 8 s, instead of watched; a settled one is read
	// again every SettledObjectResync, which must be positive. That
	// authorizer answers Forbidden, not NotFound, for an object not (yet)
	// related to the node: a VolumeAttachment that is Forbidden counts as
	// missing (not attached yet), and a claim's or volume's Forbidden as
	// an error that may pass (its graph lags behind a binding) for 30 s
	// before the object counts as unreadable. Excludes
	// ClusterWideInformers.
	GetOnly bool
}

// Validate checks the required fields.
func (c Config) Validate() error {
	var errs []error
	if c.Client == nil {
		errs = append(errs, errors.New("source: Client is required"))
	}
	if c.NodeName == "" {
		errs = append(errs, errors.New("source: NodeName is required"))
	}
	if c.GetOnly && c.ClusterWideInformers {
		errs = append(errs, errors.New("source: GetOnly excludes ClusterWideInformers, which list and watch"))
	}
	if c.GetOnly && c.SettledObjectResync <= 0 {
		errs = append(errs, errors.New("source: GetOnly needs a positive SettledObjectResync: without watches, settled objects are read again that often"))
	}
	return errors.Join(errs...)
}

// Source serves this node's pods and the objects they reference from
// caches, and turns changes into notifications. Objects returned by its
// getters are shared with the caches: never modify them.
//
// The populator declares each pod's References; an object is watched from
// its first reference until its last one goes (in by-name mode; read with
// GETs in GET-only mode), and every change to it is reported to
// OnPodChange subscribers as the UIDs of the pods referencing it. A
// just-referenced object reads as ErrNotSynced until its watch has listed
// it (its first GET has answered), and its referencing pods are notified
// then.
type Source struct {
	cfg     Config
	logger  klog.Logger
	podsReg cache.ResourceEventHandlerRegistration
	// fresh says whether the pod cache may be missing pods (podsfresh.go).
	fresh  *podsFreshness
	podInf cache.SharedIndexInformer
	// podWatch records the pod informer's failures (CheckPodWatch).
	podWatch *watchHealth
	podF     informers.SharedInformerFactory
	clusterF informers.SharedInformerFactory // nil in by-name mode
	caches   map[Kind]objectCache            // PVC, PV, VolumeAttachment
	runOnce  sync.Once

	// mu protects refs, users, podNames, podKeys and the subscriber lists.
	mu sync.Mutex
	// refs are the references each pod declared.
	refs map[types.UID]*podRefs
	// users are the pods referencing each object.
	users map[refKey]map[types.UID]struct{}
	// podNames maps a pod's namespace/name to its UID, for deletions whose
	// final state is unknown.
	podNames map[cache.ObjectName]types.UID
	// podKeys is the inverse of podNames: a pod's namespace/name by UID.
	podKeys            map[types.UID]cache.ObjectName
	podHandlers        []func(types.UID)
	attachmentHandlers []func(volume.Name)
}

// refKey identifies a referenced object.
type refKey struct {
	kind Kind
	name cache.ObjectName
}

// podRefs are one pod's references.
type podRefs struct {
	keys map[refKey]struct{}
	// attachVolumes are the volumes waiting for each VolumeAttachment.
	attachVolumes map[string][]volume.Name
}

// New returns a Source for cfg. Event handlers log through the logger in
// ctx. Subscribe (OnPodChange, ...) before Run to see every event.
func New(ctx context.Context, cfg Config) (*Source, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx).WithName("source")
	s := &Source{
		cfg:      cfg,
		logger:   logger,
		caches:   make(map[Kind]objectCache),
		refs:     make(map[types.UID]*podRefs),
		users:    make(map[refKey]map[types.UID]struct{}),
		podNames: make(map[cache.ObjectName]types.UID),
		podKeys:  make(map[types.UID]cache.ObjectName),
		fresh:    &podsFreshness{},
	}
	if err := s.setupPods(); err != nil {
		return nil, err
	}
	if err := s.setupObjects(); err != nil {
		return nil, err
	}
	return s, nil
}

// setupObjects creates the caches of the referenced kinds.
func (s *Source) setupObjects() error {
	client := s.cfg.Client
	core, storage := client.CoreV1(), client.StorageV1()

	if s.cfg.ClusterWideInformers {
		s.clusterF = informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(stripManagedFields))
		for kind, inf := range map[Kind]cache.SharedIndexInformer{
			KindPersistentVolumeClaim: s.clusterF.Core().V1().PersistentVolumeClaims().Informer(),
			KindPersistentVolume:      s.clusterF.Core().V1().PersistentVolumes().Informer(),
			KindVolumeAttachment:      s.clusterF.Storage().V1().VolumeAttachments().Informer(),
		} {
			c, err := newInformerCache(s.logger, kind, resourceOf(kind), inf, s.objectChanged(kind))
			if err != nil {
				return err
			}
			s.caches[kind] = c
		}
		return nil
	}
	s.caches[KindPersistentVolumeClaim] = newByNameCache(KindPersistentVolumeClaim, resourceOf(KindPersistentVolumeClaim),
		&corev1.PersistentVolumeClaim{}, listWatchFuncs{
			get: func(ctx context.Context, ns, name string) (runtime.Object, error) {
				return core.PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
			},
			list: func(ctx context.Context, ns string, o metav1.ListOptions) (runtime.Object, error) {
				return core.PersistentVolumeClaims(ns).List(ctx, o)
			},
			watch: func(ctx context.Context, ns string, o metav1.ListOptions) (watch.Interface, error) {
				return core.PersistentVolumeClaims(ns).Watch(ctx, o)
			},
			newList: func() runtime.Object { return &corev1.PersistentVolumeClaimList{} },
		}, s.objectChanged(KindPersistentVolumeClaim))
	s.caches[KindPersistentVolume] = newByNameCache(KindPersistentVolume, resourceOf(KindPersistentVolume),
		&corev1.PersistentVolume{}, listWatchFuncs{
			get: func(ctx context.Context, _, name string) (runtime.Object, error) {
				return core.PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
			},
			list: func(ctx context.Context, _ string, o metav1.ListOptions) (runtime.Object, error) {
				return core.PersistentVolumes().List(ctx, o)
			},
			watch: func(ctx context.Context, _ string, o metav1.ListOptions) (watch.Interface, error) {
				return core.PersistentVolumes().Watch(ctx, o)
			},
			newList: func() runtime.Object { return &corev1.PersistentVolumeList{} },
		}, s.objectChanged(KindPersistentVolume))
	s.caches[KindVolumeAttachment] = newByNameCache(KindVolumeAttachment, resourceOf(KindVolumeAttachment),
		&storagev1.VolumeAttachment{}, listWatchFuncs{
			get: func(ctx context.Context, _, name string) (runtime.Object, error) {
				return storage.VolumeAttachments().Get(ctx, name, metav1.GetOptions{})
			},
			list: func(ctx context.Context, _ string, o metav1.ListOptions) (runtime.Object, error) {
				return storage.VolumeAttachments().List(ctx, o)
			},
			watch: func(ctx context.Context, _ string, o metav1.ListOptions) (watch.Interface, error) {
				return storage.VolumeAttachments().Watch(ctx, o)
			},
			newList: func() runtime.Object { return &storagev1.VolumeAttachmentList{} },
		}, s.objectChanged(KindVolumeAttachment))
	for kind, c := range s.caches {
		if b, ok := c.(*byNameCache); ok {
			b.settling = newSettling(kind, s.cfg.SettledObjectResync)
			b.getOnly = s.cfg.GetOnly
		}
	}
	return nil
}

// Run starts the pod informer and the watches, and blocks until ctx ends;
// then it stops them all and returns once they have stopped. Call it once.
func (s *Source) Run(ctx context.Context) {
	ran := false
	s.runOnce.Do(func() { ran = true })
	if !ran {
		s.logger.Error(nil, "Source.Run called more than once")
		return
	}
	ctx = klog.NewContext(ctx, s.logger)
	s.logger.V(2).Info("Starting sources", "node", s.cfg.NodeName, "clusterWideInformers", s.cfg.ClusterWideInformers, "getOnly", s.cfg.GetOnly)
	s.podF.Start(ctx.Done())
	if s.clusterF != nil {
		s.clusterF.Start(ctx.Done())
	}
	var wg sync.WaitGroup
	wg.Go(func() { s.runFreshness(ctx) })
	for _, c := range s.byNameCaches() {
		wg.Go(func() { c.run(ctx) })
	}
	<-ctx.Done()
	s.podF.Shutdown()
	if s.clusterF != nil {
		s.clusterF.Shutdown()
	}
	wg.Wait()
	s.logger.V(2).Info("Stopped sources")
}

func (s *Source) byNameCaches() []*byNameCache {
	var out []*byNameCache
	for _, c := range s.caches {
		if b, ok := c.(*byNameCache); ok {
			out = append(out, b)
		}
	}
	return out
}

// HasSynced tells whether the pods of the node and (with
// ClusterWideInformers) the cluster-wide caches have been listed. Caches of
// individual referenced objects sync later and report ErrNotSynced until
// then.
func (s *Source) HasSynced() bool {
	if !s.podsReg.HasSynced() {
		return false
	}
	for _, c := range s.caches {
		if !c.hasSynced() {
			return false
		}
	}
	return true
}

// Stats tells how many watches are open and how many objects are cached.
func (s *Source) Stats() Stats {
	st := Stats{Watches: map[Kind]int{KindPod: 1}, Objects: map[Kind]int{}}
	st.Objects[KindPod] = len(s.podInf.GetIndexer().ListKeys())
	for kind, c := range s.caches {
		st.Watches[kind], st.Objects[kind] = c.stats()
	}
	return st
}

// OnPodChange subscribes fn to "this pod needs re-evaluation": the pod was
// added, updated (a new resourceVersion) or deleted, or an object it
// references (AddReferences, SetReferences) changed, was deleted or was
// first listed. fn runs on an informer or watch goroutine and must not block.
func (s *Source) OnPodChange(fn func(uid types.UID)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.podHandlers = append(s.podHandlers, fn)
}

// OnAttachmentChange subscribes fn to changes of referenced
// VolumeAttachments (including their first listing and their deletion),
// reported as the volumes waiting for them (References.Attachments). fn
// must not block.
func (s *Source) OnAttachmentChange(fn func(volume.Name)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.attachmentHandlers = append(s.attachmentHandlers, fn)
}

func (s *Source) notifyPods(uids []types.UID) {
	if len(uids) == 0 {
		return
	}
	s.mu.Lock()
	handlers := s.podHandlers
	s.mu.Unlock()
	for _, fn := range handlers {
		for _, uid := range uids {
			fn(uid)
		}
	}
}

// objectChanged returns the change callback of a referenced kind: it tells
// the pods referencing the object, and for VolumeAttachments the volumes
// waiting for it.
func (s *Source) objectChanged(kind Kind) func(cache.ObjectName) {
	return func(name cache.ObjectName) {
		key := refKey{kind: kind, name: name}
		s.mu.Lock()
		var (
			uids []types.UID
			vols []volume.Name
		)
		for uid := range s.users[key] {
			uids = append(uids, uid)
			if kind == KindVolumeAttachment {
				for _, v := range s.refs[uid].attachVolumes[name.Name] {
					if !slices.Contains(vols, v) {
						vols = append(vols, v)
					}
				}
			}
		}
		attachHandlers := s.attachmentHandlers
		if kind == KindPersistentVolumeClaim {
			s.refreshVolumesLocked(uids)
		}
		s.mu.Unlock()
		if len(uids) == 0 {
			return // not referenced (any more): nobody to tell
		}
		s.logger.V(5).Info("Referenced object changed", "kind", kind, "object", name, "pods", len(uids))
		if kind == KindVolumeAttachment {
			for _, fn := range attachHandlers {
				for _, v := range vols {
					fn(v)
				}
			}
			return
		}
		s.notifyPods(uids)
	}
}

func resourceOf(kind Kind) schema.GroupResource {
	switch kind {
	case KindPersistentVolumeClaim:
		return corev1.Resource("persistentvolumeclaims")
	case KindPersistentVolume:
		return corev1.Resource("persistentvolumes")
	case KindVolumeAttachment:
		return storagev1.Resource("volumeattachments")
	case KindPod:
		return corev1.Resource("pods")
	}
	return schema.GroupResource{Resource: string(kind)}
}

// refreshVolumesLocked reads the settled PersistentVolumes of the pods
// again now: a claim changed, and an expansion changes the volume first
// (settle.go). mu must be held.
func (s *Source) refreshVolumesLocked(uids []types.UID) {
	pvs, ok := s.caches[KindPersistentVolume].(*byNameCache)
	if !ok {
		return
	}
	for _, uid := range uids {
		pr := s.refs[uid]
		if pr == nil {
			continue
		}
		for key := range pr.keys {
			if key.kind == KindPersistentVolume {
				pvs.refresh(key.name)
			}
		}
	}
}
