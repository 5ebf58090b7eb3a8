package deploy_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
	"github.com/csi-volmgr/csi-volmgr/test/agent/agenttest"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

const (
	// pollInterval is how often the scenario asks the API server again.
	pollInterval = 100 * time.Millisecond
	// tokenAudience is the CSIDriver's tokenRequests audience.
	tokenAudience = "csi-volmgr-rbac-test"
	// publishFailures is how often NodePublishVolume fails first, so that
	// the agent records a FailedMount Event and then patches its count.
	publishFailures = 2
	// injectedMessage is the message of the injected NodePublishVolume error.
	injectedMessage = "injected by the RBAC test"
	// annotationControllerManaged tells the attach/detach controller to
	// create the VolumeAttachments of the node's volumes.
	annotationControllerManaged = "volumes.kubernetes.io/controller-managed-attach-detach"
	// nodeLeaseNamespace holds the nodes' heartbeat Leases.
	nodeLeaseNamespace = "kube-node-lease"
)

// scenario is one agent, run with the DaemonSet's command line as the
// DaemonSet's pod on a host would run it, serving its virtual node
// csi-volmgr-<host>, whose one pod uses a PV of the CSI test plugin. The
// plugin's CSIDriver needs attach and pod tokens, the PV has a
// node-publish Secret, its claim is created after the pod, and a stale
// CSINode from an earlier Node of the same name is waiting: together these
// touch everything the agent does on the API server.
type scenario struct {
	t     *testing.T
	env   *k8stest.Env
	f     *k8stest.Fixture
	agent *agentProcess
	// Host is the node the agent's pod runs on; Node the Node it serves,
	// and acts on the API server as.
	Host, Node string
	// User is the agent's Node identity, system:node:<Node>, and
	// BootstrapUser its ServiceAccount's, as the audit log names them.
	User, BootstrapUser string
	// AgentPod is the DaemonSet's pod on Host, which agentToken, the
	// ServiceAccount's, is bound to.
	AgentPod   *corev1.Pod
	agentToken string
	Driver     string
	Plugin     *plugintest.Plugin
	Handle     string
	PVName     string
	Pod        *corev1.Pod
	// registerNode is whether the agent runs with --register-node.
	registerNode bool
	// firstRenew is the node Lease's renewTime when the Node was first
	// seen registered.
	firstRenew time.Time
}

// scenarioOptions vary a scenario.
type scenarioOptions struct {
	// WatchList is the agent's WatchListClient gate (agentConfig).
	WatchList bool
	// Bootstrap starts the agent without a Node certificate: it asks for
	// one with its ServiceAccount token, and someone (the test, the
	// approver) must approve and sign it before the agent can go on.
	// Without it the agent starts with a certificate already issued.
	Bootstrap bool
}

// newScenario creates everything but the pod, installs grants for the
// agent's ServiceAccount (in the test's namespace: the manifests' subject
// csi-volmgr/csi-volmgr moved there), makes its pod-bound token and starts
// the agent and the plugin.
func newScenario(t *testing.T, env *k8stest.Env, agent *corev1.Container, grants []grant, o scenarioOptions) *scenario {
	t.Helper()
	f := env.NewFixture(t)
	installGrants(t, env, grants, f.Namespace, f.Namespace, agentName)
	s := &scenario{
		t: t, env: env, f: f,
		Host:          f.NodeName,
		BootstrapUser: "system:serviceaccount:" + f.Namespace + ":" + agentName,
		Driver:        "d" + utilrand.String(6) + ".rbac.csi-volmgr.io",
		PVName:        "pv-" + f.Namespace,
	}
	s.registerNode = slices.Contains(agent.Args, "--register-node")
	name, ok := flagValue(agent.Args, "node-name")
	if !ok || !strings.Contains(name, "$(NODE_NAME)") {
		t.Fatalf("the DaemonSet's --node-name=%q is not named after its host", name)
	}
	s.Node = strings.ReplaceAll(name, "$(NODE_NAME)", s.Host)
	s.User = "system:node:" + s.Node
	s.AgentPod, s.agentToken = agentPodToken(t, f.Client, f.Namespace, s.Host)

	dir := agentDir(t)
	for _, d := range []string{"root", "reg"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o750); err != nil {
			t.Fatal(err)
		}
	}
	caps := plugin.Capabilities{StageUnstage: true, Expand: true}
	s.Plugin = plugintest.Start(t, plugintest.Options{
		Name: s.Driver, NodeID: s.Node, Capabilities: &caps, RegistrationDir: filepath.Join(dir, "reg"),
	})
	if !s.registerNode {
		t.Fatal("the DaemonSet has no --register-node: nothing would create the agent's Node")
	}
	s.createObjects()
	if err := s.Plugin.SetFaults(plugin.FaultRule{
		Method: "NodePublishVolume", Code: codes.Internal, Message: injectedMessage, Times: publishFailures,
	}); err != nil {
		t.Fatal(err)
	}
	var cert []byte
	if !o.Bootstrap {
		cert = nodeCertificate(t, env, s.Node)
	}
	s.agent = startAgent(t, agentConfig{
		Container: agent, Env: env, Host: s.Host, BootstrapToken: s.agentToken, NodeCertificate: cert,
		Dir: dir, WatchList: o.WatchList,
	})
	if s.agent.NodeName != s.Node {
		t.Fatalf("the agent serves %s, want %s", s.agent.NodeName, s.Node)
	}
	return s
}

// agentPodToken creates the agent's ServiceAccount in ns and the
// DaemonSet's pod on host, and returns the pod and a token of the
// ServiceAccount bound to it: what the kubelet mounts into that pod, with
// the pod's node in its claims (the approver's proof of which host asks).
func agentPodToken(t *testing.T, c kubernetes.Interface, ns, host string) (*corev1.Pod, string) {
	t.Helper()
	ctx := t.Context()
	if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: agentName}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating the agent's ServiceAccount: %v", err)
	}
	pod, err := c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: agentName + "-" + utilrand.String(5)},
		Spec: corev1.PodSpec{
			NodeName: host, ServiceAccountName: agentName, AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{Name: agentName, Image: "registry.k8s.io/pause:3.10"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating the agent's pod: %v", err)
	}
	tr, err := c.CoreV1().ServiceAccounts(ns).CreateToken(ctx, agentName, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To(int64(3600)),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating the agent pod's token: %v", err)
	}
	return pod, tr.Status.Token
}

// createObjects creates, as the cluster's controllers and users would, the
// objects around the pod.
func (s *scenario) createObjects() {
	t, ctx, c, ns := s.t, s.t.Context(), s.f.Client, s.f.Namespace
	t.Helper()
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("creating %s: %v", what, err)
		}
	}
	// The pods' ServiceAccount, whose tokens the driver asks for.
	_, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	must("ServiceAccount default", err)
	_, err = c.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "publish-secret"},
		StringData: map[string]string{"password": "not-logged"},
	}, metav1.CreateOptions{})
	must("Secret", err)

	_, err = c.StorageV1().CSIDrivers().Create(ctx, &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: s.Driver},
		Spec: storagev1.CSIDriverSpec{
			AttachRequired:               ptr.To(true),
			PodInfoOnMount:               ptr.To(true),
			TokenRequests:                []storagev1.TokenRequest{{Audience: tokenAudience}},
			ServiceAccountTokenInSecrets: ptr.To(true),
		},
	}, metav1.CreateOptions{})
	must("CSIDriver", err)
	t.Cleanup(func() {
		ignoreNotFound(t, c.StorageV1().CSIDrivers().Delete(cleanupContext(t), s.Driver, metav1.DeleteOptions{}))
	})

	// Left behind by an earlier Node of the same name: the agent replaces it.
	_, err = c.StorageV1().CSINodes().Create(ctx, &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: s.Node, OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "v1", Kind: "Node", Name: s.Node, UID: types.UID("00000000-0000-0000-0000-00000000dead"),
		}}},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{}},
	}, metav1.CreateOptions{})
	must("stale CSINode", err)
	t.Cleanup(func() {
		ctx := cleanupContext(t)
		ignoreNotFound(t, c.StorageV1().CSINodes().Delete(ctx, s.Node, metav1.DeleteOptions{}))
		ignoreNotFound(t, c.CoreV1().Nodes().Delete(ctx, s.Node, metav1.DeleteOptions{}))
		ignoreNotFound(t, c.CoordinationV1().Leases(nodeLeaseNamespace).Delete(ctx, s.Node, metav1.DeleteOptions{}))
	})

	s.Handle = s.createVolume()
}

// createClaim creates the pod's PVC once the pod's condition says it is
// missing (the agent may read a claim of its pod that does not exist yet:
// the Node authorizer allows it, and answers Not Found), and binds it to
// its PV as the PV controller does: the claim names the volume, the volume
// is created with the claim's reference, and only then is the claim Bound.
// So the agent never asks for a PV before it exists, which the Node
// authorizer, knowing no relationship to it yet, would forbid.
func (s *scenario) createClaim(ctx context.Context) error {
	t, c, ns := s.t, s.f.Client, s.f.Namespace
	if err := s.waitMessage(ctx, `PVC "`+ns+`/data" not found`); err != nil {
		return err
	}
	size := resource.MustParse("1Gi")
	pvc, err := c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
			VolumeName:       s.PVName,
			StorageClassName: ptr.To(""),
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating the PVC: %w", err)
	}
	_, err = c.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: s.PVName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: ns, Name: pvc.Name, UID: pvc.UID},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: s.Driver, VolumeHandle: s.Handle,
				NodePublishSecretRef: &corev1.SecretReference{Namespace: ns, Name: "publish-secret"},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating the PV: %w", err)
	}
	t.Cleanup(func() {
		ignoreNotFound(t, c.CoreV1().PersistentVolumes().Delete(cleanupContext(t), s.PVName, metav1.DeleteOptions{}))
	})
	pvc.Status = corev1.PersistentVolumeClaimStatus{
		Phase: corev1.ClaimBound, AccessModes: pvc.Spec.AccessModes, Capacity: corev1.ResourceList{corev1.ResourceStorage: size},
	}
	if _, err = c.CoreV1().PersistentVolumeClaims(ns).UpdateStatus(ctx, pvc, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("binding the PVC: %w", err)
	}
	return nil
}

// waitMessage waits until the pod's VolumesReady condition message holds
// part.
func (s *scenario) waitMessage(ctx context.Context, part string) error {
	err := s.eventually(ctx, func(ctx context.Context) error {
		got, err := s.f.Client.CoreV1().Pods(s.f.Namespace).Get(ctx, s.Pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cond := volumesReady(got); cond == nil || !strings.Contains(cond.Message, part) {
			return fmt.Errorf("pod condition %s is %+v", status.ConditionVolumesReady, cond)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the pod condition to say %s: %w", part, err)
	}
	return nil
}

// attachWhenInUse does what the attach/detach controller and the external
// attacher do: once the Node reports the volume in use, it creates the
// VolumeAttachment and marks it attached. The agent looks for the
// VolumeAttachment before it exists, as it does in a cluster (the
// attach/detach controller creates it after the pod is scheduled): the Node
// authorizer forbids reading an attachment it knows no relationship of,
// which the agent takes as missing; it is created only once the pod's
// condition says so.
func (s *scenario) attachWhenInUse(ctx context.Context) error {
	t, c := s.t, s.f.Client
	want := corev1.UniqueVolumeName(volume.PersistentName(s.Driver, s.Handle))
	err := s.eventually(ctx, func(ctx context.Context) error {
		node, err := c.CoreV1().Nodes().Get(ctx, s.Node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !slices.Contains(node.Status.VolumesInUse, want) {
			return fmt.Errorf("Node volumesInUse %v lacks %s", node.Status.VolumesInUse, want)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the volume in use: %w", err)
	}
	vaName := volume.AttachmentName(s.Handle, s.Driver, s.Node)
	if err := s.waitMessage(ctx, "VolumeAttachment "+vaName+" does not exist"); err != nil {
		return err
	}
	va, err := c.StorageV1().VolumeAttachments().Create(ctx, &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: vaName},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: s.Driver, NodeName: s.Node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &s.PVName},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating the VolumeAttachment: %w", err)
	}
	t.Cleanup(func() {
		ignoreNotFound(t, c.StorageV1().VolumeAttachments().Delete(cleanupContext(t), vaName, metav1.DeleteOptions{}))
	})
	va.Status.Attached = true
	if _, err = c.StorageV1().VolumeAttachments().UpdateStatus(ctx, va, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("marking the VolumeAttachment attached: %w", err)
	}
	return nil
}

// createVolume creates a volume in the plugin, as an external provisioner
// would, and returns its handle.
func (s *scenario) createVolume() string {
	s.t.Helper()
	conn, err := s.Plugin.Dial()
	if err != nil {
		s.t.Fatal(err)
	}
	defer conn.Close()
	resp, err := csi.NewControllerClient(conn).CreateVolume(s.t.Context(), &csi.CreateVolumeRequest{
		Name: s.PVName,
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}},
	})
	if err != nil {
		s.t.Fatalf("CreateVolume: %v", err)
	}
	return resp.GetVolume().GetVolumeId()
}

// run drives the pod through its life and checks what a user would check
// at each step. It returns the first expectation that did not hold, or
// ctx's error.
func (s *scenario) run(ctx context.Context) error {
	steps := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"the virtual Node is registered", s.nodeRegistered},
		{"the pod's volume is published", s.podPublished},
		{"the runtime API answers an authorized caller only", s.runtimeAPIAnswers},
		{"the resized claim's file system is expanded", s.claimExpanded},
		{"the pod's deletion is completed after teardown", s.podDeleted},
		{"the driver is removed from the CSINode", s.driverRemoved},
		{"the node Lease is renewed", s.leaseRenewed},
	}
	for _, step := range steps {
		began := time.Now()
		if err := step.fn(ctx); err != nil {
			return fmt.Errorf("%s: %w", step.name, err)
		}
		s.t.Logf("%s (%v)", step.name, time.Since(began).Round(time.Millisecond))
	}
	return nil
}

// nodeRegistered waits, with --register-node, for the Node with the
// attach/detach annotation and its heartbeat Lease.
func (s *scenario) nodeRegistered(ctx context.Context) error {
	if !s.registerNode {
		return nil
	}
	c := s.f.Client
	return s.eventually(ctx, func(ctx context.Context) error {
		node, err := c.CoreV1().Nodes().Get(ctx, s.Node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if node.Annotations[annotationControllerManaged] != "true" {
			return fmt.Errorf("Node annotations %v lack %s=true", node.Annotations, annotationControllerManaged)
		}
		var lease *coordinationv1.Lease
		if lease, err = c.CoordinationV1().Leases(nodeLeaseNamespace).Get(ctx, s.Node, metav1.GetOptions{}); err != nil {
			return err
		}
		if lease.Spec.RenewTime == nil {
			return errors.New("the node Lease has no renewTime")
		}
		s.firstRenew = lease.Spec.RenewTime.Time
		return nil
	})
}

// leaseRenewed waits, with --register-node, until the agent has renewed the
// node Lease (every quarter of its 40s duration, as the kubelet).
func (s *scenario) leaseRenewed(ctx context.Context) error {
	if !s.registerNode {
		return nil
	}
	return s.eventually(ctx, func(ctx context.Context) error {
		lease, err := s.f.Client.CoordinationV1().Leases(nodeLeaseNamespace).Get(ctx, s.Node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if lease.Spec.RenewTime == nil || !lease.Spec.RenewTime.After(s.firstRenew) {
			return fmt.Errorf("the node Lease's renewTime is still %v", lease.Spec.RenewTime)
		}
		return nil
	})
}

// podPublished creates the pod, then its claim and volume, attaches the
// volume once it is reported in use, and waits until its VolumesReady condition
// is True, the plugin has published the volume at the kubelet's target path
// (with the Secret and the token), the target is a mount point, the Node
// reports the volume in use and the two failed publishes left one
// FailedMount Event counted twice.
func (s *scenario) podPublished(ctx context.Context) error {
	c, ns := s.f.Client, s.f.Namespace
	pod, err := c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "app"},
		Spec: corev1.PodSpec{
			NodeName:                     s.Node,
			ServiceAccountName:           "default",
			AutomountServiceAccountToken: ptr.To(false),
			Tolerations:                  []corev1.Toleration{{Key: "csi-volmgr.io/virtual", Operator: corev1.TolerationOpExists}},
			Containers: []corev1.Container{{
				Name: "app", Image: "registry.k8s.io/pause:3.10",
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"},
			}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating the pod: %w", err)
	}
	s.Pod = pod
	if err := s.createClaim(ctx); err != nil {
		return err
	}
	if err := s.attachWhenInUse(ctx); err != nil {
		return err
	}
	target := s.targetPath()
	return s.eventually(ctx, func(ctx context.Context) error {
		got, err := c.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cond := volumesReady(got); cond == nil || cond.Status != corev1.ConditionTrue {
			return fmt.Errorf("pod condition %s is %+v", status.ConditionVolumesReady, cond)
		}
		publishes := s.calls("NodePublishVolume")
		if len(publishes) == 0 || publishes[len(publishes)-1].Code() != codes.OK {
			return fmt.Errorf("no successful NodePublishVolume in the plugin's journal: %+v", publishes)
		}
		if p := publishes[len(publishes)-1].Begin.TargetPath; p != target {
			return fmt.Errorf("NodePublishVolume target %s, want %s", p, target)
		}
		if mounted, err := isMountPoint(target); err != nil {
			return err
		} else if !mounted {
			return fmt.Errorf("target %s is not a mount point", target)
		}
		node, err := c.CoreV1().Nodes().Get(ctx, s.Node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		want := corev1.UniqueVolumeName(volume.PersistentName(s.Driver, s.Handle))
		if !slices.Contains(node.Status.VolumesInUse, want) {
			return fmt.Errorf("Node volumesInUse %v lacks %s", node.Status.VolumesInUse, want)
		}
		events, err := c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, ev := range events.Items {
			if ev.InvolvedObject.UID == pod.UID && ev.Reason == "FailedMount" && strings.Contains(ev.Message, injectedMessage) && ev.Count >= publishFailures {
				return nil
			}
		}
		return fmt.Errorf("no FailedMount Event of the pod counted %d times among %d Events", publishFailures, len(events.Items))
	})
}

// claimExpanded resizes the pod's claim as the external-resizer does
// (allocatedResources, ControllerExpandVolume, the PV's capacity,
// NodeResizePending) and waits until the agent has expanded the volume on
// the node and written the claim's new capacity.
func (s *scenario) claimExpanded(ctx context.Context) error {
	c, ns := s.f.Client, s.f.Namespace
	size := resource.MustParse("2Gi")
	setStatus := func(rs corev1.ClaimResourceStatus) error {
		pvc, err := c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
		if err != nil {
			return err
		}
		pvc.Status.AllocatedResources = corev1.ResourceList{corev1.ResourceStorage: size}
		pvc.Status.AllocatedResourceStatuses = map[corev1.ResourceName]corev1.ClaimResourceStatus{corev1.ResourceStorage: rs}
		_, err = c.CoreV1().PersistentVolumeClaims(ns).UpdateStatus(ctx, pvc, metav1.UpdateOptions{})
		return err
	}
	if err := setStatus(corev1.PersistentVolumeClaimControllerResizeInProgress); err != nil {
		return fmt.Errorf("starting the resize: %w", err)
	}
	conn, err := s.Plugin.Dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := csi.NewControllerClient(conn).ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{
		VolumeId: s.Handle, CapacityRange: &csi.CapacityRange{RequiredBytes: size.Value()},
	}); err != nil {
		return fmt.Errorf("ControllerExpandVolume: %w", err)
	}
	pv, err := c.CoreV1().PersistentVolumes().Get(ctx, s.PVName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	pv.Spec.Capacity[corev1.ResourceStorage] = size
	if _, err := c.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("updating the PV's capacity: %w", err)
	}
	if err := setStatus(corev1.PersistentVolumeClaimNodeResizePending); err != nil {
		return fmt.Errorf("asking for node expansion: %w", err)
	}
	return s.eventually(ctx, func(ctx context.Context) error {
		pvc, err := c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got := pvc.Status.Capacity[corev1.ResourceStorage]; got.Cmp(size) != 0 || pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage] != "" {
			return fmt.Errorf("PVC status capacity %s, allocatedResourceStatuses %v", got.String(), pvc.Status.AllocatedResourceStatuses)
		}
		return nil
	})
}

// podDeleted deletes the pod gracefully, as a user does, and waits until
// the agent has unpublished and unstaged its volume and, with
// --register-node, finished the deletion as a kubelet would.
func (s *scenario) podDeleted(ctx context.Context) error {
	c, ns := s.f.Client, s.f.Namespace
	if err := c.CoreV1().Pods(ns).Delete(ctx, s.Pod.Name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("deleting the pod: %w", err)
	}
	target := s.targetPath()
	return s.eventually(ctx, func(ctx context.Context) error {
		if mounted, err := isMountPoint(target); err != nil {
			return err
		} else if mounted {
			return fmt.Errorf("target %s is still mounted", target)
		}
		if calls := s.calls("NodeUnstageVolume"); len(calls) == 0 || calls[len(calls)-1].Code() != codes.OK {
			return errors.New("no successful NodeUnstageVolume in the plugin's journal")
		}
		if !s.registerNode {
			return nil
		}
		_, err := c.CoreV1().Pods(ns).Get(ctx, s.Pod.Name, metav1.GetOptions{})
		if err == nil {
			return errors.New("the pod is still there")
		}
		if !apierrors.IsNotFound(err) {
			return err
		}
		return nil
	})
}

// driverRemoved stops the plugin, which removes its registration socket,
// and waits until the agent has removed the driver from the CSINode.
func (s *scenario) driverRemoved(ctx context.Context) error {
	if err := s.Plugin.Stop(); err != nil {
		return err
	}
	return s.eventually(ctx, func(ctx context.Context) error {
		csiNode, err := s.f.Client.StorageV1().CSINodes().Get(ctx, s.Node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if slices.ContainsFunc(csiNode.Spec.Drivers, func(d storagev1.CSINodeDriver) bool { return d.Name == s.Driver }) {
			return fmt.Errorf("CSINode still lists %s", s.Driver)
		}
		return nil
	})
}

// eventually polls check until it returns nil, the agent exits or ctx ends;
// then it returns ctx's cause with check's last error.
func (s *scenario) eventually(ctx context.Context, check func(context.Context) error) error {
	var last error
	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
		select {
		case <-s.agent.Exited():
			return false, fmt.Errorf("the agent exited: %w", s.agent.ExitErr())
		default:
		}
		last = check(ctx)
		return last == nil, nil
	})
	switch {
	case err == nil:
		return nil
	case ctx.Err() == nil:
		return err // the agent exited
	case last == nil:
		return context.Cause(ctx)
	default:
		return fmt.Errorf("%w (last: %w)", context.Cause(ctx), last)
	}
}

// calls returns the plugin's calls of method so far.
func (s *scenario) calls(method string) []plugin.Call {
	entries, err := s.Plugin.ReadJournal()
	if err != nil {
		s.t.Errorf("reading the plugin's journal: %v", err)
		return nil
	}
	return slices.DeleteFunc(plugin.Calls(entries), func(c plugin.Call) bool { return c.Begin.Method != method })
}

// targetPath is where the kubelet, and so the agent, publishes the pod's
// PV: <root>/pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount.
func (s *scenario) targetPath() string {
	return filepath.Join(s.agent.Root, "pods", string(s.Pod.UID), "volumes", "kubernetes.io~csi", s.PVName, "mount")
}

// volumesReady returns the pod's VolumesReady condition.
func volumesReady(pod *corev1.Pod) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == status.ConditionVolumesReady {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

// isMountPoint tells whether path is a mount point.
func isMountPoint(path string) (bool, error) {
	mps, err := agenttest.MountsBelow(filepath.Dir(path))
	if err != nil {
		return false, err
	}
	return slices.Contains(mps, path), nil
}
