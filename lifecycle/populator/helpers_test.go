package populator_test

import (
	"context"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/clock"

	"github.com/csi-volmgr/csi-volmgr/driver/policy"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/populator"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/selinux"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/source"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

const (
	ns           = "ns"
	node         = "node-a"
	driver       = "csi.example.com"
	eventTimeout = 60 * time.Second
)

// stack is a real Source, dsw.Store, CSIDriver policy store (the one the
// wiring gives the lifecycle) and Populator over one
// clientset, running until the test ends.
type stack struct {
	src   *source.Source
	store *dsw.Store
	pop   *populator.Populator
	// stop stops everything and waits for it; it runs at the test's end
	// too and may be called more than once.
	stop func()
}

type stackOptions struct {
	removeTerminating bool
	clusterWide       bool
	clock             clock.PassiveClock
	node              string
	// noWait skips waiting for the populator to sync.
	noWait bool
	// workers is the populator's Workers; 0 means its default. With one,
	// pods are resolved in the order of their events.
	workers int
	// watchNode checks PVs' nodeAffinity against the Node object's labels
	// (source.Node), as cluster mode does.
	watchNode bool
	// seLinux is the populator's SELinux translator; nil for none.
	seLinux selinux.Translator
	// rwopOnly is the populator's SELinuxMountReadWriteOncePodOnly.
	rwopOnly func() bool
	// published is the populator's Published; nil treats every resolved
	// volume as published.
	published populator.PublishedVolumes
	// wrapSource, when set, stands between the source and the populator.
	wrapSource func(populator.Source) populator.Source
	// terminal is the populator's Terminal; nil for none.
	terminal func(types.UID)
	// waitForContainersStopped is the populator's WaitForContainersStopped.
	waitForContainersStopped bool
}

func startStack(ctx context.Context, t testing.TB, client kubernetes.Interface, o stackOptions) *stack {
	t.Helper()
	if o.node == "" {
		o.node = node
	}
	src, err := source.New(ctx, source.Config{Client: client, NodeName: o.node, ClusterWideInformers: o.clusterWide})
	if err != nil {
		t.Fatalf("source.New: %v", err)
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	policies, err := policy.New(ctx, factory.Storage().V1().CSIDrivers(), volume.PolicyFromCSIDriver, volume.Policy.Equal)
	if err != nil {
		t.Fatalf("policy.New: %v", err)
	}
	store := dsw.New()
	var nodeLabels populator.NodeLabels
	var nodeWatch *source.Node
	if o.watchNode {
		if nodeWatch, err = source.NewNode(client, o.node); err != nil {
			t.Fatal(err)
		}
		nodeLabels = nodeWatch
	}
	var popSource populator.Source = src
	if o.wrapSource != nil {
		popSource = o.wrapSource(src)
	}
	pop, err := populator.New(populator.Config{
		Node:                             nodeLabels,
		Source:                           popSource,
		DesiredState:                     store,
		Policies:                         policies,
		NodeName:                         o.node,
		RemoveTerminatingPods:            o.removeTerminating,
		Clock:                            o.clock,
		Workers:                          o.workers,
		SELinux:                          o.seLinux,
		SELinuxMountReadWriteOncePodOnly: o.rwopOnly,
		Published:                        o.published,
		Terminal:                         o.terminal,

		WaitForContainersStopped: o.waitForContainersStopped,
	})
	if err != nil {
		t.Fatalf("populator.New: %v", err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	srcDone, popDone := make(chan struct{}), make(chan struct{})
	go func() { defer close(srcDone); src.Run(runCtx) }()
	if nodeWatch != nil {
		nodeDone := make(chan struct{})
		go func() { defer close(nodeDone); nodeWatch.Run(runCtx) }()
		t.Cleanup(func() { <-nodeDone })
	}
	go func() {
		defer close(popDone)
		if err := pop.Run(runCtx); err != nil && runCtx.Err() == nil {
			t.Errorf("populator.Run: %v", err)
		}
	}()
	factory.Start(runCtx.Done())
	var stopOnce sync.Once
	stop := func() {
		stopOnce.Do(func() {
			cancel()
			<-popDone
			<-srcDone
			factory.Shutdown()
		})
	}
	t.Cleanup(stop)
	if !o.noWait {
		select {
		case <-pop.Synced():
		case <-time.After(eventTimeout):
			t.Fatalf("populator did not sync within %v", eventTimeout)
		}
	}
	return &stack{src: src, store: store, pop: pop, stop: stop}
}

func testContext(t *testing.T) context.Context {
	return klog.NewContext(t.Context(), ktesting.NewLogger(t, ktesting.NewConfig()))
}

func eventually(ctx context.Context, t testing.TB, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, eventTimeout, true,
		func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func fakeClient(objs ...runtime.Object) *fake.Clientset { return fake.NewClientset(objs...) }

// Object builders. Every object gets a resourceVersion: the Source drops
// updates whose resourceVersion did not change, and the fake clientset does
// not set one.

type podOpt func(*corev1.Pod)

func newPod(name string, opts ...podOpt) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name), ResourceVersion: "1"},
		Spec: corev1.PodSpec{
			NodeName:           node,
			ServiceAccountName: "sa",
			Containers:         []corev1.Container{{Name: "c"}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

// withClaim adds a volume for a claim and mounts it in the first container.
func withClaim(vol, claim string) podOpt {
	return func(p *corev1.Pod) {
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: vol, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}})
		mount(vol)(p)
	}
}

func withVolume(v corev1.Volume) podOpt {
	return func(p *corev1.Pod) { p.Spec.Volumes = append(p.Spec.Volumes, v) }
}

func mount(vol string) podOpt {
	return func(p *corev1.Pod) {
		p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts,
			corev1.VolumeMount{Name: vol, MountPath: "/" + vol})
	}
}

func device(vol string) podOpt {
	return func(p *corev1.Pod) {
		p.Spec.Containers[0].VolumeDevices = append(p.Spec.Containers[0].VolumeDevices,
			corev1.VolumeDevice{Name: vol, DevicePath: "/dev/" + vol})
	}
}

func newPVC(name, pv string, opts ...func(*corev1.PersistentVolumeClaim)) *corev1.PersistentVolumeClaim {
	c := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name), ResourceVersion: "1"},
		Spec:       corev1.PersistentVolumeClaimSpec{VolumeName: pv},
		Status:     corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound},
	}
	if pv == "" {
		c.Status.Phase = corev1.ClaimPending
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// newPV returns a CSI PV bound to the claim ns/claim (with the UID newPVC
// gives it).
func newPV(name, claim, handle string, opts ...func(*corev1.PersistentVolume)) *corev1.PersistentVolume {
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:    corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			ClaimRef:    &corev1.ObjectReference{Namespace: ns, Name: claim, UID: types.UID("uid-" + claim)},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver:           driver,
				VolumeHandle:     handle,
				FSType:           "ext4",
				VolumeAttributes: map[string]string{"pool": "fast"},
			}},
		},
	}
	for _, o := range opts {
		o(pv)
	}
	return pv
}

func csiDriver(name string, attach bool, modes ...storagev1.VolumeLifecycleMode) *storagev1.CSIDriver {
	return &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1"},
		Spec:       storagev1.CSIDriverSpec{AttachRequired: &attach, VolumeLifecycleModes: modes},
	}
}

// errorsOf renders a pod's volume errors as "spec: message" lines.
func errorsOf(p dsw.Pod) []string {
	var out []string
	for _, e := range p.Errors {
		out = append(out, e.SpecName+": "+e.Err.Error())
	}
	return out
}
