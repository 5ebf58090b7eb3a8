package manifests

import (
	"fmt"
	"maps"
	"slices"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

// uidSpace is the name space of the UIDs given to objects that have none:
// a UUID (version 5) of "<kind>/<namespace>/<name>", so an object keeps its
// UID across edits of its file and restarts of the agent (a pod's UID names
// its directory under <root>/pods).
var uidSpace = uuid.MustParse("6f0e6a7c-3b7e-4a4e-9f3c-6c73692d766d")

// view is the effective content of the directory: every file's objects,
// merged in file name order (the first definition of an object wins),
// defaulted and bound the way a control plane would. Its objects are never
// modified once built; a change builds a new view.
type view struct {
	// pods are the pods of this node by UID.
	pods map[types.UID]*corev1.Pod
	// podNames maps this node's pods' namespace/name to their UID.
	podNames map[cache.ObjectName]types.UID
	pvcs     map[cache.ObjectName]*corev1.PersistentVolumeClaim
	pvs      map[string]*corev1.PersistentVolume
	secrets  map[cache.ObjectName]*corev1.Secret
	drivers  map[string]*storagev1.CSIDriver
	// notes say which objects were left out and why, one line each.
	notes []string
}

// objectKey identifies an object across files.
type objectKey struct {
	kind string
	name cache.ObjectName
}

// buildView merges files (path → objects) into a view for node nodeName.
func buildView(files map[string][]object, nodeName string) *view {
	v := &view{
		pods:     map[types.UID]*corev1.Pod{},
		podNames: map[cache.ObjectName]types.UID{},
		pvcs:     map[cache.ObjectName]*corev1.PersistentVolumeClaim{},
		pvs:      map[string]*corev1.PersistentVolume{},
		secrets:  map[cache.ObjectName]*corev1.Secret{},
		drivers:  map[string]*storagev1.CSIDriver{},
	}
	defined := map[objectKey]object{}
	for _, file := range slices.Sorted(maps.Keys(files)) {
		for _, o := range files[file] {
			obj := o.obj.DeepCopyObject()
			meta, kind := defaultMeta(obj)
			key := objectKey{kind: kind, name: cache.MetaObjectToName(meta)}
			if first, dup := defined[key]; dup {
				v.notes = append(v.notes, fmt.Sprintf("%s:%d: %s %s is already defined at %s:%d; ignoring this one",
					o.file, o.line, kind, key.name, first.file, first.line))
				continue
			}
			defined[key] = o
			v.add(obj, o, nodeName)
		}
	}
	v.bind()
	return v
}

// defaultMeta gives a namespaced object the namespace "default" when it
// names none (as kubectl does) and every object a stable UID when it has
// none. It returns the object's metadata and kind.
func defaultMeta(obj runtime.Object) (metav1.Object, string) {
	var (
		meta       metav1.Object
		kind       string
		namespaced = true
	)
	switch o := obj.(type) {
	case *corev1.Pod:
		meta, kind = o, "Pod"
	case *corev1.PersistentVolumeClaim:
		meta, kind = o, "PersistentVolumeClaim"
	case *corev1.Secret:
		meta, kind = o, "Secret"
	case *corev1.PersistentVolume:
		meta, kind, namespaced = o, "PersistentVolume", false
	case *storagev1.CSIDriver:
		meta, kind, namespaced = o, "CSIDriver", false
	default:
		// parseDocument only returns the kinds above.
		panic(fmt.Sprintf("manifests: unexpected object %T", obj))
	}
	if namespaced && meta.GetNamespace() == "" {
		meta.SetNamespace(metav1.NamespaceDefault)
	}
	if meta.GetUID() == "" {
		id := uuid.NewSHA1(uidSpace, []byte(kind+"/"+meta.GetNamespace()+"/"+meta.GetName()))
		meta.SetUID(types.UID(id.String()))
	}
	return meta, kind
}

// add puts one defaulted object into the view.
func (v *view) add(obj runtime.Object, from object, nodeName string) {
	switch o := obj.(type) {
	case *corev1.Pod:
		if o.Spec.NodeName == "" {
			o.Spec.NodeName = nodeName
		}
		if o.Spec.NodeName != nodeName {
			v.notes = append(v.notes, fmt.Sprintf("%s:%d: Pod %s/%s is for node %q, not this node %q; ignoring it",
				from.file, from.line, o.Namespace, o.Name, o.Spec.NodeName, nodeName))
			return
		}
		if other, dup := v.pods[o.UID]; dup {
			v.notes = append(v.notes, fmt.Sprintf("%s:%d: Pod %s/%s has the UID %s of Pod %s/%s; ignoring it",
				from.file, from.line, o.Namespace, o.Name, o.UID, other.Namespace, other.Name))
			return
		}
		v.pods[o.UID] = o
		v.podNames[cache.MetaObjectToName(o)] = o.UID
	case *corev1.PersistentVolumeClaim:
		v.pvcs[cache.MetaObjectToName(o)] = o
	case *corev1.PersistentVolume:
		v.pvs[o.Name] = o
	case *corev1.Secret:
		// As the API server does: stringData is written into data.
		for k, s := range o.StringData {
			if o.Data == nil {
				o.Data = map[string][]byte{}
			}
			o.Data[k] = []byte(s)
		}
		o.StringData = nil
		v.secrets[cache.MetaObjectToName(o)] = o
	case *storagev1.CSIDriver:
		v.drivers[o.Name] = o
	}
}

// bind binds claims and volumes that name each other, as the PV controller
// binds pre-bound pairs: a claim whose spec.volumeName names a volume that
// is free or reserved for it (claimRef without UID), or a claim that a
// volume's claimRef names. Both get each other's reference (claimRef with
// the claim's UID, spec.volumeName) and the phase Bound, unless a phase is
// written in the manifest. A claim that binds to nothing is Pending.
func (v *view) bind() {
	for _, key := range slices.SortedFunc(maps.Keys(v.pvcs), compareNames) {
		pvc := v.pvcs[key]
		pv := v.volumeFor(pvc)
		if pv == nil {
			if pvc.Status.Phase == "" {
				pvc.Status.Phase = corev1.ClaimPending
			}
			continue
		}
		pvc.Spec.VolumeName = pv.Name
		if pvc.Status.Phase == "" {
			pvc.Status.Phase = corev1.ClaimBound
		}
		pv.Spec.ClaimRef = &corev1.ObjectReference{
			APIVersion: "v1", Kind: "PersistentVolumeClaim",
			Namespace: pvc.Namespace, Name: pvc.Name, UID: pvc.UID,
		}
		if pv.Status.Phase == "" {
			pv.Status.Phase = corev1.VolumeBound
		}
	}
}

// volumeFor returns the volume pvc binds to, or nil.
func (v *view) volumeFor(pvc *corev1.PersistentVolumeClaim) *corev1.PersistentVolume {
	if name := pvc.Spec.VolumeName; name != "" {
		pv, ok := v.pvs[name]
		if !ok || (pv.Spec.ClaimRef != nil && !refersTo(pv.Spec.ClaimRef, pvc)) {
			return nil
		}
		return pv
	}
	for _, name := range slices.Sorted(maps.Keys(v.pvs)) {
		if pv := v.pvs[name]; pv.Spec.ClaimRef != nil && refersTo(pv.Spec.ClaimRef, pvc) {
			return pv
		}
	}
	return nil
}

// refersTo says whether a volume's claimRef names pvc.
func refersTo(ref *corev1.ObjectReference, pvc *corev1.PersistentVolumeClaim) bool {
	ns := ref.Namespace
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	return ns == pvc.Namespace && ref.Name == pvc.Name && (ref.UID == "" || ref.UID == pvc.UID)
}

func compareNames(a, b cache.ObjectName) int {
	if a.Namespace != b.Namespace {
		if a.Namespace < b.Namespace {
			return -1
		}
		return 1
	}
	switch {
	case a.Name < b.Name:
		return -1
	case a.Name > b.Name:
		return 1
	}
	return 0
}

// changes are what differs between two views.
type changes struct {
	// pods are the UIDs of pods added, removed or changed.
	pods []types.UID
	// pvcs and pvs are the claims and volumes added, removed or changed.
	pvcs []cache.ObjectName
	pvs  []string
	// drivers are the CSIDriver objects added, removed or changed.
	drivers []string
}

// diff returns what changed from old to cur.
func diff(old, cur *view) changes {
	return changes{
		pods:    changedKeys(old.pods, cur.pods),
		pvcs:    changedKeys(old.pvcs, cur.pvcs),
		pvs:     changedKeys(old.pvs, cur.pvs),
		drivers: changedKeys(old.drivers, cur.drivers),
	}
}

func changedKeys[K comparable, V any](old, cur map[K]V) []K {
	var out []K
	for k, o := range old {
		if c, ok := cur[k]; !ok || !equality.Semantic.DeepEqual(o, c) {
			out = append(out, k)
		}
	}
	for k := range cur {
		if _, ok := old[k]; !ok {
			out = append(out, k)
		}
	}
	return out
}
