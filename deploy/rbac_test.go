package deploy_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

const (
	// scenarioTimeout bounds one agent's scenario, start to end. A
	// scenario that succeeds takes a few seconds; the bound only matters
	// when something hangs on a loaded machine.
	scenarioTimeout = 3 * time.Minute
	// maxParallelAgents is how many agents (each with its test plugin) the
	// least-privilege test runs at once against the one API server.
	maxParallelAgents = 4
)

// csrAccess is one verb on certificatesigningrequests.
func csrAccess(verb string) access {
	return access{Verb: verb, Group: "certificates.k8s.io", Resource: "certificatesigningrequests"}
}

// notAskedByAgent are the accesses of the agent's bootstrap role that the
// agent never uses, with the reason. The manifests bind the built-in
// ClusterRole system:node-bootstrapper, as kubeadm binds it for kubelets,
// rather than a role of their own with one verb less.
var notAskedByAgent = map[access]string{
	csrAccess("get"): "client-go's RequestCertificate reads back an existing request of the name it asked for; " +
		"the agent names none (generateName csr-), so it never does (TestAgentBootstrapsThroughApprover checks no get is made)",
}

// kindAgent renders deploy/kind and returns the agent's container and the
// grants bound to its ServiceAccount: what the DaemonSet really runs with.
func kindAgent(t *testing.T, env *k8stest.Env) (*corev1.Container, []grant) {
	t.Helper()
	objs := render(t, "kind")
	ds, c := agentDaemonSet(t, objs)
	return c, agentGrants(t, env, objs, ds.Namespace, ds.Spec.Template.Spec.ServiceAccountName)
}

// TestAgentWithDaemonSetRBAC runs the agent with exactly the command line
// of deploy/kind's DaemonSet and its ServiceAccount's RBAC, as its Node
// (system:node:csi-volmgr-<host>, with the certificate an earlier start left
// in <root>/pki), against an API server that authorizes as kubeadm's does
// (Node,RBAC and NodeRestriction): the Node is registered, the pod on it
// gets its volume through the real CSI test plugin, is expanded, torn down
// and deleted, the driver is removed, the Lease renewed, and no request of
// the agent is denied, but reads of an object a moment before it exists or
// before the Node authorizer's graph links it to the Node, which a later
// read of the same object gets. It does so with client-go's watch-list
// streams (the default) and with LIST+WATCH, as against an API server
// without watch-list.
func TestAgentWithDaemonSetRBAC(t *testing.T) {
	env, audit := apiServer(t)
	agent, grants := kindAgent(t, env)
	for _, watchList := range []bool{true, false} {
		name := map[bool]string{true: "watch-list", false: "list-and-watch"}[watchList]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			runWithoutDenials(t, env, audit, agent, grants, scenarioOptions{WatchList: watchList}, nil)
		})
	}
}

// runWithoutDenials runs the scenario with the agent and grants (and
// before, with the scenario, whatever setup does) and fails t for every
// request of the agent, as its Node or as its ServiceAccount, that the API
// server denied for good.
func runWithoutDenials(t *testing.T, env *k8stest.Env, audit *auditLog, agent *corev1.Container, grants []grant, o scenarioOptions, setup func(*scenario)) *scenario {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	s := newScenario(t, env, agent, grants, o)
	if setup != nil {
		setup(s)
	}
	if err := s.run(ctx); err != nil {
		t.Fatal(err)
	}
	checkNoDenials(t, audit, s.User, s.BootstrapUser)
	return s
}

// checkNoDenials fails t for every request of users denied and not
// allowed later (auditLog.Unresolved), and logs the transient ones.
func checkNoDenials(t *testing.T, audit *auditLog, users ...string) {
	t.Helper()
	for _, user := range users {
		denied, transient, err := audit.Unresolved(user)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range denied {
			t.Errorf("%s was denied: %s (%s)", user, ev.access(), ev.RequestURI)
		}
		for _, ev := range transient {
			t.Logf("%s was denied, then allowed: %s (%s)", user, ev.access(), ev.RequestURI)
		}
	}
}

// TestAgentBootstrapRBACLeastPrivilege removes each verb of the agent's
// RBAC in turn (its ServiceAccount's, the only RBAC it has: as its Node it
// has none) and shows that the agent then needs it: started without a
// certificate, it asks for one with its ServiceAccount's token, and the API
// server denies that very request (audit log, 403). A case fails when the
// agent gets that far without the request being denied. The verbs of the
// built-in role the agent never asks for are listed in notAskedByAgent.
//
// The rest of the agent's rights are the Node authorizer's and
// NodeRestriction's, the API server's own: TestAgentWithDaemonSetRBAC shows
// they are enough, test/identity (make e2e) that they hold the agent to its
// Node.
func TestAgentBootstrapRBACLeastPrivilege(t *testing.T) {
	env, audit := apiServer(t)
	agent, grants := kindAgent(t, env)
	all := accesses(grants)
	t.Logf("%d (verb, resource) pairs granted to the agent's ServiceAccount: %v", len(all), all)
	if len(all) == 0 {
		t.Fatal("the agent's ServiceAccount may do nothing: it cannot ask for its certificate")
	}

	// The cases run t.Run from their own goroutines, so that they run
	// maxParallelAgents at a time whatever go test's -parallel is.
	sem := make(chan struct{}, maxParallelAgents)
	var wg sync.WaitGroup
	for _, acc := range all {
		if why, ok := notAskedByAgent[acc]; ok {
			t.Logf("%s: not asked for: %s", acc, why)
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			t.Run(strings.ReplaceAll(acc.String(), "/", "_"), func(t *testing.T) {
				ctx, cancel := context.WithCancelCause(t.Context())
				defer cancel(nil)
				ctx, cancelTimeout := context.WithTimeoutCause(ctx, scenarioTimeout, fmt.Errorf("no denied %s within %v", acc, scenarioTimeout))
				defer cancelTimeout()

				s := newScenario(t, env, agent, without(grants, acc), scenarioOptions{WatchList: acc.Verb != "list", Bootstrap: true})
				ev, err := audit.WaitDenied(ctx, s.BootstrapUser, acc)
				if err != nil {
					t.Fatalf("without %s: %v; the agent's log says why", acc, err)
				}
				t.Logf("without %s: denied %s", acc, ev.RequestURI)
			})
		})
	}
	wg.Wait()
}
