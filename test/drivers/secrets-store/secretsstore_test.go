//go:build drivers

package secretsstore_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/test/drivers/driverresult"
	"github.com/csi-volmgr/csi-volmgr/test/drivers/drivertest"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

const (
	driverName   = "secrets-store.csi.k8s.io"
	driverModule = "sigs.k8s.io/secrets-store-csi-driver"
	// driverVersion is the version the tools module pins (test/drivers/secrets-store/tools/go.mod).
	driverVersion = "v1.6.0"

	// driverNamespace and driverServiceAccount are the node plugin's, from the module's
	// deploy/rbac-secretproviderclass.yaml.
	driverNamespace      = "kube-system"
	driverServiceAccount = "secrets-store-csi-driver"

	// providerName is the SecretProviderClass's spec.provider: the driver dials
	// <--provider-volume>/<providerName>.sock.
	providerName = "e2e"
	// audience is the CSIDriver's tokenRequests audience (the chart's tokenRequests value).
	audience = "secrets-store-e2e.csi-volmgr.io"

	// appNamespace, appServiceAccount, spcName and podName are the application's.
	appNamespace      = "app"
	appServiceAccount = "app-sa"
	spcName           = "e2e-spc"
	podName           = "app"
	volumeName        = "secrets"

	// republishPeriod is the agent's --republish-period here (the default is 1m, as the kubelet's
	// pod resync); rotationPollInterval is the driver's --rotation-poll-interval (its chart's
	// default is 2m): shorter than republishPeriod, so that every republish reaches the provider.
	republishPeriod      = 5 * time.Second
	rotationPollInterval = 2 * time.Second

	// binDir is the directory of bin/drivers that make drivers-bins-secrets-store fills, and
	// toolsDir its build-only module.
	binDir   = "secrets-store"
	toolsDir = "test/drivers/secrets-store/tools"
)

// The driver's two custom resources.
var (
	spcGVR   = schema.GroupVersionResource{Group: "secrets-store.csi.x-k8s.io", Version: "v1", Resource: "secretproviderclasses"}
	spcpsGVR = schema.GroupVersionResource{Group: "secrets-store.csi.x-k8s.io", Version: "v1", Resource: "secretproviderclasspodstatuses"}
)

// TestSecretsStore is the driver's row of the matrix: csi-volmgr check against its node plugin,
// then the agent's lifecycle with it on a real API server. The Result is written even when a
// step fails.
func TestSecretsStore(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the driver matrix needs root: the node plugin and the agent mount")
	}
	began := time.Now()
	rec := drivertest.NewRecorder(t, driverresult.Result{
		Name: "secrets-store", Driver: driverName, Kind: "ephemeral-inline",
		Module: driverModule, Version: driverVersion,
		Settings: chartSettings(),
	})
	defer rec.Write(began)

	rec.Note("node-driver-registrar is not served by the module proxy here: a registrar in the test answers the " +
		"plugin-registration API on the agent's registration directory, as it does")
	rec.Note("the provider is secrets-store-e2e-provider (test/drivers/secrets-store/tools/fakeprovider), serving the " +
		"driver's provider API provider/v1alpha1: the driver's own e2e provider is a module the proxy does not serve; " +
		"monis.app/mlog (the driver's log set-up) is replaced by a stand-in of the five calls it makes (tools/mlog)")
	rec.Note("csi-volmgr check runs the driver's csi-sanity mode (providerName=mock_provider) with the chart's default flags " +
		"(enableSecretRotation false, under which that mode mounts a tmpfs): the check's pods are not in the API server; " +
		"the lifecycle runs the real path")
	m := startMatrix(t)
	rec.R.NodePluginFlags = pluginFlags("<root-dir>", "<node-name>", "<providers>", "<additional-providers>", "127.0.0.1:<port>", true)
	runCheck(t, rec, m)
	runLifecycle(t, rec, m)
}

// chartSettings are the values of the driver's Helm chart (charts/secrets-store-csi-driver) that
// make its node plugin serve csi-volmgr instead of a kubelet.
func chartSettings() []string {
	return []string{
		"linux.kubeletRootDir: csi-volmgr's --root-dir (default /var/lib/csi-volmgr): the chart mounts <kubeletRootDir>/pods " +
			"Bidirectional and puts the CSI socket in <kubeletRootDir>/plugins/csi-secrets-store/",
		"the registrar's registration directory: the chart mounts <kubeletRootDir>/plugins_registry, which is csi-volmgr's " +
			"(<root-dir>/plugins_registry, or --registration-dir)",
		"tokenRequests: [{audience: <your provider's audience>}] as usual: csi-volmgr mints the pod's service account " +
			"tokens as its Node (--node-identity) and passes csi.storage.k8s.io/serviceAccount.tokens, as the kubelet does",
		"enableSecretRotation: true and rotationPollInterval below csi-volmgr's --republish-period (default 1m) for " +
			"rotation: the driver rotates on the republish that requiresRepublish makes csi-volmgr send " +
			"(with the chart's default false, a republish of a mounted volume is answered without calling the provider)",
		"nothing else: podInfoOnMount, requiresRepublish and the Ephemeral lifecycle mode of its CSIDriver are honoured as they are",
	}
}

// spc is the SecretProviderClass of the test: the provider returns the files of its "files"
// parameter.
func spc(files string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "secrets-store.csi.x-k8s.io/v1",
		"kind":       "SecretProviderClass",
		"metadata":   map[string]any{"name": spcName, "namespace": appNamespace},
		"spec": map[string]any{
			"provider":   providerName,
			"parameters": map[string]any{"files": files},
		},
	}}
}

// appPod is a pod on node with an inline volume of the driver, read-only as the driver requires.
func appPod(node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podName, Namespace: appNamespace},
		Spec: corev1.PodSpec{
			NodeName:           node,
			ServiceAccountName: appServiceAccount,
			Tolerations:        []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers: []corev1.Container{{
				Name: "app", Image: "registry.k8s.io/pause:3.10",
				VolumeMounts: []corev1.VolumeMount{{Name: volumeName, MountPath: "/mnt/secrets", ReadOnly: true}},
			}},
			Volumes: []corev1.Volume{{Name: volumeName, VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
				Driver: driverName, ReadOnly: ptr.To(true),
				VolumeAttributes: map[string]string{"secretProviderClass": spcName},
			}}}},
		},
	}
}

// targetPath is where the agent publishes the pod's inline volume (the kubelet's layout).
func targetPath(root string, uid string) string {
	return filepath.Join(root, "pods", uid, "volumes", "kubernetes.io~csi", volumeName, "mount")
}

// uniqueNode is the agent's Node name.
func uniqueNode() string { return strings.ToLower(k8stest.UniqueName("ss")) }
