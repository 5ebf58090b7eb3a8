package k8stest

import (
	"testing"
	"time"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"

	"github.com/csi-volmgr/csi-volmgr/volumemanager/kubeversion"
)

// ServerVersion returns the version of the API server client talks to,
// failing the test if it cannot be read: `make test-skew` runs the suites
// against the control plane of each supported minor, and a test whose
// expectations depend on the minor asks it here (Features says what the
// agent does on it).
func ServerVersion(t testing.TB, client kubernetes.Interface) kubeversion.Version {
	t.Helper()
	v, err := kubeversion.Detect(t.Context(), discovery.ToServerVersionInterfaceWithContext(client.Discovery()), 30*time.Second)
	if err != nil {
		t.Fatalf("reading the API server's version: %v", err)
	}
	return v
}
