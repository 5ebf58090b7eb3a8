package nodeowner_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/nodeowner"
)

// lines records the log lines of a Gate.
type lines struct {
	mu     sync.Mutex
	errors []string
	infos  []string
}

func newGate(t *testing.T) (*nodeowner.Gate, *lines) {
	t.Helper()
	l := &lines{}
	logger := funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		if strings.Contains(args, `"error"`) {
			l.errors = append(l.errors, args)
		} else {
			l.infos = append(l.infos, args)
		}
	}, funcr.Options{})
	return nodeowner.New("n1", logger), l
}

func TestGateOpensOnlyWithTheLabel(t *testing.T) {
	g, l := newGate(t)
	if ok, reason := g.Owned(); ok || !strings.Contains(reason, "not seen yet") {
		t.Fatalf("a new Gate: owned %v, reason %q; want closed, not seen yet", ok, reason)
	}
	g.Observe(map[string]string{"kubernetes.io/hostname": "n1"}, true)
	g.Observe(map[string]string{"kubernetes.io/hostname": "n1", "other": "x"}, true)
	ok, reason := g.Owned()
	if ok || !strings.Contains(reason, "node n1 does not carry the label csi-volmgr.io/volume-manager=csi-volmgr") {
		t.Fatalf("a Node without the label: owned %v, reason %q", ok, reason)
	}
	if !errors.Is(g.Err(), nodeowner.ErrNotOwned) {
		t.Errorf("Err() = %v, want ErrNotOwned", g.Err())
	}
	if len(l.errors) != 1 || !strings.Contains(l.errors[0], "n1") || !strings.Contains(l.errors[0], nodeowner.Label) {
		t.Errorf("error lines %q, want one naming the Node and the label", l.errors)
	}
	g.Observe(map[string]string{nodeowner.Label: "someone-else"}, true)
	if ok, _ := g.Owned(); ok {
		t.Fatal("a label with another value opened the Gate")
	}
	g.Observe(map[string]string{nodeowner.Label: nodeowner.Value}, true)
	if ok, reason := g.Owned(); !ok || reason != "" || g.Err() != nil {
		t.Fatalf("a Node with the label: owned %v, reason %q", ok, reason)
	}
	g.Observe(map[string]string{}, true)
	if ok, _ := g.Owned(); ok {
		t.Fatal("the Gate stayed open after the label went")
	}
	if len(l.errors) != 2 {
		t.Errorf("error lines %q, want a second one when the label went", l.errors)
	}
	g.Observe(nil, false)
	if _, reason := g.Owned(); !strings.Contains(reason, "does not exist") {
		t.Errorf("a deleted Node: reason %q", reason)
	}
}

func TestGateWaitWakesOnTheLabelAndOnContextEnd(t *testing.T) {
	g, _ := newGate(t)
	g.Observe(nil, true)
	done := make(chan error, 1)
	go func() { done <- g.Wait(t.Context()) }()
	select {
	case err := <-done:
		t.Fatalf("Wait returned %v before the label", err)
	case <-time.After(100 * time.Millisecond):
	}
	g.Observe(map[string]string{nodeowner.Label: nodeowner.Value}, true)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Wait: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return once the label was there")
	}

	g.Observe(nil, true)
	ctx, cancel := context.WithCancel(t.Context())
	go func() { done <- g.Wait(ctx) }()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait after the context ended: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return when its context ended")
	}
	if err := nodeowner.AlwaysOwned().Wait(ctx); err != nil {
		t.Errorf("AlwaysOwned().Wait: %v", err)
	}
}

// TestGatePinsTheNodeByUID: the first Node seen with the label is pinned;
// a Node of the same name with another UID keeps the Gate closed, with
// one error line, even with the label, until Pin names it; once
// ObserveNode is used, Observe's labels-only view is ignored.
func TestGatePinsTheNodeByUID(t *testing.T) {
	g, l := newGate(t)
	owner := map[string]string{nodeowner.Label: nodeowner.Value}
	g.ObserveNode("uid-1", map[string]string{"other": "x"}, true)
	if g.Pinned() != "" {
		t.Fatalf("a Node without the label was pinned: %q", g.Pinned())
	}
	g.ObserveNode("uid-1", owner, true)
	if ok, _ := g.Owned(); !ok || g.Pinned() != "uid-1" {
		t.Fatalf("the labelled Node: owned %v, pinned %q", ok, g.Pinned())
	}
	g.Observe(nil, false)
	if ok, _ := g.Owned(); !ok {
		t.Fatal("Observe changed a Gate fed by ObserveNode")
	}
	errorsBefore := len(l.errors)
	g.ObserveNode("", nil, false)
	g.ObserveNode("uid-2", owner, true)
	ok, reason := g.Owned()
	if ok || !strings.Contains(reason, "replaced") || !strings.Contains(reason, "uid-2") || !strings.Contains(reason, "uid-1") {
		t.Fatalf("a new Node with the label: owned %v, reason %q; want closed, naming both UIDs", ok, reason)
	}
	if n := len(l.errors) - errorsBefore; n != 2 {
		t.Errorf("%d error lines for the deletion and the replacement, want 2: %q", n, l.errors[errorsBefore:])
	}
	if err := g.Check("uid-2", owner); !errors.Is(err, nodeowner.ErrNotOwned) {
		t.Errorf("Check of the new Node: %v, want ErrNotOwned", err)
	}
	if err := g.Check("uid-1", map[string]string{}); !errors.Is(err, nodeowner.ErrNotOwned) {
		t.Errorf("Check of the pinned Node without the label: %v, want ErrNotOwned", err)
	}
	if err := g.Check("uid-1", owner); err != nil {
		t.Errorf("Check of the pinned Node with the label: %v", err)
	}
	g.Pin("uid-2")
	if ok, reason := g.Owned(); !ok {
		t.Fatalf("after Pin of the new Node: closed, %q", reason)
	}
}

// TestGateHold: a Hold closes an owned Gate with its reason, Release opens
// it, and Wait follows.
func TestGateHold(t *testing.T) {
	g, _ := newGate(t)
	g.ObserveNode("uid-1", map[string]string{nodeowner.Label: nodeowner.Value}, true)
	changed := g.Changed()
	g.Hold("another agent renews the Lease")
	select {
	case <-changed:
	default:
		t.Error("Hold did not signal a change")
	}
	if ok, reason := g.Owned(); ok || reason != "another agent renews the Lease" {
		t.Fatalf("held: owned %v, reason %q", ok, reason)
	}
	done := make(chan error, 1)
	go func() { done <- g.Wait(t.Context()) }()
	select {
	case err := <-done:
		t.Fatalf("Wait returned %v while held", err)
	case <-time.After(100 * time.Millisecond):
	}
	g.Release()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return after Release")
	}
}
