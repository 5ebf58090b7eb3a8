package populator_test

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// TestUnreadableClaimDoesNotBlockTheNode is issue 23's defect 1: a pod
// whose claim cannot be read (Forbidden, not NotFound) stayed unresolved
// for ever, and with it the whole node: the desired state never counted as
// populated, nothing was torn down, /readyz stayed false. Now the pod is
// resolved without that volume, with the reason (volume.ErrUnreadable and
// the API's error), the desired state is populated and settled, another
// pod resolves as usual, and once the claim can be read the pod gets its
// volume without any other event.
func TestUnreadableClaimDoesNotBlockTheNode(t *testing.T) {
	ctx := testContext(t)
	client := fakeClient(
		newPod("blocked", withClaim("data", "hidden")), newPVC("hidden", "pv-hidden"), newPV("pv-hidden", "hidden", "h-hidden"),
		newPod("other", withClaim("data", "open")), newPVC("open", "pv-open"), newPV("pv-open", "open", "h-open"),
	)
	var forbidden atomic.Bool
	forbidden.Store(true)
	var reads atomic.Int32
	deny := func(a k8stesting.Action) (bool, runtime.Object, error) {
		name := ""
		switch a := a.(type) {
		case k8stesting.GetAction:
			name = a.GetName()
		case k8stesting.ListAction:
			if r := a.GetListRestrictions().Fields; r != nil {
				name, _ = r.RequiresExactMatch("metadata.name")
			}
		}
		if name != "hidden" || !forbidden.Load() {
			return false, nil, nil
		}
		reads.Add(1)
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "persistentvolumeclaims"}, name,
			errors.New(`User "agent" cannot get resource "persistentvolumeclaims" in API group "" in the namespace "ns"`))
	}
	client.PrependReactor("get", "persistentvolumeclaims", deny)
	client.PrependReactor("list", "persistentvolumeclaims", deny)

	s := startStack(ctx, t, client, stackOptions{noWait: true})
	select {
	case <-s.pop.Synced():
	case <-time.After(20 * time.Second):
		t.Fatal("the desired state is not populated 20 s after start: a pod whose claim cannot be read holds the node")
	}
	eventually(ctx, t, "settled", s.pop.Settled)

	p, ok := s.store.Pod("uid-blocked")
	if !ok || len(p.Uses) != 0 || len(p.Errors) != 1 || !errors.Is(p.Errors[0].Err, volume.ErrUnreadable) ||
		!apierrors.IsForbidden(p.Errors[0].Err) {
		t.Fatalf("blocked pod: known %v, uses %v, errors %v; want only an unreadable-claim error wrapping Forbidden",
			ok, summarize(p.Uses), errorsOf(p))
	}
	if msg := p.Errors[0].Err.Error(); !strings.Contains(msg, `cannot read PVC "ns/hidden"`) || !strings.Contains(msg, "forbidden") {
		t.Errorf("reason %q, want it to name the claim and the API's answer", msg)
	}
	if _, ok := s.store.PodVolume(volume.PodKey{Volume: pvName("h-open"), Pod: "uid-other"}); !ok {
		t.Error("the other pod's volume is not desired")
	}

	// Read again with backoff, not in a loop.
	before := reads.Load()
	time.Sleep(2 * time.Second)
	if n := reads.Load() - before; n > 10 {
		t.Errorf("%d reads of the forbidden claim in 2 s; want a few, backed off", n)
	}

	// Allowed again: the pod gets its volume.
	forbidden.Store(false)
	eventually(ctx, t, "blocked pod resolved once its claim can be read", func() bool {
		p, _ := s.store.Pod("uid-blocked")
		_, ok := s.store.PodVolume(volume.PodKey{Volume: pvName("h-hidden"), Pod: "uid-blocked"})
		return ok && len(p.Errors) == 0
	})
}
