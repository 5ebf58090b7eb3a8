package e2e_test

import (
	"fmt"
	"os"
	"testing"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

// expectMinorEnv names the Kubernetes minor (e.g. v1.34) make test-skew
// runs the suites against.
const expectMinorEnv = "CSI_VOLMGR_EXPECT_K8S_MINOR"

// TestAPIServerMinor: under make test-skew the API server is of the minor
// the run is for, so that a wrong binary in bin/k8s-<minor> cannot pass
// for it; otherwise it logs the minor the suite ran against.
func TestAPIServerMinor(t *testing.T) {
	f := k8stest.New(t)
	v := k8stest.ServerVersion(t, f.Client)
	got := fmt.Sprintf("v%d.%d", v.Major, v.Minor)
	want := os.Getenv(expectMinorEnv)
	if want != "" && got != want {
		t.Fatalf("the API server is %s (%s), want %s (%s)", got, v, want, expectMinorEnv)
	}
	t.Logf("API server %s, features %+v", v, v.Features())
}
