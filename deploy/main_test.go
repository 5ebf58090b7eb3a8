package deploy_test

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

// auditPolicy records the metadata of every request once it has an answer:
// who (the agent's Node, its ServiceAccount, the approver), which verb on
// which resource, and the status code. The RBAC tests read a denied request
// from it.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
`

// The environment of this test binary: a kube-apiserver that writes an
// audit log, started on first use, authorizing and admitting as kubeadm's
// (and kind's, EKS's, GKE's, AKS's) does: the Node authorizer before RBAC,
// the NodeRestriction admission plugin, bootstrap tokens. It trusts a
// second client CA whose key the tests hold (Env.Signer): the signer of
// node client certificates that kube-controller-manager would be.
var shared struct {
	once  sync.Once
	dir   string
	env   *k8stest.Env
	audit *auditLog
	err   error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if err := stopShared(); err != nil {
		fmt.Fprintf(os.Stderr, "deploy tests: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// apiServer returns the shared API server and its audit log, starting them
// on first use.
func apiServer(tb testing.TB) (*k8stest.Env, *auditLog) {
	tb.Helper()
	shared.once.Do(func() {
		shared.dir, shared.err = os.MkdirTemp("", "deploy-audit")
		if shared.err != nil {
			return
		}
		policy := filepath.Join(shared.dir, "policy.yaml")
		logPath := filepath.Join(shared.dir, "audit.log")
		if shared.err = os.WriteFile(policy, []byte(auditPolicy), 0o600); shared.err != nil {
			return
		}
		shared.env, shared.err = k8stest.Start(k8stest.Options{
			APIServerFlags: map[string][]string{
				"audit-policy-file":           {policy},
				"audit-log-path":              {logPath},
				"audit-log-format":            {"json"},
				"audit-log-mode":              {"blocking"},
				"authorization-mode":          {"Node,RBAC"},
				"enable-admission-plugins":    {"NodeRestriction"},
				"enable-bootstrap-token-auth": {"true"},
			},
			NodeClientSigner: true,
		})
		if shared.err != nil {
			return
		}
		shared.audit = tailAuditLog(logPath)
		tb.Logf("etcd and kube-apiserver ready after %v", shared.env.StartupDuration)
	})
	if shared.err != nil {
		tb.Fatalf("starting the API server: %v", shared.err)
	}
	return shared.env, shared.audit
}

func stopShared() error {
	var err error
	if shared.audit != nil {
		shared.audit.Close()
	}
	if shared.env != nil {
		err = shared.env.Stop()
	}
	if shared.dir != "" {
		if rmErr := os.RemoveAll(shared.dir); rmErr != nil && err == nil {
			err = rmErr
		}
	}
	return err
}
