package deploy_test

import (
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/reconciler"
)

// TestAgentDaemonSetRollsOutOneNodeAtATime: an image update of the agent's
// DaemonSet (an upgrade or a rollback, docs/operations.md "Upgrades and
// rollbacks") replaces it node by node, the old pod gone before the new
// one starts — a surge pod would wait on the root directory's lock, which
// the old one holds — and gives the old agent the time its steps in flight
// need to record their outcome before it is killed.
func TestAgentDaemonSetRollsOutOneNodeAtATime(t *testing.T) {
	for _, dir := range []string{"base", "kind", "kind/runtime"} {
		t.Run(dir, func(t *testing.T) {
			ds, _ := agentDaemonSet(t, render(t, dir))
			s := ds.Spec.UpdateStrategy
			if s.Type != appsv1.RollingUpdateDaemonSetStrategyType || s.RollingUpdate == nil {
				t.Fatalf("update strategy %+v, want RollingUpdate: OnDelete leaves old agents running after an upgrade", s)
			}
			if surge := s.RollingUpdate.MaxSurge; surge == nil || surge.String() != "0" {
				t.Errorf("maxSurge %v, want an explicit 0: two agents on one root directory cannot both run", surge)
			}
			if u := s.RollingUpdate.MaxUnavailable; u == nil || u.String() != "1" {
				t.Errorf("maxUnavailable %v, want 1", u)
			}
			grace := ds.Spec.Template.Spec.TerminationGracePeriodSeconds
			if grace == nil || time.Duration(*grace)*time.Second <= reconciler.DefaultShutdownGrace {
				t.Errorf("terminationGracePeriodSeconds %v does not exceed the agent's shutdown grace %v", grace, reconciler.DefaultShutdownGrace)
			}
			for _, c := range ds.Spec.Template.Spec.Containers {
				if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
					t.Errorf("container %s has a preStop hook: the agent's own SIGTERM handling is what a rollout must run", c.Name)
				}
			}
		})
	}
}
