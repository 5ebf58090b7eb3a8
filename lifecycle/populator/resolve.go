package populator

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/source"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

const (
	// pvcProtectionFinalizer keeps a claim in use from being deleted; a
	// claim being deleted without it is not used (as the kubelet).
	pvcProtectionFinalizer = "kubernetes.io/pvc-protection"
)

// resolver resolves the volumes of one pod. It is used by one goroutine.
type resolver struct {
	logger  klog.Logger
	p       *Populator
	pod     *corev1.Pod
	info    volume.PodInfo
	fsGroup *int64
	// fsGroupPolicy is the pod's fsGroupChangePolicy.
	fsGroupPolicy *corev1.PodFSGroupChangePolicy
	mounts        sets.Set[string]
	devices       sets.Set[string]
	// previous are the pod's current desired uses by spec name: a volume
	// that was resolved once is kept when resolving it again fails (a
	// running pod's volume is never torn down because, e.g., its claim is
	// being deleted) or names another volume (its PV was replaced), as the
	// kubelet, which resolves a pod once.
	previous map[string]dsw.Use
	refs     source.References
	res      resolution
}

// resolution is the outcome of resolving a pod.
type resolution struct {
	uses []dsw.Use
	errs []dsw.VolumeError
	refs source.References
	// pending: some referenced object is not cached yet; nothing is to be
	// written until the Source reports it.
	pending bool
	// unreadable is why some referenced object cannot be read: the pod is
	// resolved without it, and resolved again with backoff.
	unreadable error
}

// claimVolume is a pod volume backed by a claim.
type claimVolume struct {
	spec      string
	claim     string
	readOnly  bool
	ephemeral bool
	pvc       *corev1.PersistentVolumeClaim
}

func (p *Populator) newResolver(logger klog.Logger, pod *corev1.Pod, previous []dsw.Use) *resolver {
	r := &resolver{
		logger: logger,
		p:      p,
		pod:    pod,
		info: volume.PodInfo{
			UID:            pod.UID,
			Namespace:      pod.Namespace,
			Name:           pod.Name,
			ServiceAccount: pod.Spec.ServiceAccountName,
		},
		previous: make(map[string]dsw.Use, len(previous)),
	}
	if sc := pod.Spec.SecurityContext; sc != nil && sc.FSGroup != nil {
		g := *sc.FSGroup
		r.fsGroup = &g
	}
	if sc := pod.Spec.SecurityContext; sc != nil && sc.FSGroupChangePolicy != nil {
		p := *sc.FSGroupChangePolicy
		r.fsGroupPolicy = &p
	}
	for _, u := range previous {
		r.previous[u.Volume.SpecName] = u
	}
	r.mounts, r.devices = podVolumeNames(pod)
	return r
}

// podVolumeNames returns the names of the volumes the pod's containers,
// init containers and ephemeral containers mount and map.
func podVolumeNames(pod *corev1.Pod) (mounts, devices sets.Set[string]) {
	mounts, devices = sets.New[string](), sets.New[string]()
	add := func(c *corev1.Container) {
		for _, m := range c.VolumeMounts {
			mounts.Insert(m.Name)
		}
		for _, d := range c.VolumeDevices {
			devices.Insert(d.Name)
		}
	}
	visitContainers(pod, add)
	return mounts, devices
}

// visitContainers calls fn with every init, regular and ephemeral
// container of the pod.
func visitContainers(pod *corev1.Pod, fn func(*corev1.Container)) {
	for i := range pod.Spec.InitContainers {
		fn(&pod.Spec.InitContainers[i])
	}
	for i := range pod.Spec.Containers {
		fn(&pod.Spec.Containers[i])
	}
	for i := range pod.Spec.EphemeralContainers {
		fn((*corev1.Container)(&pod.Spec.EphemeralContainers[i].EphemeralContainerCommon))
	}
}

// resolve resolves every used volume. Invalid specs and objects that
// cannot be read become VolumeErrors.
func (r *resolver) resolve() resolution {
	var claims []*claimVolume
	seen := sets.New[string]()
	for i := range r.pod.Spec.Volumes {
		v := &r.pod.Spec.Volumes[i]
		if seen.Has(v.Name) || (!r.mounts.Has(v.Name) && !r.devices.Has(v.Name)) {
			continue // a duplicate name (never valid), or not used by any container
		}
		seen.Insert(v.Name)
		switch {
		case v.PersistentVolumeClaim != nil:
			claims = append(claims, &claimVolume{spec: v.Name, claim: v.PersistentVolumeClaim.ClaimName,
				readOnly: v.PersistentVolumeClaim.ReadOnly})
		case v.Ephemeral != nil:
			// A generic ephemeral volume is the claim <pod>-<volume>, which
			// must be controlled by the pod (component-helpers ephemeral).
			claims = append(claims, &claimVolume{spec: v.Name, claim: r.pod.Name + "-" + v.Name, ephemeral: true})
		case v.CSI != nil:
			r.inline(v.Name, v.CSI)
		case translator.IsInlineMigratable(v):
			r.inTreeInline(v)
		}
		// Other volume types are not CSI volumes: not ours.
	}
	if len(claims) == 0 {
		r.res.refs = r.refs
		return r.res
	}

	for _, c := range claims {
		if c.claim != "" {
			r.refs.PVCs = append(r.refs.PVCs, cache.ObjectName{Namespace: r.pod.Namespace, Name: c.claim})
		}
	}
	r.p.cfg.Source.AddReferences(r.pod.UID, r.refs)
	var bound []*claimVolume
	for _, c := range claims {
		if r.claim(c) {
			bound = append(bound, c)
			r.refs.PVs = append(r.refs.PVs, c.pvc.Spec.VolumeName)
		}
	}
	if len(bound) > 0 {
		r.p.cfg.Source.AddReferences(r.pod.UID, r.refs)
	}
	for _, c := range bound {
		r.persistent(c)
	}
	r.res.refs = r.refs
	r.dedupe()
	return r.res
}

// claim checks a volume's claim; ok means it is bound and its PV is next.
func (r *resolver) claim(c *claimVolume) bool {
	key := r.pod.Namespace + "/" + c.claim
	if c.claim == "" {
		r.fail(c.spec, invalid("the volume names no PVC"))
		return false
	}
	pvc, err := r.p.cfg.Source.PVC(r.pod.Namespace, c.claim)
	switch {
	case errors.Is(err, source.ErrNotSynced):
		r.res.pending = true
		return false
	case apierrors.IsNotFound(err):
		r.fail(c.spec, invalid("PVC %q not found", key))
		return false
	case err != nil:
		r.unreadable(c.spec, fmt.Sprintf("PVC %q", key), err)
		return false
	}
	switch {
	case c.ephemeral && (pvc.Namespace != r.pod.Namespace || !metav1.IsControlledBy(pvc, r.pod)):
		r.fail(c.spec, invalid("PVC %q was not created for pod %s/%s (pod is not owner)", key, r.pod.Namespace, r.pod.Name))
	case pvc.DeletionTimestamp != nil && !slices.Contains(pvc.Finalizers, pvcProtectionFinalizer):
		r.fail(c.spec, invalid("PVC %q is being deleted", key))
	case pvc.Status.Phase != corev1.ClaimBound:
		r.fail(c.spec, invalid("PVC %q is not bound", key))
	case pvc.Spec.VolumeName == "":
		r.fail(c.spec, invalid("PVC %q is bound but names no PV (empty spec.volumeName)", key))
	default:
		c.pvc = pvc
		return true
	}
	return false
}

// persistent resolves the PV of a bound claim.
func (r *resolver) persistent(c *claimVolume) {
	pvName, claimKey := c.pvc.Spec.VolumeName, c.pvc.Namespace+"/"+c.pvc.Name
	pv, err := r.p.cfg.Source.PV(pvName)
	switch {
	case errors.Is(err, source.ErrNotSynced):
		r.res.pending = true
		return
	case apierrors.IsNotFound(err):
		r.fail(c.spec, invalid("PV %q of PVC %q not found", pvName, claimKey))
		return
	case err != nil:
		r.unreadable(c.spec, fmt.Sprintf("PV %q of PVC %q", pvName, claimKey), err)
		return
	}
	pv, migrated, err := r.translateInTree(pv)
	if err != nil {
		r.fail(c.spec, err)
		return
	}
	switch {
	case pv.Spec.ClaimRef == nil:
		r.fail(c.spec, invalid("PV %q is not bound to PVC %q (no claimRef)", pvName, claimKey))
	case pv.Spec.ClaimRef.UID != c.pvc.UID:
		r.fail(c.spec, invalid("PV %q is bound to another claim (claimRef UID %q, PVC %q has UID %q)",
			pvName, pv.Spec.ClaimRef.UID, claimKey, c.pvc.UID))
	default:
		r.csiPV(c.spec, pv, c.readOnly, migrated, fmt.Sprintf("PV %q", pvName))
	}
}

// csiPV resolves the CSI source of a PersistentVolume: a claim's PV, or
// the PV an in-tree inline volume translates to (migrated). what names it
// in messages.
func (r *resolver) csiPV(spec string, pv *corev1.PersistentVolume, readOnly, migrated bool, what string) {
	csi := pv.Spec.CSI
	affinityErr := r.nodeAffinity(pv)
	accessType := volume.Filesystem
	if pv.Spec.VolumeMode != nil && *pv.Spec.VolumeMode == corev1.PersistentVolumeBlock {
		accessType = volume.Block
	}
	switch {
	case csi == nil:
		r.fail(spec, invalid("%s is not a CSI volume", what))
	case csi.Driver == "" || csi.VolumeHandle == "":
		r.fail(spec, invalid("%s has no CSI driver or volumeHandle", what))
	case r.mounts.Has(spec) && accessType != volume.Filesystem:
		r.fail(spec, invalid("%s has volumeMode Block, but is used in volumeMounts", what))
	case r.devices.Has(spec) && accessType != volume.Block:
		r.fail(spec, invalid("%s has volumeMode Filesystem, but is used in volumeDevices", what))
	case !r.p.cfg.Policies.Get(csi.Driver).SupportsLifecycleMode(storagev1.VolumeLifecyclePersistent):
		r.fail(spec, invalid("CSI driver %q does not support Persistent volumes (%s)", csi.Driver, what))
	case affinityErr != nil:
		r.fail(spec, affinityErr)
	default:
		pol := r.p.cfg.Policies.Get(csi.Driver)
		name := volume.PersistentName(csi.Driver, csi.VolumeHandle)
		context, err := r.seLinuxContext(spec, pol, pv.Spec.AccessModes)
		if err == nil {
			err = r.seLinuxConflict(name, pv.Name, context, pol)
		}
		if err != nil {
			r.fail(spec, err)
			return
		}
		src := volume.Source{
			ID:             volume.ID{Driver: csi.Driver, Handle: csi.VolumeHandle, PVName: pv.Name, AccessType: accessType},
			Migrated:       migrated,
			AccessModes:    slices.Clone(pv.Spec.AccessModes),
			FSType:         csi.FSType,
			MountOptions:   slices.Clone(pv.Spec.MountOptions),
			Attributes:     maps.Clone(csi.VolumeAttributes),
			StageSecret:    secretRef(csi.NodeStageSecretRef),
			PublishSecret:  secretRef(csi.NodePublishSecretRef),
			ExpandSecret:   secretRef(csi.NodeExpandSecretRef),
			GID:            r.volumeGID(pv),
			SELinuxContext: context,
		}
		if q, ok := pv.Spec.Capacity[corev1.ResourceStorage]; ok {
			src.CapacityBytes = q.Value()
		}
		if pol.AttachRequired {
			r.refs.Attachments = append(r.refs.Attachments, source.Attachment{
				Name:   volume.AttachmentName(src.Handle, src.Driver, r.p.cfg.NodeName),
				Volume: name,
			})
		}
		r.use(name, src, spec, readOnly)
	}
}

// inline resolves a CSI inline (ephemeral) volume.
func (r *resolver) inline(spec string, csi *corev1.CSIVolumeSource) {
	switch {
	case csi.Driver == "":
		r.fail(spec, invalid("CSI inline volume has no driver"))
	case r.devices.Has(spec):
		r.fail(spec, invalid("CSI inline volume of driver %q cannot be used in volumeDevices", csi.Driver))
	case !r.p.cfg.Policies.Get(csi.Driver).SupportsLifecycleMode(storagev1.VolumeLifecycleEphemeral):
		r.fail(spec, invalid("CSI driver %q does not support inline (Ephemeral) volumes", csi.Driver))
	default:
		src := volume.Source{
			ID:          volume.ID{Driver: csi.Driver, Handle: volume.InlineHandle(r.pod.UID, spec), AccessType: volume.Filesystem},
			Inline:      true,
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Attributes:  maps.Clone(csi.VolumeAttributes),
		}
		if csi.FSType != nil {
			src.FSType = *csi.FSType
		}
		if ref := csi.NodePublishSecretRef; ref != nil {
			src.PublishSecret = &volume.SecretRef{Namespace: r.pod.Namespace, Name: ref.Name}
		}
		r.use(volume.InlineName(r.pod.UID, spec), src, spec, csi.ReadOnly != nil && *csi.ReadOnly)
	}
}

func (r *resolver) use(name volume.Name, src volume.Source, spec string, readOnly bool) {
	if prev, ok := r.previous[spec]; ok && prev.Name != name && r.published(prev) {
		// The pod's volume now resolves to another volume: its PV was
		// replaced by one with another CSI source, or its claim was
		// recreated and bound to another PV. The pod keeps the volume it
		// has, as with the kubelet, which resolves a pod once; a new pod
		// gets the new one. Tearing the old one down would take it from
		// under the running pod. A volume the pod was only about to get
		// (resolved from a cache that had not yet seen the change) is
		// not kept: nobody uses it.
		r.logger.V(2).Info("Keeping the volume of a running pod: its spec now resolves to another volume",
			"specName", spec, "volume", prev.Name, "resolvesTo", name)
		r.keepAttachment(prev)
		r.res.uses = append(r.res.uses, prev)
		return
	}
	r.res.uses = append(r.res.uses, dsw.Use{
		Name:   name,
		Source: src,
		Volume: volume.PodVolume{Pod: r.info, SpecName: spec, ReadOnly: readOnly, FSGroup: r.fsGroup,
			FSGroupChangePolicy: r.fsGroupPolicy},
	})
}

// published says whether the pod's previous use is published (or may be).
func (r *resolver) published(u dsw.Use) bool {
	pub := r.p.cfg.Published
	return pub == nil || pub.Published(volume.PodKey{Volume: u.Name, Pod: r.pod.UID})
}

// fail records why a volume cannot be resolved, or keeps its previous
// resolution (see resolver.previous).
func (r *resolver) fail(spec string, err error) {
	if prev, ok := r.previous[spec]; ok {
		r.logger.V(2).Info("Keeping the desired volume of a running pod although it no longer resolves",
			"volume", prev.Name, "specName", spec, "reason", err.Error())
		r.keepAttachment(prev)
		r.res.uses = append(r.res.uses, prev)
		return
	}
	r.res.errs = append(r.res.errs, dsw.VolumeError{SpecName: spec, Err: err})
}

// unreadable records that an object the volume needs (what) cannot be read
// (issue 23, 1: a pod waiting for it for ever kept the whole node from
// settling). The volume is resolved as failed with the reason, or keeps
// the resolution it has (fail); the pod is resolved again with backoff,
// and when the Source reports the object.
func (r *resolver) unreadable(spec, what string, err error) {
	e := &unreadableError{msg: fmt.Sprintf("cannot read %s: %v", what, err), err: err}
	if r.res.unreadable == nil {
		r.res.unreadable = e
	}
	r.fail(spec, e)
}

// unreadableError is a read of an object that failed: it wraps
// volume.ErrUnreadable and the read's error.
type unreadableError struct {
	msg string
	err error
}

func (e *unreadableError) Error() string { return e.msg }

// Unwrap makes errors.Is(err, volume.ErrUnreadable) hold, and the API's
// error reachable.
func (e *unreadableError) Unwrap() []error { return []error{volume.ErrUnreadable, e.err} }

// keepAttachment keeps watching the VolumeAttachment of a kept volume.
func (r *resolver) keepAttachment(u dsw.Use) {
	if u.Source.Inline || !r.p.cfg.Policies.Get(u.Source.Driver).AttachRequired {
		return
	}
	r.refs.Attachments = append(r.refs.Attachments, source.Attachment{
		Name:   volume.AttachmentName(u.Source.Handle, u.Source.Driver, r.p.cfg.NodeName),
		Volume: u.Name,
	})
}

// dedupe keeps one use per volume Name: two of a pod's volumes can name the
// same claim. The first (in pod spec order) stays; it is read-only only if
// all are.
func (r *resolver) dedupe() {
	out := r.res.uses[:0]
	index := make(map[volume.Name]int, len(r.res.uses))
	for _, u := range r.res.uses {
		if i, ok := index[u.Name]; ok {
			out[i].Volume.ReadOnly = out[i].Volume.ReadOnly && u.Volume.ReadOnly
			continue
		}
		index[u.Name] = len(out)
		out = append(out, u)
	}
	r.res.uses = out
}

func secretRef(ref *corev1.SecretReference) *volume.SecretRef {
	if ref == nil {
		return nil
	}
	return &volume.SecretRef{Namespace: ref.Namespace, Name: ref.Name}
}

// specError is an invalid volume specification with a human-readable
// message that names the object at fault.
type specError struct{ msg string }

func (e *specError) Error() string { return e.msg }

// Unwrap makes errors.Is(err, volume.ErrInvalidSpec) hold.
func (e *specError) Unwrap() error { return volume.ErrInvalidSpec }

func invalid(format string, args ...any) error {
	return &specError{msg: fmt.Sprintf(format, args...)}
}
