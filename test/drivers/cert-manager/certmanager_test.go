//go:build drivers

package certmanager_test

import (
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/test/drivers/driverresult"
	"github.com/csi-volmgr/csi-volmgr/test/drivers/drivertest"
)

const (
	driverName    = "csi.cert-manager.io"
	driverModule  = "github.com/cert-manager/csi-driver"
	driverVersion = "v0.12.0"
	// certManagerModule is the cert-manager module the driver requires: the CertificateRequest
	// CRD comes from its deploy/crds.
	certManagerModule = "github.com/cert-manager/cert-manager"

	// binDir is bin/drivers/<binDir>, filled by make drivers-bins-cert-manager; toolsDir is the
	// build-only module.
	binDir   = "cert-manager"
	toolsDir = "test/drivers/cert-manager/tools"

	driverNamespace      = "cert-manager"
	driverServiceAccount = "cert-manager-csi-driver"

	appNamespace      = "app"
	appServiceAccount = "app-sa"
	podName           = "app"
	volumeName        = "tls"
	dnsName           = "app.app.svc.cluster.local"

	// certLifetime is what the signer gives each certificate: the driver renews at two thirds of
	// it, with the token of the pod's latest republish.
	certLifetime = 45 * time.Second
	// republishPeriod is the agent's --republish-period here (default 1m).
	republishPeriod = 5 * time.Second
)

// TestCertManager is the driver's row of the matrix: csi-volmgr check against its node plugin,
// then the agent's lifecycle with it on a real API server. The Result is written even when a step
// fails.
func TestCertManager(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the driver matrix needs root: the node plugin and the agent mount")
	}
	began := time.Now()
	rec := drivertest.NewRecorder(t, driverresult.Result{
		Name: "cert-manager", Driver: driverName, Kind: "ephemeral-inline",
		Module: driverModule, Version: driverVersion,
		Settings: chartSettings(),
	})
	defer rec.Write(began)
	m := startMatrix(t)
	rec.R.NodePluginFlags = pluginFlags("<root-dir>", "<node-name>", "csi-data-dir", true)
	rec.Note("driver defect: --data-root must be relative to the working directory /: csi-lib (storage.Filesystem) mounts its " +
		"tmpfs at the path as given but lists it through os.DirFS(\"/\"), which refuses an absolute path, and the node plugin " +
		"panics at start (\"listing volumes: readdir /...: invalid argument\"); its chart passes csi-data-dir in a container " +
		"whose working directory is /, as the matrix does")
	rec.Note("the chart's CSIDriver and RBAC (deploy/charts/csi-driver/templates, Helm templates) are created as they render " +
		"with app.driver.useTokenRequest=true; the CertificateRequest CRD is the cert-manager module's deploy/crds; no " +
		"cert-manager controller runs: the test approves and signs the requests with a CA of its own")
	rec.Note("node-driver-registrar is not served by the module proxy here: a registrar in the test answers the " +
		"plugin-registration API on the agent's registration directory, as it does")
	runCheck(t, rec, m)
	runLifecycle(t, rec, m)
}

// chartSettings are the values of the driver's Helm chart (deploy/charts/csi-driver) that make its
// node plugin serve csi-volmgr instead of a kubelet.
func chartSettings() []string {
	return []string{
		"app.kubeletRootDir: csi-volmgr's --root-dir (default /var/lib/csi-volmgr): the chart mounts <kubeletRootDir>/pods " +
			"Bidirectional, puts the socket in <kubeletRootDir>/plugins/cert-manager-csi-driver/ and registers through " +
			"<kubeletRootDir>/plugins_registry",
		"app.driver.useTokenRequest: true works as with a kubelet: csi-volmgr mints the pod's token for the empty audience " +
			"(the API server's) as its Node and republishes every --republish-period (requiresRepublish), so that renewals " +
			"use a current token",
		"app.driver.csiDataDir: unchanged (/tmp/cert-manager-csi-driver): the driver's own tmpfs, bind-mounted into the pods' " +
			"paths; it is not below the kubelet's root",
	}
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
				VolumeMounts: []corev1.VolumeMount{{Name: volumeName, MountPath: "/tls", ReadOnly: true}},
			}},
			Volumes: []corev1.Volume{{Name: volumeName, VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
				Driver: driverName, ReadOnly: ptr.To(true),
				VolumeAttributes: map[string]string{
					"csi.cert-manager.io/issuer-name": "matrix-ca",
					"csi.cert-manager.io/common-name": dnsName,
					"csi.cert-manager.io/dns-names":   dnsName,
				},
			}}}},
		},
	}
}
