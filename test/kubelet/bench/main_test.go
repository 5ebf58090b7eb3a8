package bench_test

import (
	"fmt"
	"os"
	"testing"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

// TestMain reads EnvIdentity before the shared API server starts: under
// the node identity it runs with the Node authorizer, NodeRestriction and
// the Node client signer (envOptions).
func TestMain(m *testing.M) {
	id, err := parseIdentity()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	agentIdentity = id
	book.setting(identitySetting, describeIdentity(id))
	k8stest.Main(m, envOptions(id))
}
