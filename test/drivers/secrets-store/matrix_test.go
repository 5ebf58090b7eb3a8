//go:build drivers

package secretsstore_test

import (
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/csi-volmgr/csi-volmgr/test/drivers/drivertest"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

// matrix is what the check and the lifecycle share: the control plane with the driver's CRDs,
// CSIDriver and RBAC, and the driver's credentials.
type matrix struct {
	env *k8stest.Env
	dyn dynamic.Interface
	// dir holds the logs and the kubeconfigs; it is removed after a passing run.
	dir string
	// driverKubeconfig is the node plugin's kubeconfig: a token of its ServiceAccount, as its
	// DaemonSet pod has in-cluster.
	driverKubeconfig string
	// providerRecord is the file the provider appends its Mount calls to.
	providerRecord string
}

// startMatrix starts etcd and kube-apiserver (Node,RBAC authorization and NodeRestriction, as
// kubeadm and kind run it; a client CA whose key the Env holds, for the agent's Node
// certificate), kube-controller-manager's garbage collector (it removes a deleted pod's
// SecretProviderClassPodStatus through its ownerReference), and applies the driver's CRDs,
// CSIDriver and RBAC from its module.
func startMatrix(t *testing.T) *matrix {
	t.Helper()
	dir := k8stest.KeptDir(t, "drivers-secrets-store-")
	env := k8stest.StartNodeRestricted(t, nil)
	m := &matrix{env: env, dir: dir, providerRecord: filepath.Join(dir, "provider-mounts.jsonl")}
	admin := filepath.Join(dir, "admin.kubeconfig")
	if err := os.WriteFile(admin, env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	drivertest.StartProc(t, dir, "kube-controller-manager", drivertest.K8sBin(t, "kube-controller-manager"), nil,
		"--kubeconfig="+admin, "--leader-elect=false", "--secure-port=0",
		"--controllers=garbage-collector-controller", "--v=2")

	ctx := t.Context()
	a := drivertest.NewApplier(t, env.Config)
	m.dyn = a.Dyn
	mod := drivertest.ModuleDir(t, toolsDir, driverModule)
	crds := filepath.Join(mod, "charts", "secrets-store-csi-driver", "crds")
	for _, f := range []string{"secrets-store.csi.x-k8s.io_secretproviderclasses.yaml", "secrets-store.csi.x-k8s.io_secretproviderclasspodstatuses.yaml"} {
		if err := a.ApplyFile(ctx, filepath.Join(crds, f), nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"secretproviderclasses.secrets-store.csi.x-k8s.io", "secretproviderclasspodstatuses.secrets-store.csi.x-k8s.io"} {
		if err := a.WaitEstablished(ctx, name); err != nil {
			t.Fatalf("CRD %s: %v", name, err)
		}
	}
	// The node plugin's ServiceAccount, ClusterRole and binding.
	if err := a.ApplyFile(ctx, filepath.Join(mod, "deploy", "rbac-secretproviderclass.yaml"), nil); err != nil {
		t.Fatal(err)
	}
	// The CSIDriver as the chart renders it with enableSecretRotation=true and tokenRequests set,
	// on Kubernetes 1.35 and later (templates/csidriver.yaml): requiresRepublish, the
	// tokenRequests, and serviceAccountTokenInSecrets (the tokens travel in the secrets of
	// NodePublishVolume, not in its volume context).
	if err := a.ApplyFile(ctx, filepath.Join(mod, "deploy", "csidriver.yaml"), func(u *unstructured.Unstructured) bool {
		for _, set := range []struct {
			value any
			field string
		}{
			{[]any{map[string]any{"audience": audience}}, "tokenRequests"},
			{true, "serviceAccountTokenInSecrets"},
			{true, "requiresRepublish"},
		} {
			if err := unstructured.SetNestedField(u.Object, set.value, "spec", set.field); err != nil {
				t.Fatal(err)
			}
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}

	token, err := drivertest.ServiceAccountToken(ctx, env, driverNamespace, driverServiceAccount)
	if err != nil {
		t.Fatal(err)
	}
	m.driverKubeconfig = filepath.Join(dir, "driver.kubeconfig")
	if err := os.WriteFile(m.driverKubeconfig, drivertest.TokenKubeconfig(t, env.Config, token), 0o600); err != nil {
		t.Fatal(err)
	}

	// The application: its namespace, ServiceAccount and SecretProviderClass.
	if _, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: appNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.CoreV1().ServiceAccounts(appNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: appServiceAccount}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.dyn.Resource(spcGVR).Namespace(appNamespace).Create(ctx, spc(`{"api-key":"first"}`), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return m
}

// pluginFlags are the node plugin's flags as its chart renders them (values: logVerbosity 2, and
// with rotation enableSecretRotation true and rotationPollInterval 2s), for a csi-volmgr whose
// --root-dir is root.
func pluginFlags(root, node, providers, additionalProviders, metrics string, rotation bool) []string {
	flags := []string{
		"-v=2",
		"--endpoint=unix://" + filepath.Join(root, "plugins", "csi-secrets-store", "csi.sock"),
		"--nodeid=" + node,
		"--provider-volume=" + providers,
		"--additional-provider-volume-paths=" + additionalProviders,
	}
	if rotation {
		flags = append(flags, "--enable-secret-rotation=true", "--rotation-poll-interval="+rotationPollInterval.String())
	}
	return append(flags, "--metrics-addr="+metrics, "--provider-health-check-interval=2m")
}

// pluginEnv is the node plugin's environment: its credentials (in a DaemonSet pod, the
// in-cluster configuration of its ServiceAccount).
func (m *matrix) pluginEnv() []string {
	return []string{"KUBECONFIG=" + m.driverKubeconfig}
}
