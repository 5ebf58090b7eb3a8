package populator_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// zoneAffinity requires the node label topology.kubernetes.io/zone=zone.
func zoneAffinity(zone string) func(*corev1.PersistentVolume) {
	return func(pv *corev1.PersistentVolume) {
		pv.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
				Key: "topology.kubernetes.io/zone", Operator: corev1.NodeSelectorOpIn, Values: []string{zone},
			}}}},
		}}
	}
}

// TestPVNodeAffinity: as the kubelet before it mounts a volume, a PV whose
// nodeAffinity does not match the node's labels is not used (the pod's
// volume error says why); one that matches is. A change of the node's
// labels re-resolves the pods.
func TestPVNodeAffinity(t *testing.T) {
	ctx := testContext(t)
	nodeObj := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, ResourceVersion: "1",
		Labels: map[string]string{"topology.kubernetes.io/zone": "a"}}}
	client := fakeClient(nodeObj,
		newPod("here", withClaim("data", "c1")), newPVC("c1", "pv1"), newPV("pv1", "c1", "h1", zoneAffinity("a")),
		newPod("there", withClaim("data", "c2")), newPVC("c2", "pv2"), newPV("pv2", "c2", "h2", zoneAffinity("b")))
	s := startStack(ctx, t, client, stackOptions{watchNode: true})

	if _, ok := s.store.PodVolume(volume.PodKey{Volume: pvName("h1"), Pod: "uid-here"}); !ok {
		t.Error("a PV whose nodeAffinity matches the node is not desired")
	}
	there, _ := s.store.Pod("uid-there")
	if len(there.Uses) != 0 || len(there.Errors) != 1 {
		t.Fatalf("pod using a PV of another zone: uses %v, errors %v; want one error", summarize(there.Uses), errorsOf(there))
	}
	want := `volume "data": PV "pv2" cannot be used on node "node-a": its nodeAffinity does not match the node's labels: no matching NodeSelectorTerms`
	if got := there.Errors[0].Error(); got != want {
		t.Errorf("error = %q, want %q", got, want)
	}

	nodeObj.Labels["topology.kubernetes.io/zone"] = "b"
	nodeObj.ResourceVersion = "2"
	if _, err := client.CoreV1().Nodes().Update(ctx, nodeObj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, "pod there resolved after the node moved to zone b", func() bool {
		_, ok := s.store.PodVolume(volume.PodKey{Volume: pvName("h2"), Pod: "uid-there"})
		return ok
	})
	// A running pod keeps a volume it has (the kubelet resolves a pod once).
	if _, ok := s.store.PodVolume(volume.PodKey{Volume: pvName("h1"), Pod: "uid-here"}); !ok {
		t.Error("the pod that has its volume lost it when the node's labels changed")
	}
}

// TestPVGIDAnnotation: pv.beta.kubernetes.io/gid becomes the Source's GID,
// the supplemental group a runtime gives the pod's containers; a value that
// is not a number is ignored, as by the kubelet.
func TestPVGIDAnnotation(t *testing.T) {
	ctx := testContext(t)
	gid := func(v string) func(*corev1.PersistentVolume) {
		return func(pv *corev1.PersistentVolume) { pv.Annotations = map[string]string{"pv.beta.kubernetes.io/gid": v} }
	}
	s := startStack(ctx, t, fakeClient(
		newPod("p", withClaim("a", "c1"), withClaim("b", "c2"), withClaim("c", "c3")),
		newPVC("c1", "pv1"), newPV("pv1", "c1", "h1", gid("3000")),
		newPVC("c2", "pv2"), newPV("pv2", "c2", "h2", gid("many")),
		newPVC("c3", "pv3"), newPV("pv3", "c3", "h3")), stackOptions{})
	got := map[string]*int64{}
	p, _ := s.store.Pod("uid-p")
	for _, u := range p.Uses {
		got[u.Volume.SpecName] = u.Source.GID
	}
	want := map[string]*int64{"a": ptr.To[int64](3000), "b": nil, "c": nil}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("GIDs by volume (-want +got):\n%s", diff)
	}
}
