package k8stest_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

func TestMain(m *testing.M) {
	k8stest.Main(m, k8stest.Options{})
}

// eventTimeout bounds the wait for an informer event that must arrive.
const eventTimeout = 30 * time.Second

// watch registers an event handler on informer that forwards every added or
// updated object of type T to the returned channel.
func watch[T any](t *testing.T, informer cache.SharedIndexInformer) <-chan T {
	t.Helper()
	ch := make(chan T, 100)
	forward := func(obj any) {
		if o, ok := obj.(T); ok {
			ch <- o
		}
	}
	_, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    forward,
		UpdateFunc: func(_, obj any) { forward(obj) },
	})
	if err != nil {
		t.Fatalf("adding event handler: %v", err)
	}
	return ch
}

// waitFor returns the first object from ch that match accepts, failing t
// after eventTimeout.
func waitFor[T any](t *testing.T, what string, ch <-chan T, match func(T) bool) T {
	t.Helper()
	deadline := time.After(eventTimeout)
	for {
		select {
		case obj := <-ch:
			if match(obj) {
				return obj
			}
		case <-deadline:
			t.Fatalf("%s did not arrive through the informer within %v", what, eventTimeout)
		}
	}
}

func TestObjectsArriveThroughInformers(t *testing.T) {
	fx := k8stest.New(t)
	ctx := t.Context()
	cleanupCtx := context.WithoutCancel(ctx) // cleanups run after ctx is canceled
	const driver = "hostpath.csi.k8s.io"
	pvName := fx.NodeName + "-pv"
	vaName := fx.NodeName + "-va"
	driverName := fx.NodeName + ".csi.example.com"

	factory := informers.NewSharedInformerFactory(fx.Client, 0)
	nsFactory := informers.NewSharedInformerFactoryWithOptions(fx.Client, 0, informers.WithNamespace(fx.Namespace))
	nodes := watch[*corev1.Node](t, factory.Core().V1().Nodes().Informer())
	pods := watch[*corev1.Pod](t, nsFactory.Core().V1().Pods().Informer())
	pvs := watch[*corev1.PersistentVolume](t, factory.Core().V1().PersistentVolumes().Informer())
	pvcs := watch[*corev1.PersistentVolumeClaim](t, nsFactory.Core().V1().PersistentVolumeClaims().Informer())
	vas := watch[*storagev1.VolumeAttachment](t, factory.Storage().V1().VolumeAttachments().Informer())
	csiDrivers := watch[*storagev1.CSIDriver](t, factory.Storage().V1().CSIDrivers().Informer())
	csiNodes := watch[*storagev1.CSINode](t, factory.Storage().V1().CSINodes().Informer())
	factory.StartWithContext(ctx)
	nsFactory.StartWithContext(ctx)
	t.Cleanup(func() { factory.Shutdown(); nsFactory.Shutdown() }) // after t.Context() is canceled
	for _, f := range []informers.SharedInformerFactory{factory, nsFactory} {
		if err := f.WaitForCacheSyncWithContext(ctx).AsError(); err != nil {
			t.Fatalf("informer caches did not sync: %v", err)
		}
	}

	node := fx.CreateNode(t, func(n *corev1.Node) { n.Labels["topology.example.com/zone"] = "z1" })
	got := waitFor(t, "Node", nodes, func(n *corev1.Node) bool { return n.Name == fx.NodeName })
	if got.UID != node.UID || got.Labels["topology.example.com/zone"] != "z1" {
		t.Errorf("Node from informer = %s uid=%s labels=%v, want uid %s with the zone label",
			got.Name, got.UID, got.Labels, node.UID)
	}

	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:    corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			ClaimRef:    &corev1.ObjectReference{Namespace: fx.Namespace, Name: "data"},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: driver, VolumeHandle: "vol-1", FSType: "ext4",
			}},
		},
	}
	if _, err := fx.Client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating PV: %v", err)
	}
	t.Cleanup(func() { _ = fx.Client.CoreV1().PersistentVolumes().Delete(cleanupCtx, pvName, metav1.DeleteOptions{}) })
	gotPV := waitFor(t, "PV", pvs, func(p *corev1.PersistentVolume) bool { return p.Name == pvName })
	if csi := gotPV.Spec.CSI; csi == nil || csi.Driver != driver || csi.VolumeHandle != "vol-1" {
		t.Errorf("PV CSI source from informer = %+v, want driver %s handle vol-1", gotPV.Spec.CSI, driver)
	}

	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: fx.Namespace},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
			VolumeName:  pvName,
		},
	}
	if _, err := fx.Client.CoreV1().PersistentVolumeClaims(fx.Namespace).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating PVC: %v", err)
	}
	gotPVC := waitFor(t, "PVC", pvcs, func(p *corev1.PersistentVolumeClaim) bool { return p.Name == "data" })
	if gotPVC.Spec.VolumeName != pvName {
		t.Errorf("PVC volumeName from informer = %q, want %q", gotPVC.Spec.VolumeName, pvName)
	}

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: fx.Namespace},
		Spec: corev1.PodSpec{
			NodeName: fx.NodeName,
			Containers: []corev1.Container{{
				Name: "app", Image: "registry.k8s.io/pause:3.10",
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"},
			}}},
		},
	}
	if _, err := fx.Client.CoreV1().Pods(fx.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating Pod: %v", err)
	}
	gotPod := waitFor(t, "Pod", pods, func(p *corev1.Pod) bool { return p.Name == "app" })
	if gotPod.Spec.NodeName != fx.NodeName || len(gotPod.Spec.Volumes) != 1 ||
		gotPod.Spec.Volumes[0].PersistentVolumeClaim == nil || gotPod.Spec.Volumes[0].PersistentVolumeClaim.ClaimName != "data" {
		t.Errorf("Pod from informer: nodeName=%q volumes=%+v, want node %q and claim data",
			gotPod.Spec.NodeName, gotPod.Spec.Volumes, fx.NodeName)
	}

	// VolumeAttachment: status is a subresource, so Create drops it and
	// only UpdateStatus sets it.
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: vaName},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: driver,
			NodeName: fx.NodeName,
			Source:   storagev1.VolumeAttachmentSource{PersistentVolumeName: ptr.To(pvName)},
		},
		Status: storagev1.VolumeAttachmentStatus{Attached: true},
	}
	created, err := fx.Client.StorageV1().VolumeAttachments().Create(ctx, va, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating VolumeAttachment: %v", err)
	}
	t.Cleanup(func() {
		_ = fx.Client.StorageV1().VolumeAttachments().Delete(cleanupCtx, vaName, metav1.DeleteOptions{})
	})
	if created.Status.Attached {
		t.Errorf("VolumeAttachment create set status.attached; the status subresource should have dropped it")
	}
	created.Status = storagev1.VolumeAttachmentStatus{
		Attached:           true,
		AttachmentMetadata: map[string]string{"devicePath": "/dev/xvdf"},
	}
	if _, err := fx.Client.StorageV1().VolumeAttachments().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("updating VolumeAttachment status: %v", err)
	}
	gotVA := waitFor(t, "attached VolumeAttachment", vas, func(v *storagev1.VolumeAttachment) bool {
		return v.Name == vaName && v.Status.Attached
	})
	if diff := cmp.Diff(map[string]string{"devicePath": "/dev/xvdf"}, gotVA.Status.AttachmentMetadata); diff != "" {
		t.Errorf("attachmentMetadata from informer mismatch (-want +got):\n%s", diff)
	}
	if gotVA.Spec.NodeName != fx.NodeName || ptr.Deref(gotVA.Spec.Source.PersistentVolumeName, "") != pvName {
		t.Errorf("VolumeAttachment spec from informer = %+v", gotVA.Spec)
	}

	// CSIDriver: the API server fills in defaults for unset fields.
	csiDriver := &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: driverName},
		Spec:       storagev1.CSIDriverSpec{AttachRequired: ptr.To(false)},
	}
	if _, err := fx.Client.StorageV1().CSIDrivers().Create(ctx, csiDriver, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating CSIDriver: %v", err)
	}
	t.Cleanup(func() { _ = fx.Client.StorageV1().CSIDrivers().Delete(cleanupCtx, driverName, metav1.DeleteOptions{}) })
	gotDriver := waitFor(t, "CSIDriver", csiDrivers, func(d *storagev1.CSIDriver) bool { return d.Name == driverName })
	if ptr.Deref(gotDriver.Spec.AttachRequired, true) || gotDriver.Spec.PodInfoOnMount == nil ||
		ptr.Deref(gotDriver.Spec.FSGroupPolicy, "") != storagev1.ReadWriteOnceWithFSTypeFSGroupPolicy {
		t.Errorf("CSIDriver spec from informer = %+v, want attachRequired=false and API defaults", gotDriver.Spec)
	}

	csiNode := &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: fx.NodeName},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{
			Name: driver, NodeID: "node-id-1", TopologyKeys: []string{"topology.example.com/zone"},
			Allocatable: &storagev1.VolumeNodeResources{Count: ptr.To[int32](8)},
		}}},
	}
	if _, err := fx.Client.StorageV1().CSINodes().Create(ctx, csiNode, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating CSINode: %v", err)
	}
	t.Cleanup(func() { _ = fx.Client.StorageV1().CSINodes().Delete(cleanupCtx, fx.NodeName, metav1.DeleteOptions{}) })
	gotCSINode := waitFor(t, "CSINode", csiNodes, func(n *storagev1.CSINode) bool { return n.Name == fx.NodeName })
	if diff := cmp.Diff(csiNode.Spec, gotCSINode.Spec); diff != "" {
		t.Errorf("CSINode spec from informer mismatch (-want +got):\n%s", diff)
	}
}

func TestRBACIsEnforcedForServiceAccounts(t *testing.T) {
	fx := k8stest.New(t)
	ctx := t.Context()
	cleanupCtx := context.WithoutCancel(ctx) // cleanups run after ctx is canceled
	sa, err := kubernetes.NewForConfig(fx.Env.ImpersonateServiceAccount(fx.Namespace, "csi-volmgr"))
	if err != nil {
		t.Fatalf("creating impersonating client: %v", err)
	}

	_, err = sa.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("listing Nodes as a ServiceAccount without RBAC rules: %v, want Forbidden", err)
	}

	name := k8stest.UniqueName(t.Name())
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list"}}},
	}
	if _, err := fx.Client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating ClusterRole: %v", err)
	}
	t.Cleanup(func() { _ = fx.Client.RbacV1().ClusterRoles().Delete(cleanupCtx, name, metav1.DeleteOptions{}) })
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: fx.Namespace, Name: "csi-volmgr"}},
	}
	if _, err := fx.Client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating ClusterRoleBinding: %v", err)
	}
	t.Cleanup(func() { _ = fx.Client.RbacV1().ClusterRoleBindings().Delete(cleanupCtx, name, metav1.DeleteOptions{}) })

	// The RBAC authorizer reads roles from an informer: poll until it has them.
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, eventTimeout, true, func(ctx context.Context) (bool, error) {
		_, err := sa.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("listing Nodes as the ServiceAccount never succeeded after binding the role: %v", err)
	}
	// The role grants list, not delete.
	err = sa.CoreV1().Nodes().Delete(ctx, "any-node", metav1.DeleteOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("deleting a Node with a list-only role: %v, want Forbidden", err)
	}
}

func TestAddUserIsSubjectToRBAC(t *testing.T) {
	env := k8stest.Shared(t)
	cfg, err := env.AddUser(k8stest.UniqueName("alice"))
	if err != nil {
		t.Fatalf("AddUser() error: %v", err)
	}
	alice, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("creating client: %v", err)
	}
	if _, err := alice.CoreV1().Namespaces().List(t.Context(), metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("listing namespaces as a user without roles: %v, want Forbidden", err)
	}
	if _, err := env.Client.CoreV1().Namespaces().List(t.Context(), metav1.ListOptions{}); err != nil {
		t.Errorf("listing namespaces as admin: %v", err)
	}
}

// TestStartWithAPIServerFlags starts a second, independent environment with
// changed kube-apiserver flags, as a test needing other authorization modes
// or feature gates does.
func TestStartWithAPIServerFlags(t *testing.T) {
	env, err := k8stest.Start(k8stest.Options{APIServerFlags: map[string][]string{
		"service-cluster-ip-range": {"10.96.0.0/24"},
		"authorization-mode":       {"Node,RBAC"},
	}})
	if err != nil {
		t.Fatalf("Start() error: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("Stop() error: %v", err)
		}
	})
	t.Logf("second environment ready after %v", env.StartupDuration)
	if len(env.KubeConfig) == 0 {
		t.Error("Env.KubeConfig is empty")
	}

	// The API server gives its own Service the first address of the range.
	var clusterIP string
	err = wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, eventTimeout, true, func(ctx context.Context) (bool, error) {
		svc, err := env.Client.CoreV1().Services(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // the Service appears shortly after start
		}
		clusterIP = svc.Spec.ClusterIP
		return true, nil
	})
	if err != nil {
		t.Fatalf("Service default/kubernetes did not appear: %v", err)
	}
	if clusterIP != "10.96.0.1" {
		t.Errorf("kubernetes Service clusterIP = %s, want 10.96.0.1 from --service-cluster-ip-range", clusterIP)
	}
}

// TestAPIServerOutage stops kube-apiserver while etcd runs on and starts it
// again: requests fail during the outage, and afterwards the same clients,
// the same users and a running informer work on, and the objects are all
// still there.
func TestAPIServerOutage(t *testing.T) {
	env, err := k8stest.Start(k8stest.Options{})
	if err != nil {
		t.Fatalf("Start() error: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("Stop() error: %v", err)
		}
	})
	userConfig, err := env.AddUser("outage-user", "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	user, err := kubernetes.NewForConfig(userConfig)
	if err != nil {
		t.Fatal(err)
	}
	ns := metav1.NamespaceDefault
	before := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "before-outage"}}
	if _, err := env.Client.CoreV1().ConfigMaps(ns).Create(t.Context(), before, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	factory := informers.NewSharedInformerFactoryWithOptions(env.Client, 0, informers.WithNamespace(ns))
	informer := factory.Core().V1().ConfigMaps().Informer()
	seen := watch[*corev1.ConfigMap](t, informer)
	factory.Start(t.Context().Done())
	t.Cleanup(factory.Shutdown)
	waitFor(t, "the ConfigMap made before the outage", seen, func(cm *corev1.ConfigMap) bool { return cm.Name == before.Name })

	if err := env.StopAPIServer(); err != nil {
		t.Fatalf("StopAPIServer() error: %v", err)
	}
	if err := env.StopAPIServer(); err != nil {
		t.Errorf("a second StopAPIServer() = %v, want nil", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	_, err = env.Client.CoreV1().ConfigMaps(ns).Get(ctx, before.Name, metav1.GetOptions{})
	cancel()
	if err == nil {
		t.Fatal("a GET succeeded while the API server was stopped")
	}

	if err := env.StartAPIServer(); err != nil {
		t.Fatalf("StartAPIServer() error: %v", err)
	}
	if err := env.StartAPIServer(); err != nil {
		t.Errorf("a second StartAPIServer() = %v, want nil", err)
	}
	for name, client := range map[string]kubernetes.Interface{"admin": env.Client, "user": user} {
		if _, err := client.CoreV1().ConfigMaps(ns).Get(t.Context(), before.Name, metav1.GetOptions{}); err != nil {
			t.Errorf("%s: GET of the ConfigMap made before the outage: %v", name, err)
		}
	}
	after := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after-outage"}}
	if _, err := env.Client.CoreV1().ConfigMaps(ns).Create(t.Context(), after, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating a ConfigMap after the outage: %v", err)
	}
	waitFor(t, "the ConfigMap made after the outage, through the informer started before it", seen,
		func(cm *corev1.ConfigMap) bool { return cm.Name == after.Name })
}

// TestNodeClientSigner: with Options.NodeClientSigner, a certificate of the
// Env's Signer authenticates as the kubelet of its Node, and the Node
// authorizer holds it there (a Secret list is refused); after an API server
// restart, which writes envtest's client CA file again, it still does.
func TestNodeClientSigner(t *testing.T) {
	env, err := k8stest.Start(k8stest.Options{NodeClientSigner: true, APIServerFlags: map[string][]string{
		"authorization-mode": {"Node,RBAC"},
	}})
	if err != nil {
		t.Fatalf("Start() error: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("Stop() error: %v", err)
		}
	})
	check := func(when string) {
		t.Helper()
		cfg, err := env.NodeConfig("n1")
		if err != nil {
			t.Fatal(err)
		}
		client, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		review, err := client.AuthenticationV1().SelfSubjectReviews().Create(t.Context(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("%s: SelfSubjectReview: %v", when, err)
		}
		if u := review.Status.UserInfo; u.Username != "system:node:n1" || !slices.Contains(u.Groups, "system:nodes") {
			t.Errorf("%s: the Signer's certificate is %s %v, want system:node:n1 in system:nodes", when, u.Username, u.Groups)
		}
		if _, err := client.CoreV1().Secrets("kube-system").List(t.Context(), metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("%s: a Node listing kube-system's Secrets: %v, want Forbidden", when, err)
		}
	}
	check("after the start")
	if err := env.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	if err := env.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	check("after a restart")
}
