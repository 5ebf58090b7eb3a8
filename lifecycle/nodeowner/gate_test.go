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
