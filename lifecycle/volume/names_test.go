package volume

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// The expected digests were computed outside Go (sha256sum of the plain
// concatenation), so these tests pin the kubelet's formulas, not ours.
func TestAttachmentNameMatchesKubelet(t *testing.T) {
	got := AttachmentName("vol-1", "hostpath.csi.k8s.io", "node-1")
	want := "csi-a5a2e67339ab5660a390dc86be397e784322823ff01f40cf2c01a72c3cab1374"
	if got != want {
		t.Errorf("AttachmentName = %s, want %s", got, want)
	}
}

func TestInlineHandleMatchesKubelet(t *testing.T) {
	got := InlineHandle("0a1b-uid", "my-vol")
	want := "csi-92a4fb2429a100e169cc2b9cd4a3ca12ddb291af35a2f1a79eac6fe91a075f58"
	if got != want {
		t.Errorf("InlineHandle = %s, want %s", got, want)
	}
}

func TestNames(t *testing.T) {
	pv := PersistentName("hostpath.csi.k8s.io", "vol-1")
	if pv != "kubernetes.io/csi/hostpath.csi.k8s.io^vol-1" || pv.IsInline() {
		t.Errorf("PersistentName = %q (inline %v)", pv, pv.IsInline())
	}
	inline := InlineName("0a1b-uid", "my-vol")
	if inline != "kubernetes.io/csi/0a1b-uid-my-vol" || !inline.IsInline() {
		t.Errorf("InlineName = %q (inline %v)", inline, inline.IsInline())
	}
	for name, want := range map[Name]string{
		pv:                                     "hostpath.csi.k8s.io",
		PersistentName("d.example.com", "a^b"): "d.example.com",
		inline:                                 "",
		"other/plugin^x":                       "",
	} {
		if got := name.Driver(); got != want {
			t.Errorf("%q.Driver() = %q, want %q", name, got, want)
		}
	}
}

func TestPublishName(t *testing.T) {
	pv := PodVolume{SpecName: "data"}
	if got := pv.PublishName(Source{ID: ID{PVName: "pvc-123"}}); got != "pvc-123" {
		t.Errorf("PV publish name = %q, want the PV name", got)
	}
	if got := pv.PublishName(Source{Inline: true}); got != "data" {
		t.Errorf("inline publish name = %q, want the spec name", got)
	}
}

func TestSourceEqual(t *testing.T) {
	a := Source{
		ID: ID{Driver: "d", Handle: "h"}, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		StageSecret: &SecretRef{Namespace: "ns", Name: "s"}}
	b := a
	b.StageSecret = &SecretRef{Namespace: "ns", Name: "s"}
	if !a.Equal(b) {
		t.Error("sources equal by value compare unequal")
	}
	b.StageSecret = &SecretRef{Namespace: "ns", Name: "other"}
	if a.Equal(b) {
		t.Error("sources with different stage secrets compare equal")
	}
}
