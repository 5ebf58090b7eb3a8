package populator

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/source"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// Pods is where the populator finds the node's pods. *source.Source
// implements it; a standalone (manifest directory) source can too.
type Pods interface {
	// Pod returns the pod with the given UID if it is on this node. The
	// populator never modifies it.
	Pod(uid types.UID) (*corev1.Pod, bool)
	// Pods returns every pod on this node.
	Pods() []*corev1.Pod
	// OnPodChange subscribes fn to "this pod needs re-evaluation": the
	// pod changed or went, or an object it references changed.
	OnPodChange(fn func(uid types.UID))
	// HasSynced tells whether Pods returns the complete initial set.
	HasSynced() bool
}

// Objects serves the objects the pods' volumes reference. *source.Source
// implements it.
type Objects interface {
	// PVC returns a claim the pod referenced first (AddReferences). Errors:
	// source.ErrNotSynced while its cache has not listed it yet (the pod
	// is notified when it has), the API's NotFound when it does not exist,
	// any other error when it cannot be read (the pod is notified when it
	// can).
	PVC(namespace, name string) (*corev1.PersistentVolumeClaim, error)
	// PV returns a PersistentVolume the pod referenced first; errors as PVC.
	PV(name string) (*corev1.PersistentVolume, error)
	// AddReferences adds to the objects the pod references.
	AddReferences(pod types.UID, refs source.References)
	// SetReferences replaces the objects the pod references; an empty
	// References releases them all.
	SetReferences(pod types.UID, refs source.References)
}

// Source is everything the populator reads.
type Source interface {
	Pods
	Objects
}

// DesiredState is what the populator writes. *dsw.Store implements it.
type DesiredState interface {
	// SetPod replaces a pod's desired state.
	SetPod(p dsw.Pod)
	// DeletePod forgets a pod.
	DeletePod(uid types.UID)
	// Pod returns a pod's current desired state.
	Pod(uid types.UID) (dsw.Pod, bool)
	// VolumePods returns the pods that use a volume.
	VolumePods(name volume.Name) []types.UID
	// PodVolume returns one pod's use of a volume.
	PodVolume(key volume.PodKey) (dsw.Use, bool)
}

// DriverPolicies tells how each CSI driver is configured (its CSIDriver
// object).
type DriverPolicies interface {
	// Get returns the policy of a driver, with the kubelet's defaults when
	// it has no CSIDriver object.
	Get(driver string) volume.Policy
	// OnChange subscribes fn to changes of a driver's policy.
	OnChange(fn func(driver string))
	// HasSynced tells whether Get answers from the API server's state.
	HasSynced() bool
}

// NodeLabels gives this node's labels. *source.Node implements it.
type NodeLabels interface {
	// Labels returns the node's labels; false while the Node is unknown.
	Labels() (map[string]string, bool)
	// OnChange subscribes fn to changes of the labels.
	OnChange(fn func())
	// HasSynced tells whether Labels answers from the API server's state.
	HasSynced() bool
}

var (
	_ NodeLabels   = &source.Node{}
	_ Source       = &source.Source{}
	_ DesiredState = &dsw.Store{}
)
