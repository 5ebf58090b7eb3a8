package populator_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/selinux"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

func seLinuxDriver(mount bool) *storagev1.CSIDriver {
	d := csiDriver(driver, false, storagev1.VolumeLifecyclePersistent, storagev1.VolumeLifecycleEphemeral)
	d.Spec.SELinuxMount = ptr.To(mount)
	return d
}

func withLevel(level string) podOpt {
	return func(p *corev1.Pod) {
		if p.Spec.SecurityContext == nil {
			p.Spec.SecurityContext = &corev1.PodSecurityContext{}
		}
		p.Spec.SecurityContext.SELinuxOptions = &corev1.SELinuxOptions{Level: level}
	}
}

func label(level string) string { return "system_u:object_r:container_file_t:" + level }

// TestSELinuxContext: on an SELinux host, a PV of a driver with
// seLinuxMount is mounted with the label of the pod's containers, as the
// kubelet with SELinuxMount decides it.
func TestSELinuxContext(t *testing.T) {
	recursive := func(p *corev1.Pod) {
		p.Spec.SecurityContext.SELinuxChangePolicy = ptr.To(corev1.SELinuxChangePolicyRecursive)
	}
	secondContainer := func(level string) podOpt {
		return func(p *corev1.Pod) {
			c := corev1.Container{Name: "second", VolumeMounts: []corev1.VolumeMount{{Name: "data"}}}
			if level != "" {
				c.SecurityContext = &corev1.SecurityContext{SELinuxOptions: &corev1.SELinuxOptions{Level: level}}
			}
			p.Spec.Containers = append(p.Spec.Containers, c)
		}
	}
	for name, tc := range map[string]struct {
		opts    []podOpt
		driver  *storagev1.CSIDriver
		seLinux selinux.Translator
		want    string
		wantErr string
	}{
		"pod level":                   {opts: []podOpt{withLevel("s0:c1,c2")}, want: label("s0:c1,c2")},
		"no options":                  {want: ""},
		"driver without seLinuxMount": {opts: []podOpt{withLevel("s0:c1,c2")}, driver: seLinuxDriver(false), want: ""},
		"host without SELinux":        {opts: []podOpt{withLevel("s0:c1,c2")}, seLinux: selinux.Host{}, want: ""},
		"recursive change policy":     {opts: []podOpt{withLevel("s0:c1,c2"), recursive}, want: ""},
		"container agrees":            {opts: []podOpt{withLevel("s0:c1,c2"), secondContainer("s0:c1,c2")}, want: label("s0:c1,c2")},
		"container overrides the pod": {opts: []podOpt{withLevel("s0:c1,c2"), secondContainer("s0:c3,c4")},
			wantErr: `data: the containers that mount the volume have different SELinux labels: ` + label("s0:c1,c2") + ", " + label("s0:c3,c4")},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := testContext(t)
			d := tc.driver
			if d == nil {
				d = seLinuxDriver(true)
			}
			tr := tc.seLinux
			if tr == nil {
				tr = selinux.Defaults{}
			}
			opts := append([]podOpt{withClaim("data", "c1")}, tc.opts...)
			s := startStack(ctx, t, fakeClient(newPod("p", opts...), newPVC("c1", "pv1"), newPV("pv1", "c1", "h1"), d),
				stackOptions{seLinux: tr})
			p, _ := s.store.Pod("uid-p")
			if tc.wantErr != "" {
				if diff := cmp.Diff([]string{tc.wantErr}, errorsOf(p)); diff != "" {
					t.Errorf("errors (-want +got):\n%s", diff)
				}
				return
			}
			u, ok := s.store.PodVolume(volume.PodKey{Volume: pvName("h1"), Pod: "uid-p"})
			if !ok {
				t.Fatalf("volume not desired; errors %v", errorsOf(p))
			}
			if u.Source.SELinuxContext != tc.want {
				t.Errorf("SELinux context = %q, want %q", u.Source.SELinuxContext, tc.want)
			}
		})
	}
}

// TestSELinuxContextBefore137: with an API server before 1.37 (the
// agent's SELinuxMountReadWriteOncePodOnly), only a PV whose one access
// mode is ReadWriteOncePod is mounted with the pod's label, as the kubelet
// of 1.34 to 1.36 decides it by default (SELinuxMountReadWriteOncePod on,
// SELinuxMount off); a PV of another access mode is mounted without one
// and relabelled by the container runtime. With the newest minor (false),
// every access mode gets it.
func TestSELinuxContextBefore137(t *testing.T) {
	modes := func(m ...corev1.PersistentVolumeAccessMode) func(*corev1.PersistentVolume) {
		return func(pv *corev1.PersistentVolume) { pv.Spec.AccessModes = m }
	}
	for name, tc := range map[string]struct {
		rwopOnly bool
		pvOpt    func(*corev1.PersistentVolume)
		want     string
	}{
		"ReadWriteOncePod before 1.37":              {rwopOnly: true, pvOpt: modes(corev1.ReadWriteOncePod), want: label("s0:c1,c2")},
		"ReadWriteOnce before 1.37":                 {rwopOnly: true, pvOpt: modes(corev1.ReadWriteOnce), want: ""},
		"ReadWriteMany before 1.37":                 {rwopOnly: true, pvOpt: modes(corev1.ReadWriteMany), want: ""},
		"ReadWriteOncePod among others before 1.37": {rwopOnly: true, pvOpt: modes(corev1.ReadWriteOncePod, corev1.ReadWriteOnce), want: ""},
		"ReadWriteOnce from 1.37":                   {rwopOnly: false, pvOpt: modes(corev1.ReadWriteOnce), want: label("s0:c1,c2")},
		"ReadWriteMany from 1.37":                   {rwopOnly: false, pvOpt: modes(corev1.ReadWriteMany), want: label("s0:c1,c2")},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := testContext(t)
			s := startStack(ctx, t, fakeClient(newPod("p", withClaim("data", "c1"), withLevel("s0:c1,c2")),
				newPVC("c1", "pv1"), newPV("pv1", "c1", "h1", tc.pvOpt), seLinuxDriver(true)),
				stackOptions{seLinux: selinux.Defaults{}, rwopOnly: func() bool { return tc.rwopOnly }})
			u, ok := s.store.PodVolume(volume.PodKey{Volume: pvName("h1"), Pod: "uid-p"})
			if !ok {
				p, _ := s.store.Pod("uid-p")
				t.Fatalf("volume not desired; errors %v", errorsOf(p))
			}
			if u.Source.SELinuxContext != tc.want {
				t.Errorf("SELinux context = %q, want %q", u.Source.SELinuxContext, tc.want)
			}
		})
	}
}

// TestSELinuxInlineVolumeHasNoContext: the kubelet mounts only PVs with a
// context.
func TestSELinuxInlineVolumeHasNoContext(t *testing.T) {
	ctx := testContext(t)
	pod := newPod("p", withVolume(corev1.Volume{Name: "cache", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: driver}}}),
		mount("cache"), withLevel("s0:c1,c2"))
	s := startStack(ctx, t, fakeClient(pod, seLinuxDriver(true)), stackOptions{seLinux: selinux.Defaults{}})
	u, ok := s.store.PodVolume(volume.PodKey{Volume: volume.InlineName("uid-p", "cache"), Pod: "uid-p"})
	if !ok || u.Source.SELinuxContext != "" {
		t.Errorf("inline use = %+v (%v), want one without SELinux context", u.Source, ok)
	}
}

// TestSELinuxConflictBetweenPods: the pods of one volume must agree on its
// context; the pod that comes with another one is refused, as the kubelet
// refuses it ("conflicting SELinux labels of volume"), and a pod that
// agrees is not.
func TestSELinuxConflictBetweenPods(t *testing.T) {
	ctx := testContext(t)
	rwx := func(pv *corev1.PersistentVolume) {
		pv.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
	}
	objs := []runtime.Object{newPod("first", withClaim("data", "c1"), withLevel("s0:c1,c2")),
		newPVC("c1", "pv1"), newPV("pv1", "c1", "h1", rwx), seLinuxDriver(true)}
	client := fakeClient(objs...)
	s := startStack(ctx, t, client, stackOptions{seLinux: selinux.Defaults{}, workers: 1})
	for _, pod := range []*corev1.Pod{
		newPod("other", withClaim("data", "c1"), withLevel("s0:c5,c6")),
		newPod("same", withClaim("data", "c1"), withLevel("s0:c1,c2")),
	} {
		if _, err := client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(ctx, t, "pod same desired", func() bool {
		_, ok := s.store.PodVolume(volume.PodKey{Volume: pvName("h1"), Pod: "uid-same"})
		return ok
	})
	other, _ := s.store.Pod("uid-other")
	want := []string{`data: conflicting SELinux labels of volume pv1: "` + label("s0:c1,c2") + `" (pod ns/first) and "` + label("s0:c5,c6") + `"`}
	if diff := cmp.Diff(want, errorsOf(other)); diff != "" {
		t.Errorf("errors of the pod with another label (-want +got):\n%s", diff)
	}
}
