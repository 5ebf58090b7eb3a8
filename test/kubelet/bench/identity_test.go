package bench_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/certificate"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

// EnvIdentity names an environment variable with the identity both agents
// act as on the API server (issue 36):
//
//   - "admin" (default): the API server's admin credentials (system:masters)
//     under --authorization-mode=RBAC, as every table before issue 36;
//   - "node": each agent is the kubelet of the world's Node,
//     system:node:<Node> in system:nodes, under --authorization-mode=Node,RBAC
//     and the NodeRestriction admission plugin, as kubeadm and kind run the
//     API server. The kubelet gets a kubeconfig holding the Node's client
//     certificate; csi-volmgr runs with --node-identity and finds the same
//     kind of certificate in its --cert-dir (<root-dir>/pki), where its
//     certificate manager would have put an issued one, so no CSR and no
//     controller-manager are needed; its --kubeconfig (the bootstrap
//     credentials) stays the admin one and is not used while the
//     certificate is valid. The world's own setup and teardown (pods, PVs,
//     claims, VolumeAttachments, the Node's status) stay admin.
const EnvIdentity = "KUBELET_BENCH_IDENTITY"

// identity is a value of EnvIdentity.
type identity string

const (
	identityAdmin identity = "admin"
	identityNode  identity = "node"
)

// agentIdentity is EnvIdentity, read by TestMain before the API server starts.
var agentIdentity = identityAdmin

// nodeCertValidity is the lifetime of the Node certificates the harness
// issues: longer than any run, and short of csi-volmgr's renewal (at 70–90
// % of the lifetime), which would ask for a CSR that nothing signs here.
const nodeCertValidity = 24 * time.Hour

// identitySetting is the settings key of results.json that says under which
// identity the agents were measured.
const identitySetting = "agent identity"

// parseIdentity reads EnvIdentity.
func parseIdentity() (identity, error) {
	switch s := identity(os.Getenv(EnvIdentity)); s {
	case "", identityAdmin:
		return identityAdmin, nil
	case identityNode:
		return identityNode, nil
	default:
		return "", fmt.Errorf("%s=%q: want %s or %s", EnvIdentity, s, identityAdmin, identityNode)
	}
}

// envOptions are the shared API server's options for the identity: with
// node, the Node authorizer, NodeRestriction and a client CA whose key the
// harness holds (k8stest.Env.Signer), which issues the Nodes' certificates.
func envOptions(id identity) k8stest.Options {
	if id != identityNode {
		return k8stest.Options{}
	}
	return k8stest.Options{
		NodeClientSigner: true,
		APIServerFlags: map[string][]string{
			"authorization-mode":       {"Node,RBAC"},
			"enable-admission-plugins": {"NodeRestriction"},
		},
	}
}

// describeIdentity is identitySetting's value.
func describeIdentity(id identity) string {
	if id == identityNode {
		return "node (system:node:<Node> in system:nodes; --authorization-mode=Node,RBAC, NodeRestriction)"
	}
	return "admin (system:masters; --authorization-mode=RBAC)"
}

// nodeCert issues a client certificate of the world's Node,
// system:node:<Node> in system:nodes, and its key (PEM).
func (w *world) nodeCert(tb testing.TB) (certPEM, keyPEM []byte) {
	tb.Helper()
	signer := w.fx.Env.Signer
	if signer == nil {
		tb.Fatalf("%s=%s: the API server runs without the Node client signer", EnvIdentity, agentIdentity)
	}
	user := nodeUser(w.fx.NodeName)
	certPEM, keyPEM, err := signer.ClientCert(user, nodeCertValidity, nodeGroup)
	if err != nil {
		tb.Fatal(err)
	}
	// Asked of kube-apiserver directly, never through a counting proxy
	// (whose counts it would join): who the certificate makes its holder.
	client, err := kubernetes.NewForConfig(k8stest.CertConfig(w.fx.Env.Config, certPEM, keyPEM))
	if err != nil {
		tb.Fatal(err)
	}
	review, err := client.AuthenticationV1().SelfSubjectReviews().Create(tb.Context(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		tb.Fatalf("the Node's certificate: SelfSubjectReview: %v", err)
	}
	if got := review.Status.UserInfo; got.Username != user || !slices.Contains(got.Groups, nodeGroup) {
		tb.Fatalf("the Node's certificate authenticates as %s in %v, want %s in %s", got.Username, got.Groups, user, nodeGroup)
	}
	return certPEM, keyPEM
}

// nodeUser and nodeGroup are the Node authorizer's: the kubelet of Node
// <name> is user system:node:<name> in group system:nodes.
func nodeUser(node string) string { return "system:node:" + node }

const nodeGroup = "system:nodes"

// volmgrPairPrefix is the name prefix of csi-volmgr's certificate files in
// its --cert-dir (volumemanager/nodeidentity: csi-volmgr-client-<stamp>.pem
// and the link csi-volmgr-client-current.pem).
const volmgrPairPrefix = "csi-volmgr-client"

// agentAccess is how an agent of kind on root directory root reaches the
// API server as agentIdentity: its kubeconfig's content and its flags
// beyond kind.args. The API server is the world's, or its counting proxy
// (w.proxy).
func (w *world) agentAccess(tb testing.TB, kind *agentKind, root string) (kubeconfig []byte, args []string) {
	tb.Helper()
	// The admin kubeconfig, or the proxy's without credentials: what the
	// agents got before issue 36, and csi-volmgr's bootstrap credentials.
	admin := w.fx.Env.KubeConfig
	if w.proxy != nil {
		admin = w.proxy.kubeconfig(tb, nil, nil)
	}
	if agentIdentity != identityNode {
		return admin, nil
	}
	certPEM, keyPEM := w.nodeCert(tb)
	if kind != volmgr {
		// The kubelet: a kubeconfig with the Node's client certificate, as
		// its --kubeconfig holds after TLS bootstrap.
		if w.proxy != nil {
			return w.proxy.kubeconfig(tb, certPEM, keyPEM), nil
		}
		cfg := w.fx.Env.Config
		return kubeconfigFor(tb, cfg.Host, cfg.CAData, certPEM, keyPEM), nil
	}
	// csi-volmgr: the certificate where its certificate manager keeps the
	// one it was issued (--cert-dir's default, <root-dir>/pki, mode 0700),
	// written by client-go's file store as the manager writes it.
	dir := filepath.Join(root, "pki")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		tb.Fatal(err)
	}
	store, err := certificate.NewFileStore(volmgrPairPrefix, dir, dir, "", "")
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := store.Update(certPEM, keyPEM); err != nil {
		tb.Fatalf("writing csi-volmgr's Node certificate: %v", err)
	}
	return admin, []string{"--node-identity"}
}

// kubeconfigFor is a kubeconfig naming server (trusting caPEM, if any), with
// the client certificate certPEM and its key keyPEM if given, else no
// credentials.
func kubeconfigFor(tb testing.TB, server string, caPEM, certPEM, keyPEM []byte) []byte {
	tb.Helper()
	c := clientcmdapi.NewConfig()
	c.Clusters["bench"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	c.AuthInfos["bench"] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	c.Contexts["bench"] = &clientcmdapi.Context{Cluster: "bench", AuthInfo: "bench"}
	c.CurrentContext = "bench"
	data, err := clientcmd.Write(*c)
	if err != nil {
		tb.Fatal(err)
	}
	return data
}
