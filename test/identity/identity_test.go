//go:build e2e

package identity_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/mount-utils"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/test/agent/agenttest"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
	"github.com/csi-volmgr/csi-volmgr/volumemanager/csrapprover"
)

const (
	// appNamespace holds the workload: its pod on the agent's Node, the
	// claim, the Secrets and ServiceAccounts.
	appNamespace = "apps"
	// csiAudience is the audience of the token the CSIDriver asks for
	// (spec.tokenRequests): the agent asks for it, as its Node, at publish.
	csiAudience = "identity-e2e.csi-volmgr.io"
	// conditionVolumesReady is the pod condition the agent writes.
	conditionVolumesReady corev1.PodConditionType = "csi-volmgr.io/VolumesReady"
	// certFile is the agent's certificate and key in its --cert-dir
	// (<root-dir>/pki by default).
	certFile = "csi-volmgr-client-current.pem"
	// builtInApproval is the reason of kube-controller-manager's approvals.
	builtInApproval = "AutoApproved"

	byNodeAuthorizer  = "the Node authorizer (then RBAC)"
	byNodeRestriction = "NodeRestriction admission"
)

// world is what the subtests share: the control plane, the host's objects,
// the agent and its workload.
type world struct {
	cp    *controlPlane
	admin kubernetes.Interface

	// host is the host's own Node (as its kubelet registered it);
	// agentNode is the agent's, csi-volmgr-<host>; otherNode a Node name
	// of the same form for another host.
	host, agentNode, otherNode string
	// saUser is the agent's bootstrap identity, nodeUser its Node's.
	saUser, nodeUser string
	// hostPod is the agent DaemonSet's pod on host; bootstrapToken its
	// pod-bound token, the agent's only credential.
	hostPod        *corev1.Pod
	bootstrapToken string

	driver string
	plugin *plugintest.Plugin
	agent  *agenttest.Agent
	pvName string
	appPod *corev1.Pod

	// nodeConfig authenticates with the agent's certificate, from its
	// certificate directory (user agent probeUserAgent).
	nodeConfig *rest.Config
	node       kubernetes.Interface
}

// TestNodeIdentity: the agent bootstraps its Node identity through
// csi-volmgr's approver and kube-controller-manager's signer, publishes
// and tears down a volume with no other credential and no request
// refused; a certificate for another Node is denied; and the agent's own
// certificate reaches its Node's objects only.
func TestNodeIdentity(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: the CSI test plugin mounts (make e2e runs as root)")
	}
	// Build the agent and the plugin while the API server starts.
	go func() { _, _ = agenttest.Binary() }()
	go func() { _, _ = plugintest.Binary() }()
	began := time.Now()
	w := &world{cp: startControlPlane(t)}
	w.admin = w.cp.env.Client
	w.host = k8stest.UniqueName("host")
	w.agentNode = csrapprover.DefaultNodeNamePrefix + w.host
	w.otherNode = csrapprover.DefaultNodeNamePrefix + k8stest.UniqueName("other")
	w.saUser = "system:serviceaccount:" + agentNamespace + ":" + agentServiceAccount
	w.nodeUser = "system:node:" + w.agentNode
	w.setUpHost(t)
	w.setUpWorkload(t)
	t.Logf("%6.1fs control plane and objects ready", time.Since(began).Seconds())

	t.Run("BuiltInApproverAndSignerRun", w.builtInApproverAndSignerRun)
	if !t.Run("AgentBootstrapsAsItsNode", w.agentBootstrapsAsItsNode) {
		t.FailNow()
	}
	t.Logf("%6.1fs agent acts as %s", time.Since(began).Seconds(), w.nodeUser)
	t.Run("AgentPublishesAVolume", w.agentPublishesAVolume)
	t.Run("OtherNodesCertificateWithTheBootstrapToken", w.otherNodesCertificate)
	t.Run("CompromisedHost", w.compromisedHost)
	t.Run("AgentTearsDown", w.agentTearsDown)
	t.Run("NoRequestOfTheAgentForbidden", w.noRequestForbidden)
	t.Logf("%6.1fs done", time.Since(began).Seconds())
}

// setUpHost makes what a cluster has for a host before the agent starts:
// the host's Node, Lease and CSINode (its kubelet's), and the agent
// DaemonSet's pod bound to it, whose pod-bound token is the agent's
// bootstrap credential.
func (w *world) setUpHost(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	if _, err := w.admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: w.host, Labels: map[string]string{corev1.LabelHostname: w.host}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: w.host, Namespace: corev1.NamespaceNodeLease},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(w.host), LeaseDurationSeconds: ptr.To[int32](40)},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.admin.StorageV1().CSINodes().Create(ctx, &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: w.host}, Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err := w.admin.CoreV1().Pods(agentNamespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "csi-volmgr-" + utilrand.String(5), Namespace: agentNamespace,
			Labels: map[string]string{"app.kubernetes.io/name": "csi-volmgr"}},
		Spec: corev1.PodSpec{
			NodeName: w.host, ServiceAccountName: agentServiceAccount,
			Containers: []corev1.Container{{Name: "csi-volmgr", Image: "csi-volmgr"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w.hostPod = pod
	w.bootstrapToken = serviceAccountToken(t, w.admin, agentNamespace, agentServiceAccount, pod)
	u := whoAmI(t, tokenConfig(w.cp.env.Config, w.bootstrapToken))
	if u.Username != w.saUser || !slices.Equal(u.Extra[csrapprover.ExtraNodeName], []string{w.host}) ||
		!slices.Equal(u.Extra[csrapprover.ExtraPodName], []string{pod.Name}) {
		t.Fatalf("the bootstrap token authenticates as %s with extras %v; want %s bound to pod %s on node %s",
			u.Username, u.Extra, w.saUser, pod.Name, w.host)
	}
}

// setUpWorkload makes the CSIDriver, the workload's namespace, its
// ServiceAccounts and Secrets, a claim of no pod on the agent's Node, the
// agent (not started), the CSI test plugin and a static volume with its
// PV and claim.
func (w *world) setUpWorkload(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	// The simplest honest setup: a driver without attach (no external-attacher
	// needed), asking for a token of the pod's ServiceAccount at publish.
	w.driver = "identity-" + utilrand.String(5) + ".e2e.csi-volmgr.io"
	if _, err := w.admin.StorageV1().CSIDrivers().Create(ctx, &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: w.driver},
		Spec: storagev1.CSIDriverSpec{AttachRequired: ptr.To(false), PodInfoOnMount: ptr.To(false),
			TokenRequests: []storagev1.TokenRequest{{Audience: csiAudience}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: appNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, sa := range []string{"app", "lonely"} {
		if _, err := w.admin.CoreV1().ServiceAccounts(appNamespace).Create(ctx, &corev1.ServiceAccount{
			ObjectMeta: metav1.ObjectMeta{Name: sa, Namespace: appNamespace}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"publish-creds", "unrelated"} {
		if _, err := w.admin.CoreV1().Secrets(appNamespace).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: appNamespace},
			Data:       map[string][]byte{"password": []byte(name + "-" + utilrand.String(8))},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.admin.CoreV1().PersistentVolumeClaims(appNamespace).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: appNamespace},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptr.To("e2e-none"),
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The agent exists before the plugin, so that the plugin's cleanup
	// (unmount what is left of its volumes) runs after the agent stopped
	// and before the agent's directory is removed.
	w.agent = agenttest.New(t, agenttest.Options{
		KubeConfig: tokenKubeconfig(t, w.cp.env.Config, w.bootstrapToken),
		NodeName:   w.agentNode,
		ExtraArgs:  []string{"--node-identity", "--register-node"},
	})
	w.plugin = plugintest.Start(t, plugintest.Options{Name: w.driver, NodeID: w.agentNode, RegistrationDir: w.agent.RegistrationDir,
		Capabilities: &plugin.Capabilities{StageUnstage: true}, Verbosity: 4})

	conn, err := w.plugin.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	w.pvName = "pv-" + utilrand.String(5)
	vol, err := csi.NewControllerClient(conn).CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: w.pvName,
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 16 << 20},
	})
	if err != nil {
		t.Fatal(err)
	}
	// A static PV reserved for the claim, and the claim naming it: the PV
	// binder of kube-controller-manager binds them.
	if _, err := w.admin.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: w.pvName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:         corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("16Mi")},
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: "",
			ClaimRef:         &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: appNamespace, Name: "data"},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: w.driver, VolumeHandle: vol.GetVolume().GetVolumeId(),
				NodePublishSecretRef: &corev1.SecretReference{Namespace: appNamespace, Name: "publish-creds"},
			}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.admin.CoreV1().PersistentVolumeClaims(appNamespace).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: appNamespace},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptr.To(""),
			VolumeName:       w.pvName,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("16Mi")}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// builtInApproverAndSignerRun: kube-controller-manager approves (csrapproving)
// and signs (csrsigning) a kubelet client request of a requester allowed
// certificatesigningrequests/nodeclient (here admin): both controllers run,
// so what they leave alone later they leave alone by their rules.
func (w *world) builtInApproverAndSignerRun(t *testing.T) {
	csr := createCSR(t, w.admin, "system:node:kubelet-"+utilrand.String(5))
	csr = waitCSR(t, w.admin, csr.Name, "approved and issued", func(c *certificatesv1.CertificateSigningRequest) bool {
		if !w.cp.kcm.Running() {
			t.Fatalf("kube-controller-manager exited: %v", w.cp.kcm.ExitErr())
		}
		return len(c.Status.Certificate) > 0
	})
	if a := condition(csr, certificatesv1.CertificateApproved); a == nil || a.Reason != builtInApproval {
		t.Fatalf("CSR %s of admin: approval %+v, want reason %s", csr.Name, a, builtInApproval)
	}
	w.checkIssued(t, csr.Status.Certificate, csr.Spec.Request)
}

// agentBootstrapsAsItsNode: the agent, with only its pod-bound token, asks
// for system:node:csi-volmgr-<host>; kube-controller-manager's approver
// looks at the request and leaves it (the token may not create
// certificatesigningrequests/nodeclient); csi-volmgr's approver, started
// only then, approves it (the token is bound to a pod on <host>);
// kube-controller-manager signs it; the agent acts as its Node.
func (w *world) agentBootstrapsAsItsNode(t *testing.T) {
	ctx := t.Context()
	startCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	started := make(chan error, 1)
	go func() { started <- w.agent.Start(startCtx) }()

	var agentCSR *certificatesv1.CertificateSigningRequest
	waitFor(t, "the agent's CSR", func(ctx context.Context) (bool, error) {
		list, err := w.admin.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for i := range list.Items {
			if list.Items[i].Spec.Username == w.saUser {
				agentCSR = &list.Items[i]
				return true, nil
			}
		}
		select {
		case err := <-started:
			return false, fmt.Errorf("the agent started (%w) without a certificate", err)
		default:
		}
		return false, nil
	})
	w.waitBuiltInApproverLooked(t, 0)
	csr, err := w.admin.CertificatesV1().CertificateSigningRequests().Get(ctx, agentCSR.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(csr.Status.Conditions) > 0 || len(csr.Status.Certificate) > 0 {
		t.Fatalf("the agent's CSR %s was decided without csi-volmgr's approver: %+v", csr.Name, csr.Status.Conditions)
	}
	t.Logf("kube-controller-manager's approver left the agent's CSR %s pending", csr.Name)

	w.cp.startApprover(t)
	if err := <-started; err != nil {
		t.Fatalf("the agent did not start: %v", err)
	}
	csr, err = w.admin.CertificatesV1().CertificateSigningRequests().Get(ctx, agentCSR.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cn := requestCN(t, csr.Spec.Request); cn != w.nodeUser {
		t.Errorf("the agent's CSR asks for %s, want %s", cn, w.nodeUser)
	}
	if !slices.Equal(csr.Spec.Extra[csrapprover.ExtraNodeName], []string{w.host}) ||
		!slices.Equal(csr.Spec.Extra[csrapprover.ExtraPodName], []string{w.hostPod.Name}) {
		t.Errorf("the agent's CSR carries the extras %v; want node-name %s and pod-name %s", csr.Spec.Extra, w.host, w.hostPod.Name)
	}
	a := condition(csr, certificatesv1.CertificateApproved)
	if a == nil || a.Reason != csrapprover.ConditionReasonApprove || len(csr.Status.Certificate) == 0 {
		t.Fatalf("the agent's CSR %s: conditions %+v, certificate %d bytes; want approved with reason %s and issued",
			csr.Name, csr.Status.Conditions, len(csr.Status.Certificate), csrapprover.ConditionReasonApprove)
	}
	if c := condition(csr, certificatesv1.CertificateDenied); c != nil || countReason(csr, builtInApproval) > 0 {
		t.Errorf("the agent's CSR has conditions %+v; want only csi-volmgr's approval", csr.Status.Conditions)
	}
	t.Logf("approved by csi-volmgr's approver: %s", a.Message)

	// Why the built-in approver leaves it: the check it makes.
	sar, err := w.admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{User: csr.Spec.Username, Groups: csr.Spec.Groups, UID: csr.Spec.UID,
			Extra: extraValues(csr.Spec.Extra),
			ResourceAttributes: &authorizationv1.ResourceAttributes{Group: "certificates.k8s.io", Resource: "certificatesigningrequests",
				Subresource: "nodeclient", Verb: "create"}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sar.Status.Allowed {
		t.Errorf("the agent's bootstrap token may create certificatesigningrequests/nodeclient: the built-in approver would approve any node it names")
	}

	// The certificate in the agent's certificate directory.
	pair, err := os.ReadFile(filepath.Join(w.agent.RootDir, "pki", certFile))
	if err != nil {
		t.Fatalf("the agent's certificate: %v", err)
	}
	w.checkIssued(t, pair, csr.Spec.Request)
	w.nodeConfig = k8stest.CertConfig(w.cp.env.Config, pair, pair)
	w.nodeConfig.UserAgent = probeUserAgent
	w.node = mustClient(t, w.nodeConfig)
	u := whoAmI(t, w.nodeConfig)
	if u.Username != w.nodeUser || !slices.Contains(u.Groups, "system:nodes") {
		t.Fatalf("the agent's certificate authenticates as %s %v; want %s in system:nodes", u.Username, u.Groups, w.nodeUser)
	}

	// It registered its Node and published its driver into its CSINode.
	waitFor(t, "the agent's Node and CSINode", func(ctx context.Context) (bool, error) {
		if _, err := w.admin.CoreV1().Nodes().Get(ctx, w.agentNode, metav1.GetOptions{}); err != nil {
			return false, nil //nolint:nilerr // not yet
		}
		cn, err := w.admin.StorageV1().CSINodes().Get(ctx, w.agentNode, metav1.GetOptions{})
		return err == nil && slices.ContainsFunc(cn.Spec.Drivers, func(d storagev1.CSINodeDriver) bool { return d.Name == w.driver }), nil
	})
}

// waitBuiltInApproverLooked waits until kube-controller-manager's approver
// asked about the agent's bootstrap identity more than before times, and
// checks it was never allowed.
func (w *world) waitBuiltInApproverLooked(t *testing.T, before int) {
	t.Helper()
	var sars []sarEvent
	waitFor(t, "kube-controller-manager's approver to look at the request", func(context.Context) (bool, error) {
		sars = builtInApproverSARs(t, w.cp.audit(t), w.saUser)
		return len(sars) > before, nil
	})
	for _, s := range sars {
		if s.allowed {
			t.Fatalf("kube-controller-manager's approver was allowed %s certificatesigningrequests/%s for %s", s.verb, s.subresource, s.user)
		}
	}
	t.Logf("kube-controller-manager's approver asked %d time(s) whether %s may create certificatesigningrequests/nodeclient: no",
		len(sars), w.saUser)
}

// agentPublishesAVolume: a pod on the agent's Node with a claim gets its
// volume published (a real mount) and VolumesReady; the agent read the
// claim, the volume and the publish Secret and asked for the
// CSIDriver's token, all as its Node.
func (w *world) agentPublishesAVolume(t *testing.T) {
	ctx := t.Context()
	waitFor(t, "the claim to be bound", func(ctx context.Context) (bool, error) {
		c, err := w.admin.CoreV1().PersistentVolumeClaims(appNamespace).Get(ctx, "data", metav1.GetOptions{})
		return err == nil && c.Status.Phase == corev1.ClaimBound, nil
	})
	pod, err := w.admin.CoreV1().Pods(appNamespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: appNamespace},
		Spec: corev1.PodSpec{
			NodeName: w.agentNode, ServiceAccountName: "app",
			Containers: []corev1.Container{{Name: "app", Image: "app",
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}, {Name: "token", MountPath: "/var/run/token"}}}},
			Volumes: []corev1.Volume{
				{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}},
				// A projected token for the API server (no audience): not
				// a CSI volume, the agent leaves it alone; it lets the
				// Node ask for such a token of the pod's ServiceAccount.
				{Name: "token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
					{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}}}}}},
			},
			TerminationGracePeriodSeconds: ptr.To[int64](5),
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w.appPod = pod
	waitFor(t, "VolumesReady", func(ctx context.Context) (bool, error) {
		p, err := w.admin.CoreV1().Pods(appNamespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range p.Status.Conditions {
			if c.Type == conditionVolumesReady {
				return c.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	})
	target := filepath.Join(w.agent.RootDir, "pods", string(pod.UID), "volumes", "kubernetes.io~csi", w.pvName, "mount")
	if ok, err := mount.New("").IsMountPoint(target); err != nil || !ok {
		t.Fatalf("%s is not a mount point (%v)", target, err)
	}
	entries, err := w.plugin.ReadJournal()
	if err != nil {
		t.Fatal(err)
	}
	published := slices.ContainsFunc(plugin.Calls(entries), func(c plugin.Call) bool {
		return c.Begin.Method == "NodePublishVolume" && c.Code().String() == "OK" && c.Begin.TokensDigest != ""
	})
	if !published {
		t.Fatalf("no successful NodePublishVolume with the CSIDriver's token in the plugin's journal")
	}
	t.Logf("published at %s (a mount), with a token of apps/app for %s", target, csiAudience)
}

// otherNodesCertificate: with the agent's bootstrap token (bound to a pod
// on <host>), a request for another Node's certificate: kube-controller-
// manager's approver leaves it, csi-volmgr's denies it, nobody issues it.
func (w *world) otherNodesCertificate(t *testing.T) {
	ctx := t.Context()
	w.cp.stopApprover(t)
	before := len(builtInApproverSARs(t, w.cp.audit(t), w.saUser))
	sa := mustClient(t, tokenConfig(w.cp.env.Config, w.bootstrapToken))
	csr := createCSR(t, sa, "system:node:"+w.otherNode)
	w.waitBuiltInApproverLooked(t, before)
	got, err := w.admin.CertificatesV1().CertificateSigningRequests().Get(ctx, csr.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Conditions) > 0 || len(got.Status.Certificate) > 0 {
		t.Fatalf("CSR %s for %s decided without csi-volmgr's approver: %+v", csr.Name, w.otherNode, got.Status.Conditions)
	}
	w.cp.startApprover(t)
	got = waitCSR(t, w.admin, csr.Name, "denied", func(c *certificatesv1.CertificateSigningRequest) bool {
		return condition(c, certificatesv1.CertificateDenied) != nil || condition(c, certificatesv1.CertificateApproved) != nil
	})
	d := condition(got, certificatesv1.CertificateDenied)
	if d == nil || d.Reason != csrapprover.ConditionReasonDeny {
		t.Fatalf("CSR %s for %s with the bootstrap token: %+v; want denied with reason %s", csr.Name, w.otherNode, got.Status.Conditions, csrapprover.ConditionReasonDeny)
	}
	t.Logf("denied by csi-volmgr's approver: %s", d.Message)
	// Nothing issues it later.
	time.Sleep(3 * time.Second)
	got, err = w.admin.CertificatesV1().CertificateSigningRequests().Get(ctx, csr.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Certificate) > 0 || condition(got, certificatesv1.CertificateApproved) != nil {
		t.Fatalf("CSR %s for %s: %+v, certificate %d bytes", csr.Name, w.otherNode, got.Status.Conditions, len(got.Status.Certificate))
	}
}

// compromisedHost: what root on the agent's host reaches with the agent's
// certificate. Each subtest is a row of "What a compromised agent host
// can reach"; the ones named "...ItsPod..." or "...ItsNode..." without
// "Refused" show what it can, so that the refusals are not "everything is
// refused".
func (w *world) compromisedHost(t *testing.T) {
	if w.node == nil || w.appPod == nil {
		t.Fatal("needs the agent's certificate and its pod")
	}
	n := w.node
	noRelation := fmt.Sprintf("no relationship found between node '%s' and this object", w.agentNode)
	notOtherNode := fmt.Sprintf("node %q is not allowed to modify node %q", w.agentNode, w.host)
	boundToApp := &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: w.appPod.Name, UID: w.appPod.UID}
	// NodeRestriction's words for a token of an audience no volume of the
	// pod names changed in 1.37; the refusal is the same (make test-skew).
	otherAudience := fmt.Sprintf("%s is not authorized to request tokens for audience %q", w.nodeUser, "https://elsewhere.example")
	if !k8stest.ServerVersion(t, w.admin).AtLeast(37) {
		otherAudience = fmt.Sprintf("audience %q not found in pod spec volume, %s is not authorized to request tokens for this audience",
			"https://elsewhere.example", w.nodeUser)
	}
	token := func(ctx context.Context, ns, sa string, spec authenticationv1.TokenRequestSpec) error {
		_, err := n.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{Spec: spec}, metav1.CreateOptions{})
		return err
	}
	rows := []struct {
		name string
		// by and want say who refuses and what the refusal says; by
		// empty: allowed.
		by, want string
		do       func(t *testing.T) error
	}{
		// ServiceAccount tokens.
		{"TokenForItsPodsServiceAccountBoundToItsPod", "", "", func(t *testing.T) error {
			ctx := t.Context()
			return token(ctx, appNamespace, "app", authenticationv1.TokenRequestSpec{Audiences: []string{csiAudience}, BoundObjectRef: boundToApp})
		}},
		{"TokenForServiceAccountWithNoPodOnItsNodeRefused", byNodeAuthorizer, noRelation, func(t *testing.T) error {
			ctx := t.Context()
			return token(ctx, appNamespace, "lonely", authenticationv1.TokenRequestSpec{BoundObjectRef: boundToApp})
		}},
		{"TokenForTheBootstrapServiceAccountRefused", byNodeAuthorizer, noRelation, func(t *testing.T) error {
			ctx := t.Context()
			return token(ctx, agentNamespace, agentServiceAccount, authenticationv1.TokenRequestSpec{BoundObjectRef: &authenticationv1.BoundObjectReference{
				Kind: "Pod", APIVersion: "v1", Name: w.hostPod.Name, UID: w.hostPod.UID}})
		}},
		{"TokenNotBoundToAPodRefused", byNodeRestriction, "node requested token not bound to a pod", func(t *testing.T) error {
			ctx := t.Context()
			return token(ctx, appNamespace, "app", authenticationv1.TokenRequestSpec{})
		}},
		{"TokenForAnAudienceNoVolumeOfItsPodNamesRefused", byNodeRestriction, otherAudience, func(t *testing.T) error {
			ctx := t.Context()
			return token(ctx, appNamespace, "app", authenticationv1.TokenRequestSpec{Audiences: []string{"https://elsewhere.example"}, BoundObjectRef: boundToApp})
		}},
		// Secrets.
		{"SecretItsPodsVolumeReferences", "", "", func(t *testing.T) error {
			ctx := t.Context()
			_, err := n.CoreV1().Secrets(appNamespace).Get(ctx, "publish-creds", metav1.GetOptions{})
			return err
		}},
		{"SecretNoPodOnItsNodeReferencesRefused", byNodeAuthorizer, noRelation, func(t *testing.T) error {
			ctx := t.Context()
			_, err := n.CoreV1().Secrets(appNamespace).Get(ctx, "unrelated", metav1.GetOptions{})
			return err
		}},
		{"ListSecretsRefused", byNodeAuthorizer, `cannot list resource "secrets"`, func(t *testing.T) error {
			ctx := t.Context()
			_, err := n.CoreV1().Secrets(appNamespace).List(ctx, metav1.ListOptions{})
			return err
		}},
		// Claims.
		{"ClaimItsPodUses", "", "", func(t *testing.T) error {
			ctx := t.Context()
			_, err := n.CoreV1().PersistentVolumeClaims(appNamespace).Get(ctx, "data", metav1.GetOptions{})
			return err
		}},
		{"ClaimNoPodOnItsNodeUsesRefused", byNodeAuthorizer, noRelation, func(t *testing.T) error {
			ctx := t.Context()
			_, err := n.CoreV1().PersistentVolumeClaims(appNamespace).Get(ctx, "other", metav1.GetOptions{})
			return err
		}},
		// Other Nodes and their objects.
		{"ReadAnotherNodeRefused", byNodeAuthorizer, fmt.Sprintf("node '%s' cannot read '%s', only its own Node object", w.agentNode, w.host),
			func(t *testing.T) error {
				ctx := t.Context()
				_, err := n.CoreV1().Nodes().Get(ctx, w.host, metav1.GetOptions{})
				return err
			}},
		{"LabelAnotherNodeRefused", byNodeRestriction, notOtherNode, func(t *testing.T) error {
			ctx := t.Context()
			_, err := n.CoreV1().Nodes().Patch(ctx, w.host, types.MergePatchType,
				[]byte(`{"metadata":{"labels":{"e2e.csi-volmgr.io/hijacked":"true"}}}`), metav1.PatchOptions{})
			return err
		}},
		{"PatchAnotherNodesStatusRefused", byNodeRestriction, notOtherNode, func(t *testing.T) error {
			ctx := t.Context()
			_, err := n.CoreV1().Nodes().Patch(ctx, w.host, types.StrategicMergePatchType,
				[]byte(`{"status":{"conditions":[{"type":"Ready","status":"False","reason":"Hijacked"}]}}`), metav1.PatchOptions{}, "status")
			return err
		}},
		{"DeleteAnotherNodeRefused", byNodeAuthorizer, `cannot delete resource "nodes"`, func(t *testing.T) error {
			ctx := t.Context()
			return n.CoreV1().Nodes().Delete(ctx, w.host, metav1.DeleteOptions{})
		}},
		{"PatchAnotherNodesCSINodeRefused", byNodeAuthorizer, "can only access CSINode with the same name as the requesting node", func(t *testing.T) error {
			ctx := t.Context()
			_, err := n.StorageV1().CSINodes().Patch(ctx, w.host, types.MergePatchType,
				[]byte(`{"metadata":{"labels":{"e2e.csi-volmgr.io/hijacked":"true"}}}`), metav1.PatchOptions{})
			return err
		}},
		{"PatchAnotherNodesLeaseRefused", byNodeAuthorizer, "can only access node lease with the same name as the requesting node", func(t *testing.T) error {
			ctx := t.Context()
			_, err := n.CoordinationV1().Leases(corev1.NamespaceNodeLease).Patch(ctx, w.host, types.MergePatchType,
				[]byte(fmt.Sprintf(`{"spec":{"holderIdentity":%q}}`, w.agentNode)), metav1.PatchOptions{})
			return err
		}},
		{"CertificateForAnotherNodeRefused", byNodeRestriction, "can only create a node CSR with CN=" + w.nodeUser, func(t *testing.T) error {
			ctx := t.Context()
			_, err := n.CertificatesV1().CertificateSigningRequests().Create(ctx, newCSR(t, "system:node:"+w.otherNode), metav1.CreateOptions{})
			return err
		}},
		// Pods.
		{"ListPodsOfItsNode", "", "", func(t *testing.T) error {
			ctx := t.Context()
			_, err := n.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + w.agentNode})
			return err
		}},
		{"ListPodsOfTheClusterRefused", byNodeAuthorizer, "can only list/watch pods with spec.nodeName field selector", func(t *testing.T) error {
			ctx := t.Context()
			_, err := n.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
			return err
		}},
		{"ReadAPodOnAnotherNodeRefused", byNodeAuthorizer, noRelation, func(t *testing.T) error {
			ctx := t.Context()
			_, err := n.CoreV1().Pods(agentNamespace).Get(ctx, w.hostPod.Name, metav1.GetOptions{})
			return err
		}},
		{"DeleteAPodOnAnotherNodeRefused", byNodeRestriction, fmt.Sprintf("node %q can only delete pods with spec.nodeName set to itself", w.agentNode),
			func(t *testing.T) error {
				ctx := t.Context()
				return n.CoreV1().Pods(agentNamespace).Delete(ctx, w.hostPod.Name, metav1.DeleteOptions{})
			}},
		{"PatchStatusOfAPodOnAnotherNodeRefused", byNodeRestriction, fmt.Sprintf("node %q can only update pod status for pods with spec.nodeName set to itself", w.agentNode),
			func(t *testing.T) error {
				ctx := t.Context()
				_, err := n.CoreV1().Pods(agentNamespace).Patch(ctx, w.hostPod.Name, types.StrategicMergePatchType,
					[]byte(`{"status":{"conditions":[{"type":"e2e.csi-volmgr.io/Hijacked","status":"True"}]}}`), metav1.PatchOptions{}, "status")
				return err
			}},
		{"CreateAPodRefused", byNodeRestriction, "can only create mirror pods", func(t *testing.T) error {
			ctx := t.Context()
			_, err := n.CoreV1().Pods(appNamespace).Create(ctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "intruder", Namespace: appNamespace},
				Spec: corev1.PodSpec{NodeName: w.agentNode, ServiceAccountName: "lonely",
					Containers: []corev1.Container{{Name: "c", Image: "intruder"}}},
			}, metav1.CreateOptions{})
			return err
		}},
		// Its own Node.
		{"RestrictedLabelOnItsOwnNodeRefused", byNodeRestriction, "is not allowed to modify labels: node-restriction.kubernetes.io/foo", func(t *testing.T) error {
			ctx := t.Context()
			_, err := n.CoreV1().Nodes().Patch(ctx, w.agentNode, types.MergePatchType,
				[]byte(`{"metadata":{"labels":{"node-restriction.kubernetes.io/foo":"bar"}}}`), metav1.PatchOptions{})
			return err
		}},
		{"TaintsOfItsOwnNodeRefused", byNodeRestriction, fmt.Sprintf("node %q is not allowed to modify taints", w.agentNode), func(t *testing.T) error {
			ctx := t.Context()
			own, err := n.CoreV1().Nodes().Get(ctx, w.agentNode, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("reading its own Node: %w", err)
			}
			patch := `{"spec":{"taints":[]}}` // drop them all
			if len(own.Spec.Taints) == 0 {
				patch = `{"spec":{"taints":[{"key":"e2e.csi-volmgr.io/added","effect":"NoSchedule"}]}}`
			}
			_, err = n.CoreV1().Nodes().Patch(ctx, w.agentNode, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
			return err
		}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			err := row.do(t)
			if row.by == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				t.Log("allowed")
				return
			}
			refused(t, err, row.by, row.want)
		})
	}
	// The renewal: the Node asks for its own certificate again, and
	// csi-volmgr's approver approves it (kube-controller-manager's does not:
	// system:nodes is not bound to selfnodeclient here).
	t.Run("RenewalOfItsOwnCertificate", func(t *testing.T) {
		csr := createCSR(t, n, w.nodeUser)
		csr = waitCSR(t, w.admin, csr.Name, "approved and issued", func(c *certificatesv1.CertificateSigningRequest) bool {
			return len(c.Status.Certificate) > 0 || condition(c, certificatesv1.CertificateDenied) != nil
		})
		a := condition(csr, certificatesv1.CertificateApproved)
		if a == nil || a.Reason != csrapprover.ConditionReasonApprove || len(csr.Status.Certificate) == 0 {
			t.Fatalf("the Node's own CSR: %+v; want approved by csi-volmgr's approver and issued", csr.Status.Conditions)
		}
		w.checkIssued(t, csr.Status.Certificate, csr.Spec.Request)
		t.Logf("allowed: %s", a.Message)
	})
}

func refused(t *testing.T, err error, by, want string) {
	t.Helper()
	switch {
	case err == nil:
		t.Fatalf("allowed; want Forbidden by %s", by)
	case !apierrors.IsForbidden(err):
		t.Fatalf("%v; want Forbidden by %s", err, by)
	case !strings.Contains(err.Error(), want):
		t.Fatalf("Forbidden, but %q does not say %q (%s)", err, want, by)
	}
	t.Logf("refused by %s: %v", by, err)
}

// agentTearsDown: the pod is deleted; the agent unpublishes and unstages,
// then deletes the pod (it is the Node's only agent), and nothing is left
// mounted.
func (w *world) agentTearsDown(t *testing.T) {
	if w.appPod == nil {
		t.Fatal("no pod")
	}
	ctx := t.Context()
	if err := w.admin.CoreV1().Pods(appNamespace).Delete(ctx, w.appPod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the pod to be gone", func(ctx context.Context) (bool, error) {
		_, err := w.admin.CoreV1().Pods(appNamespace).Get(ctx, w.appPod.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	waitFor(t, "nothing mounted and the volume unstaged", func(ctx context.Context) (bool, error) {
		mps, err := agenttest.MountsBelow(w.agent.Dir)
		if err != nil {
			return false, err
		}
		vols, err := w.agent.Volumes(ctx)
		return err == nil && len(mps) == 0 && len(vols) == 0, nil
	})
	entries, err := w.plugin.ReadJournal()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"NodeUnpublishVolume", "NodeUnstageVolume"} {
		if !slices.ContainsFunc(plugin.Calls(entries), func(c plugin.Call) bool { return c.Begin.Method == m && c.Code().String() == "OK" }) {
			t.Errorf("no successful %s in the plugin's journal", m)
		}
	}
	if _, err := os.Stat(filepath.Join(w.agent.RootDir, "pods", string(w.appPod.UID))); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the pod's directory is left: %v", err)
	}
}

// noRequestForbidden: from the audit log, no request of the agent (as its
// Node, or with its bootstrap token; its watches included, audited once the
// agent stopped) was refused during the whole run, the
// bootstrap token was used for the CSR only, and the agent did read the
// publish Secret and ask for the token as its Node; its log has no
// "forbidden" either.
func (w *world) noRequestForbidden(t *testing.T) {
	// A watch is audited when it ends: stop the agent (SIGTERM, as a
	// drain; an unclean exit or a race report fails) so that its watches
	// are in the log too.
	if err := w.agent.Stop(); err != nil {
		t.Errorf("stopping the agent: %v", err)
	}
	var events []auditEvent
	waitFor(t, "the agent's watches in the audit log", func(context.Context) (bool, error) {
		events = w.cp.audit(t)
		return slices.ContainsFunc(events, func(ev auditEvent) bool {
			return ev.User.Username == w.nodeUser && ev.UserAgent != probeUserAgent && ev.Verb == "watch"
		}), nil
	})
	counts := map[string]int{}
	var asNode, asSA int
	for _, ev := range events {
		as := "node"
		switch {
		case ev.UserAgent == probeUserAgent:
			continue
		case ev.User.Username == w.nodeUser:
			asNode++
		case ev.User.Username == w.saUser:
			asSA++
			as = "token"
			if ev.ObjectRef == nil || ev.ObjectRef.Resource != "certificatesigningrequests" {
				t.Errorf("the bootstrap token was used for %s (%s)", ev.access(), ev.RequestURI)
			}
		case strings.HasPrefix(ev.User.Username, "system:serviceaccount:"+agentNamespace+":"+approverServiceAccount):
			if ev.code() == 401 || ev.code() == 403 {
				t.Errorf("csi-volmgr's approver was refused %s %s: %d %s", ev.access(), ev.RequestURI, ev.code(), ev.ResponseStatus.Message)
			}
			continue
		default:
			continue
		}
		counts[fmt.Sprintf("%-5s %s %d", as, ev.access(), ev.code())]++
		if ev.code() == 401 || ev.code() == 403 {
			t.Errorf("the agent's request was refused: %s %s as %s: %d %s", ev.access(), ev.RequestURI, ev.User.Username, ev.code(), ev.ResponseStatus.Message)
		}
	}
	if asNode == 0 || asSA == 0 {
		t.Fatalf("the audit log has %d requests of the agent as its Node and %d with its bootstrap token", asNode, asSA)
	}
	for _, want := range []struct{ verb, resource, sub, name string }{
		{"get", "secrets", "", "publish-creds"},
		{"create", "serviceaccounts", "token", "app"},
		{"create", "nodes", "", ""},
		{"patch", "pods", "status", "app"},
	} {
		if !slices.ContainsFunc(events, func(ev auditEvent) bool {
			return ev.User.Username == w.nodeUser && ev.UserAgent != probeUserAgent && ev.Verb == want.verb && ev.ObjectRef != nil &&
				ev.ObjectRef.Resource == want.resource && ev.ObjectRef.Subresource == want.sub &&
				(want.name == "" || ev.ObjectRef.Name == want.name) && ev.code() < 300
		}) {
			t.Errorf("the audit log has no successful %s %s/%s %s of the agent as its Node", want.verb, want.resource, want.sub, want.name)
		}
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "\n  %4d  %s", counts[k], k)
	}
	t.Logf("the agent's requests (%d as %s, %d as %s), by user, access and code:%s", asNode, w.nodeUser, asSA, w.saUser, b.String())

	data, err := os.ReadFile(w.agent.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	forbidden := regexp.MustCompile(`(?i)forbidden`)
	var lines []string
	for _, l := range strings.Split(string(data), "\n") {
		if forbidden.MatchString(l) {
			lines = append(lines, l)
		}
	}
	if len(lines) > 0 {
		t.Errorf("the agent's log has %d lines with \"forbidden\", e.g.:\n%s", len(lines), strings.Join(lines[:min(10, len(lines))], "\n"))
	}
}

// newCSR is a kubelet client certificate request for cn (group
// system:nodes) with a new ECDSA key, as client-go's certificate manager
// makes it.
func newCSR(t *testing.T, cn string) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: cn, Organization: []string{"system:nodes"}}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: csrapprover.SignerName,
			Usages:     []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
		},
	}
}

func createCSR(t *testing.T, client kubernetes.Interface, cn string) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	csr, err := client.CertificatesV1().CertificateSigningRequests().Create(t.Context(), newCSR(t, cn), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating a CSR for %s: %v", cn, err)
	}
	return csr
}

func waitCSR(t *testing.T, client kubernetes.Interface, name, what string, done func(*certificatesv1.CertificateSigningRequest) bool) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	var csr *certificatesv1.CertificateSigningRequest
	waitFor(t, "CSR "+name+" "+what, func(ctx context.Context) (bool, error) {
		c, err := client.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		csr = c
		return done(c), nil
	})
	return csr
}

func condition(csr *certificatesv1.CertificateSigningRequest, typ certificatesv1.RequestConditionType) *certificatesv1.CertificateSigningRequestCondition {
	for i := range csr.Status.Conditions {
		if csr.Status.Conditions[i].Type == typ {
			return &csr.Status.Conditions[i]
		}
	}
	return nil
}

func countReason(csr *certificatesv1.CertificateSigningRequest, reason string) int {
	n := 0
	for _, c := range csr.Status.Conditions {
		if c.Reason == reason {
			n++
		}
	}
	return n
}

func extraValues(extra map[string]certificatesv1.ExtraValue) map[string]authorizationv1.ExtraValue {
	out := map[string]authorizationv1.ExtraValue{}
	for k, v := range extra {
		out[k] = authorizationv1.ExtraValue(v)
	}
	return out
}

func requestCN(t *testing.T, request []byte) string {
	t.Helper()
	block, _ := pem.Decode(request)
	if block == nil {
		t.Fatal("no PEM certificate request")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return req.Subject.CommonName
}

// checkIssued checks that certPEM (its first certificate) was issued by the
// Env's Signer for the subject and key of the request.
func (w *world) checkIssued(t *testing.T, certPEM, request []byte) {
	t.Helper()
	var cert *x509.Certificate
	for rest := certPEM; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			t.Fatal("no certificate in the PEM data")
		}
		if block.Type == "CERTIFICATE" {
			c, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			cert = c
			break
		}
	}
	caPEM, err := os.ReadFile(w.cp.env.Signer.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	caBlock, _ := pem.Decode(caPEM)
	ca, err := x509.ParseCertificate(caBlock.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if err := cert.CheckSignatureFrom(ca); err != nil {
		t.Errorf("the certificate of %s is not signed by the kubelet client signer: %v", cert.Subject.CommonName, err)
	}
	block, _ := pem.Decode(request)
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if cert.Subject.CommonName != req.Subject.CommonName || !slices.Equal(cert.Subject.Organization, []string{"system:nodes"}) {
		t.Errorf("certificate subject %v, want CN %s O system:nodes", cert.Subject, req.Subject.CommonName)
	}
	if !slices.Contains(cert.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
		t.Errorf("certificate of %s without client auth", cert.Subject.CommonName)
	}
	if until := time.Until(cert.NotAfter); until <= 0 {
		t.Errorf("certificate of %s expired at %v", cert.Subject.CommonName, cert.NotAfter)
	}
}
