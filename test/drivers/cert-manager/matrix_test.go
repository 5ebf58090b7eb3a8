//go:build drivers

package certmanager_test

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/test/drivers/drivertest"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

// auditPolicy records who creates CertificateRequests: with useTokenRequest the driver creates
// them with the pod's own token.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
rules:
- level: Metadata
  verbs: ["create"]
  resources:
  - group: cert-manager.io
    resources: ["certificaterequests"]
- level: None
`

// matrix is what the check and the lifecycle share.
type matrix struct {
	env *k8stest.Env
	dyn dynamic.Interface
	// dir holds the logs, the audit log and the kubeconfigs; removed after a passing run.
	dir, auditLog    string
	driverKubeconfig string
	signer           *signer
}

// startMatrix starts etcd and kube-apiserver (Node,RBAC authorization, NodeRestriction and an
// audit log of CertificateRequest creations; a client CA for the agent's Node certificate),
// applies the CertificateRequest CRD from the cert-manager module the driver requires, the
// driver's RBAC and CSIDriver as its chart renders them, and starts the signer.
func startMatrix(t *testing.T) *matrix {
	t.Helper()
	dir := k8stest.KeptDir(t, "drivers-cert-manager-")
	m := &matrix{dir: dir, auditLog: filepath.Join(dir, "audit.log")}
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	m.env = k8stest.StartNodeRestricted(t, map[string][]string{
		"audit-policy-file": {policy},
		"audit-log-path":    {m.auditLog},
		"audit-log-format":  {"json"},
		"audit-log-mode":    {"blocking"},
	})
	ctx := t.Context()
	a := drivertest.NewApplier(t, m.env.Config)
	m.dyn = a.Dyn
	crds := filepath.Join(drivertest.ModuleDir(t, toolsDir, certManagerModule), "deploy", "crds")
	if err := a.ApplyFile(ctx, filepath.Join(crds, "cert-manager.io_certificaterequests.yaml"), nil); err != nil {
		t.Fatal(err)
	}
	if err := a.WaitEstablished(ctx, "certificaterequests.cert-manager.io"); err != nil {
		t.Fatal(err)
	}

	c := m.env.Client
	for _, ns := range []string{driverNamespace, appNamespace, checkNamespace} {
		if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, sa := range []struct{ ns, name string }{{driverNamespace, driverServiceAccount}, {appNamespace, appServiceAccount}} {
		if _, err := c.CoreV1().ServiceAccounts(sa.ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa.name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The chart's ClusterRole and binding (templates/clusterrole.yaml, clusterrolebinding.yaml),
	// and what its useTokenRequest needs of the application: its ServiceAccount may create
	// CertificateRequests in its namespace.
	crRules := []rbacv1.PolicyRule{{APIGroups: []string{"cert-manager.io"}, Resources: []string{"certificaterequests"}, Verbs: []string{"watch", "create", "delete", "list"}}}
	if _, err := c.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "cert-manager-csi-driver"}, Rules: crRules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "cert-manager-csi-driver"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cert-manager-csi-driver"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: driverNamespace, Name: driverServiceAccount}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RbacV1().Roles(appNamespace).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "request-certificates"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"cert-manager.io"}, Resources: []string{"certificaterequests"}, Verbs: []string{"create"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RbacV1().RoleBindings(appNamespace).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "request-certificates"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "request-certificates"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: appNamespace, Name: appServiceAccount}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The CSIDriver of templates/csidriver.yaml with app.driver.useTokenRequest=true.
	if _, err := c.StorageV1().CSIDrivers().Create(ctx, &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: driverName},
		Spec: storagev1.CSIDriverSpec{
			PodInfoOnMount:       ptr.To(true),
			VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecycleEphemeral},
			TokenRequests:        []storagev1.TokenRequest{{Audience: "", ExpirationSeconds: ptr.To[int64](3600)}},
			RequiresRepublish:    ptr.To(true),
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	token, err := drivertest.ServiceAccountToken(ctx, m.env, driverNamespace, driverServiceAccount)
	if err != nil {
		t.Fatal(err)
	}
	m.driverKubeconfig = filepath.Join(dir, "driver.kubeconfig")
	if err := os.WriteFile(m.driverKubeconfig, drivertest.TokenKubeconfig(t, m.env.Config, token), 0o600); err != nil {
		t.Fatal(err)
	}

	m.signer = newSigner(t, m.dyn, certLifetime)
	done := make(chan struct{})
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		defer close(done)
		m.signer.run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return m
}

// pluginFlags are the node plugin's flags as its chart renders them (templates/daemonset.yaml,
// values app.logLevel 4 and app.driver.useTokenRequest), for a csi-volmgr whose --root-dir is
// root.
func pluginFlags(root, node, dataRoot string, useTokenRequest bool) []string {
	return []string{
		"--log-level=4",
		"--driver-name=" + driverName,
		"--node-id=" + node,
		"--endpoint=unix://" + filepath.Join(root, "plugins", "cert-manager-csi-driver", "csi.sock"),
		"--data-root=" + dataRoot,
		"--use-token-request=" + map[bool]string{true: "true", false: "false"}[useTokenRequest],
		"--metrics-bind-address=0",
	}
}

// dataRootFlag is --data-root for the data directory dir, relative to / where the node plugin
// runs: the driver mounts its tmpfs at the path as given but lists it through os.DirFS("/")
// (csi-lib storage.Filesystem), which refuses an absolute path ("readdir /...: invalid
// argument"); its chart gives the relative csi-data-dir in a container whose working directory
// is /.
func dataRootFlag(dir string) string { return strings.TrimPrefix(dir, "/") }

// pluginEnv is the node plugin's credentials (in a DaemonSet pod, its ServiceAccount's).
func (m *matrix) pluginEnv() []string { return []string{"KUBECONFIG=" + m.driverKubeconfig} }

// auditEvent is what the test reads of an audit event.
type auditEvent struct {
	Verb      string `json:"verb"`
	ObjectRef struct {
		Resource  string `json:"resource"`
		Namespace string `json:"namespace"`
	} `json:"objectRef"`
	User struct {
		Username string              `json:"username"`
		Extra    map[string][]string `json:"extra"`
	} `json:"user"`
	ResponseStatus struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
}

// creations are the audit log's successful creations of CertificateRequests.
func (m *matrix) creations() ([]auditEvent, error) {
	f, err := os.Open(m.auditLog)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []auditEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 4<<20)
	for sc.Scan() {
		var e auditEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, err
		}
		if e.Verb == "create" && e.ObjectRef.Resource == "certificaterequests" && e.ResponseStatus.Code == 201 {
			out = append(out, e)
		}
	}
	return out, sc.Err()
}
