package deploy_test

import (
	"context"
	"errors"
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
	maxParallelAgents = 6
	// auditLag bounds the wait for an audit entry after the agent saw the
	// response.
	auditLag = 10 * time.Second
)

// errDenied ends a scenario once the request it waits for was denied.
var errDenied = errors.New("the expected request was denied")

// kindAgent renders deploy/kind and returns the agent's container and the
// grants bound to its ServiceAccount: what the DaemonSet really runs with.
func kindAgent(t *testing.T) (*corev1.Container, []grant) {
	t.Helper()
	objs := render(t, "kind")
	ds, c := agentDaemonSet(t, objs)
	return c, agentGrants(t, objs, ds.Namespace, ds.Spec.Template.Spec.ServiceAccountName)
}

// TestAgentWithDaemonSetRBAC runs the agent with exactly the command line
// and the RBAC of deploy/kind, as its ServiceAccount, against an API server
// that enforces RBAC: the pod on the virtual node gets its volume through
// the real CSI test plugin, is torn down and deleted, the driver is
// removed, and not one request of the agent is denied. It does so with
// client-go's watch-list streams (the default) and with LIST+WATCH, as
// against an API server without watch-list.
func TestAgentWithDaemonSetRBAC(t *testing.T) {
	env, audit := apiServer(t)
	agent, grants := kindAgent(t)
	for _, watchList := range []bool{true, false} {
		name := map[bool]string{true: "watch-list", false: "list-and-watch"}[watchList]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			runWithoutDenials(t, env, audit, agent, grants, watchList)
		})
	}
}

// runWithoutDenials runs the scenario with the agent and grants and fails
// t for every request of the agent the API server denied.
func runWithoutDenials(t *testing.T, env *k8stest.Env, audit *auditLog, agent *corev1.Container, grants []grant, watchList bool) *scenario {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	s := newScenario(t, env, agent, grants, watchList)
	if err := s.run(ctx); err != nil {
		t.Fatal(err)
	}
	denied, err := audit.Denied(s.User)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range denied {
		t.Errorf("denied: %s (%s)", ev.access(), ev.RequestURI)
	}
	return s
}

// TestAgentRBACLeastPrivilege removes each verb of each resource of the
// DaemonSet's grants in turn and shows that the agent then needs it: the
// API server denies the agent that very request (audit log, 403) while the
// same scenario as TestAgentWithDaemonSetRBAC runs. A case fails when the
// agent completes the scenario without the request being denied, i.e. when
// the grant is not needed.
//
// "list" is the informers' fallback when the API server serves no
// watch-list stream; those cases run the agent with client-go's
// WatchListClient gate off, as against such a server.
func TestAgentRBACLeastPrivilege(t *testing.T) {
	env, audit := apiServer(t)
	agent, grants := kindAgent(t)
	all := accesses(grants)
	t.Logf("%d (verb, resource) pairs granted: %v", len(all), all)

	// The cases run t.Run from their own goroutines, so that they run
	// maxParallelAgents at a time whatever go test's -parallel is.
	sem := make(chan struct{}, maxParallelAgents)
	var wg sync.WaitGroup
	for _, acc := range all {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			t.Run(strings.ReplaceAll(acc.String(), "/", "_"), func(t *testing.T) {
				ctx, cancel := context.WithCancelCause(t.Context())
				defer cancel(nil)
				ctx, cancelTimeout := context.WithTimeoutCause(ctx, scenarioTimeout, fmt.Errorf("no denied %s within %v", acc, scenarioTimeout))
				defer cancelTimeout()

				s := newScenario(t, env, agent, without(grants, acc), acc.Verb != "list")
				denied := make(chan auditEvent, 1)
				go func() {
					if ev, err := audit.WaitDenied(ctx, s.User, acc); err == nil {
						denied <- ev
						cancel(errDenied)
					}
				}()
				runErr := s.run(ctx)
				if runErr != nil && !errors.Is(context.Cause(ctx), errDenied) {
					// The agent may have given up (and exited) on the
					// denial before the API server wrote its audit entry.
					late, cancel := context.WithTimeout(t.Context(), auditLag)
					defer cancel()
					if ev, err := audit.WaitDenied(late, s.User, acc); err == nil {
						select {
						case denied <- ev:
						default: // the watcher found it meanwhile
						}
					}
				}
				select {
				case ev := <-denied:
					t.Logf("without %s: denied %s", acc, ev.RequestURI)
				default:
					if runErr == nil {
						t.Errorf("without %s the agent still published, tore down and deregistered: the grant is not needed", acc)
					} else {
						t.Errorf("without %s no such request was denied; the scenario stopped at: %v", acc, runErr)
					}
				}
			})
		})
	}
	wg.Wait()
}
