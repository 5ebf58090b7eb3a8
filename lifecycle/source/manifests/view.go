package manifests

import (
	"fmt"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
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
// defaulted and bound the way a control plane would (incremental.go keeps
// it up to date file by file). Its objects are never modified once in it;
// a change replaces them.
type view struct {
	// pods are the pods of this node by UID.
	pods map[types.UID]*corev1.Pod
	// podNames maps this node's pods' namespace/name to their UID.
	podNames map[cache.ObjectName]types.UID
	pvcs     map[cache.ObjectName]*corev1.PersistentVolumeClaim
	pvs      map[string]*corev1.PersistentVolume
	secrets  map[cache.ObjectName]*corev1.Secret
	drivers  map[string]*storagev1.CSIDriver
}

// objectKey identifies an object across files.
type objectKey struct {
	kind string
	name cache.ObjectName
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
	// drivers are the CSIDriver objects whose policy changed.
	drivers []string
}
