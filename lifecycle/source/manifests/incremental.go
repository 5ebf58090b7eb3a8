package manifests

import (
	"cmp"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// The view is kept up to date file by file: a change to one file costs
// O(the objects of that file and their neighbours), not O(the directory).
// For that the view keeps, besides what readers see, every definition of
// every object (the first one, in file name order, wins), the defaulted
// claims and volumes as defined (before binding), and two indexes of who
// may bind whom: the claims naming each volume in spec.volumeName, and the
// volumes whose claimRef names each claim. Binding then follows the rules
// of bind (view.go) for just the claims and volumes a change can affect.

// definition is one object as one file defines it.
type definition struct {
	o object
	// file is the file's base name (the key of Source.files; o.file is its
	// path), index the object's position in it.
	file  string
	index int
}

// index is the incremental state behind a view.
type index struct {
	nodeName string
	defs     map[objectKey][]definition
	// rawPVCs and rawPVs are the defaulted winners before binding.
	rawPVCs map[cache.ObjectName]*corev1.PersistentVolumeClaim
	rawPVs  map[string]*corev1.PersistentVolume
	// byVolumeName: volume name → claims whose spec.volumeName names it;
	// byClaimRef: claim → volumes whose claimRef names it.
	byVolumeName map[string]map[cache.ObjectName]struct{}
	byClaimRef   map[cache.ObjectName]map[string]struct{}
	// podsByUID lists the keys of this node's pods per UID, first
	// definition first: the first one is the pod, the others are ignored.
	podsByUID map[types.UID][]objectKey
	// podWinner is each pod key's defaulted object, for this node or not.
	podWinner map[objectKey]*corev1.Pod
}

func newIndex(nodeName string) *index {
	return &index{
		nodeName:     nodeName,
		defs:         map[objectKey][]definition{},
		rawPVCs:      map[cache.ObjectName]*corev1.PersistentVolumeClaim{},
		rawPVs:       map[string]*corev1.PersistentVolume{},
		byVolumeName: map[string]map[cache.ObjectName]struct{}{},
		byClaimRef:   map[cache.ObjectName]map[string]struct{}{},
		podsByUID:    map[types.UID][]objectKey{},
		podWinner:    map[objectKey]*corev1.Pod{},
	}
}

func newEmptyView() *view {
	return &view{
		pods:     map[types.UID]*corev1.Pod{},
		podNames: map[cache.ObjectName]types.UID{},
		pvcs:     map[cache.ObjectName]*corev1.PersistentVolumeClaim{},
		pvs:      map[string]*corev1.PersistentVolume{},
		secrets:  map[cache.ObjectName]*corev1.Secret{},
		drivers:  map[string]*storagev1.CSIDriver{},
	}
}

// keyOf returns an object's key as the view names it (namespace
// defaulted).
func keyOf(obj runtime.Object) objectKey {
	meta, kind := defaultMeta(obj.DeepCopyObject())
	return objectKey{kind: kind, name: cache.MetaObjectToName(meta)}
}

// setFile replaces what file defines (objs; nil: the file is gone) and
// updates v, recording what changed in c. It returns the notes about the
// objects it touched that are new: definitions ignored for a duplicate, pods
// of other nodes or with another pod's UID.
func (x *index) setFile(v *view, file string, old, objs []object, c *changes) []string {
	var notes []string
	touched := map[objectKey]bool{}
	for _, o := range old {
		touched[keyOf(o.obj)] = true
	}
	for _, o := range objs {
		touched[keyOf(o.obj)] = true
	}
	// The definitions.
	for key := range touched {
		defs := slices.DeleteFunc(x.defs[key], func(d definition) bool { return d.file == file })
		for i, o := range objs {
			if keyOf(o.obj) == key {
				defs = append(defs, definition{o: o, file: file, index: i})
			}
		}
		slices.SortStableFunc(defs, func(a, b definition) int {
			return cmp.Or(cmp.Compare(a.file, b.file), cmp.Compare(a.index, b.index))
		})
		if len(defs) == 0 {
			delete(x.defs, key)
		} else {
			x.defs[key] = defs
			for _, d := range defs[1:] {
				if d.file == file || defs[0].file == file {
					notes = append(notes, fmt.Sprintf("%s:%d: %s %s is already defined at %s:%d; ignoring this one",
						d.o.file, d.o.line, key.kind, key.name, defs[0].o.file, defs[0].o.line))
				}
			}
		}
	}
	// The winners.
	bind := newBindSet()
	for key := range touched {
		var obj runtime.Object
		var from definition
		if defs := x.defs[key]; len(defs) > 0 {
			from = defs[0]
			obj = from.o.obj.DeepCopyObject()
			defaultMeta(obj)
		}
		switch key.kind {
		case "Pod":
			notes = append(notes, x.setPod(v, key, obj, from, file, c)...)
		case "PersistentVolumeClaim":
			x.setPVC(key.name, obj, bind)
		case "PersistentVolume":
			x.setPV(key.name.Name, obj, bind)
		case "Secret":
			if obj == nil {
				delete(v.secrets, key.name)
				continue
			}
			// As the API server does: stringData is written into data.
			secret := obj.(*corev1.Secret)
			for k, s := range secret.StringData {
				if secret.Data == nil {
					secret.Data = map[string][]byte{}
				}
				secret.Data[k] = []byte(s)
			}
			secret.StringData = nil
			v.secrets[key.name] = secret
		case "CSIDriver":
			was := volume.PolicyFromCSIDriver(v.drivers[key.name.Name])
			if obj == nil {
				delete(v.drivers, key.name.Name)
			} else {
				v.drivers[key.name.Name] = obj.(*storagev1.CSIDriver)
			}
			if !was.Equal(volume.PolicyFromCSIDriver(v.drivers[key.name.Name])) {
				c.drivers = append(c.drivers, key.name.Name)
			}
		}
	}
	x.rebind(v, bind, c)
	return notes
}

// setPod puts the winner of one pod key (nil: none) into the view.
func (x *index) setPod(v *view, key objectKey, obj runtime.Object, from definition, file string, c *changes) []string {
	var notes []string
	uids := map[types.UID]bool{}
	if old := x.podWinner[key]; old != nil {
		uids[old.UID] = true
		if old.Spec.NodeName == x.nodeName {
			x.podsByUID[old.UID] = slices.DeleteFunc(x.podsByUID[old.UID], func(k objectKey) bool { return k == key })
		}
	}
	delete(x.podWinner, key)
	if obj != nil {
		pod := obj.(*corev1.Pod)
		if pod.Spec.NodeName == "" {
			pod.Spec.NodeName = x.nodeName
		}
		x.podWinner[key] = pod
		if pod.Spec.NodeName != x.nodeName {
			if from.file == file {
				notes = append(notes, fmt.Sprintf("%s:%d: Pod %s/%s is for node %q, not this node %q; ignoring it",
					from.o.file, from.o.line, pod.Namespace, pod.Name, pod.Spec.NodeName, x.nodeName))
			}
		} else {
			uids[pod.UID] = true
			ks := append(x.podsByUID[pod.UID], key)
			slices.SortStableFunc(ks, func(a, b objectKey) int { return x.compareDefs(a, b) })
			x.podsByUID[pod.UID] = ks
		}
	}
	for uid := range uids {
		old := v.pods[uid]
		ks := x.podsByUID[uid]
		if len(ks) == 0 {
			delete(x.podsByUID, uid)
			delete(v.pods, uid)
		} else {
			v.pods[uid] = x.podWinner[ks[0]]
			first := x.defs[ks[0]][0]
			for _, k := range ks[1:] {
				d, p := x.defs[k][0], x.podWinner[k]
				if d.file == file || first.file == file {
					notes = append(notes, fmt.Sprintf("%s:%d: Pod %s/%s has the UID %s of Pod %s/%s; ignoring it",
						d.o.file, d.o.line, p.Namespace, p.Name, uid, v.pods[uid].Namespace, v.pods[uid].Name))
				}
			}
		}
		if old != nil {
			if cur, ok := v.pods[uid]; !ok || cache.MetaObjectToName(cur) != cache.MetaObjectToName(old) {
				delete(v.podNames, cache.MetaObjectToName(old))
			}
		}
		if cur, ok := v.pods[uid]; ok {
			v.podNames[cache.MetaObjectToName(cur)] = uid
		}
		if !equality.Semantic.DeepEqual(old, v.pods[uid]) {
			c.pods = append(c.pods, uid)
		}
	}
	return notes
}

// compareDefs orders two keys by their first definitions.
func (x *index) compareDefs(a, b objectKey) int {
	da, db := x.defs[a][0], x.defs[b][0]
	return cmp.Or(cmp.Compare(da.file, db.file), cmp.Compare(da.index, db.index))
}

// bindSet collects the claims and volumes whose binding must be worked
// out again.
type bindSet struct {
	pvcs map[cache.ObjectName]bool
	pvs  map[string]bool
}

func newBindSet() bindSet {
	return bindSet{pvcs: map[cache.ObjectName]bool{}, pvs: map[string]bool{}}
}

// setPVC replaces a claim's definition (nil: none) and marks what its
// binding may affect: the claim, the volumes it names before and after and
// the claims competing for them, and the volumes whose claimRef names it.
func (x *index) setPVC(name cache.ObjectName, obj runtime.Object, b bindSet) {
	old := x.rawPVCs[name]
	if old != nil && old.Spec.VolumeName != "" {
		b.pvs[old.Spec.VolumeName] = true
		delete(x.byVolumeName[old.Spec.VolumeName], name)
		if len(x.byVolumeName[old.Spec.VolumeName]) == 0 {
			delete(x.byVolumeName, old.Spec.VolumeName)
		}
	}
	delete(x.rawPVCs, name)
	if obj != nil {
		pvc := obj.(*corev1.PersistentVolumeClaim)
		x.rawPVCs[name] = pvc
		if vn := pvc.Spec.VolumeName; vn != "" {
			b.pvs[vn] = true
			if x.byVolumeName[vn] == nil {
				x.byVolumeName[vn] = map[cache.ObjectName]struct{}{}
			}
			x.byVolumeName[vn][name] = struct{}{}
		}
	}
	b.pvcs[name] = true
	for pv := range x.byClaimRef[name] {
		b.pvs[pv] = true
	}
	for pv := range b.pvs {
		for claim := range x.byVolumeName[pv] {
			b.pvcs[claim] = true
		}
	}
}

// claimRefKey is the claim a volume's claimRef names (namespace
// defaulted), and whether it names one.
func claimRefKey(pv *corev1.PersistentVolume) (cache.ObjectName, bool) {
	if pv == nil || pv.Spec.ClaimRef == nil {
		return cache.ObjectName{}, false
	}
	ns := pv.Spec.ClaimRef.Namespace
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	return cache.ObjectName{Namespace: ns, Name: pv.Spec.ClaimRef.Name}, true
}

// setPV replaces a volume's definition (nil: none) and marks what its
// binding may affect: the volume, the claims naming it, the claims its
// claimRef names before and after, and the volumes competing for those.
func (x *index) setPV(name string, obj runtime.Object, b bindSet) {
	if ref, ok := claimRefKey(x.rawPVs[name]); ok {
		b.pvcs[ref] = true
		delete(x.byClaimRef[ref], name)
		if len(x.byClaimRef[ref]) == 0 {
			delete(x.byClaimRef, ref)
		}
		for pv := range x.byClaimRef[ref] {
			b.pvs[pv] = true
		}
	}
	delete(x.rawPVs, name)
	if obj != nil {
		pv := obj.(*corev1.PersistentVolume)
		x.rawPVs[name] = pv
		if ref, ok := claimRefKey(pv); ok {
			b.pvcs[ref] = true
			if x.byClaimRef[ref] == nil {
				x.byClaimRef[ref] = map[string]struct{}{}
			}
			x.byClaimRef[ref][name] = struct{}{}
			for other := range x.byClaimRef[ref] {
				b.pvs[other] = true
			}
		}
	}
	b.pvs[name] = true
	for claim := range x.byVolumeName[name] {
		b.pvcs[claim] = true
	}
}

// boundVolume is the volume claim binds to ("": none), by the rules of
// view.bind.
func (x *index) boundVolume(name cache.ObjectName) string {
	pvc := x.rawPVCs[name]
	if pvc == nil {
		return ""
	}
	if vn := pvc.Spec.VolumeName; vn != "" {
		pv := x.rawPVs[vn]
		switch {
		case pv == nil:
			return ""
		case pv.Spec.ClaimRef != nil:
			if refersTo(pv.Spec.ClaimRef, pvc) {
				return vn
			}
			return ""
		}
		// A free volume goes to the first claim (by name) that names it.
		if x.firstClaimNaming(vn) == name {
			return vn
		}
		return ""
	}
	return x.firstVolumeReserving(pvc)
}

// firstClaimNaming is the first claim, by namespace and name, whose
// spec.volumeName is pv.
func (x *index) firstClaimNaming(pv string) cache.ObjectName {
	var first cache.ObjectName
	found := false
	for claim := range x.byVolumeName[pv] {
		if !found || compareNames(claim, first) < 0 {
			first, found = claim, true
		}
	}
	return first
}

// firstVolumeReserving is the first volume, by name, whose claimRef
// names pvc.
func (x *index) firstVolumeReserving(pvc *corev1.PersistentVolumeClaim) string {
	first := ""
	for pv := range x.byClaimRef[cache.MetaObjectToName(pvc)] {
		if refersTo(x.rawPVs[pv].Spec.ClaimRef, pvc) && (first == "" || pv < first) {
			first = pv
		}
	}
	return first
}

// boundClaim is the claim volume pv binds to, if any.
func (x *index) boundClaim(name string) (cache.ObjectName, bool) {
	pv := x.rawPVs[name]
	if pv == nil {
		return cache.ObjectName{}, false
	}
	if ref, ok := claimRefKey(pv); ok {
		if pvc := x.rawPVCs[ref]; pvc != nil && x.boundVolume(ref) == name {
			return ref, true
		}
		return cache.ObjectName{}, false
	}
	if _, ok := x.byVolumeName[name]; !ok {
		return cache.ObjectName{}, false
	}
	claim := x.firstClaimNaming(name)
	return claim, x.boundVolume(claim) == name
}

// rebind works out the binding of the claims and volumes in b and puts
// their bound copies into the view, recording which changed.
func (x *index) rebind(v *view, b bindSet, c *changes) {
	for name := range b.pvcs {
		old := v.pvcs[name]
		raw := x.rawPVCs[name]
		if raw == nil {
			delete(v.pvcs, name)
		} else {
			pvc := raw.DeepCopy()
			if pv := x.boundVolume(name); pv != "" {
				pvc.Spec.VolumeName = pv
				if pvc.Status.Phase == "" {
					pvc.Status.Phase = corev1.ClaimBound
				}
			} else if pvc.Status.Phase == "" {
				pvc.Status.Phase = corev1.ClaimPending
			}
			v.pvcs[name] = pvc
		}
		if !equality.Semantic.DeepEqual(old, v.pvcs[name]) {
			c.pvcs = append(c.pvcs, name)
		}
	}
	for name := range b.pvs {
		old := v.pvs[name]
		raw := x.rawPVs[name]
		if raw == nil {
			delete(v.pvs, name)
		} else {
			pv := raw.DeepCopy()
			if claim, ok := x.boundClaim(name); ok {
				pvc := x.rawPVCs[claim]
				pv.Spec.ClaimRef = &corev1.ObjectReference{
					APIVersion: "v1", Kind: "PersistentVolumeClaim",
					Namespace: pvc.Namespace, Name: pvc.Name, UID: pvc.UID,
				}
				if pv.Status.Phase == "" {
					pv.Status.Phase = corev1.VolumeBound
				}
			}
			v.pvs[name] = pv
		}
		if !equality.Semantic.DeepEqual(old, v.pvs[name]) {
			c.pvs = append(c.pvs, name)
		}
	}
}
