package nodeowner

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

// Label and Value mark a Node whose volume manager is csi-volmgr.
const (
	Label = "csi-volmgr.io/volume-manager"
	Value = "csi-volmgr"
)

// ErrNotOwned is wrapped by the errors of steps refused because the agent
// does not own the Node.
var ErrNotOwned = errors.New("the agent is not the volume manager of this Node")

// HasLabel tells whether labels mark the Node as csi-volmgr's.
func HasLabel(labels map[string]string) bool { return labels[Label] == Value }

// state is what the Gate last learned of the Node.
type state int

const (
	// The zero state: the Node has not been listed yet.
	_ state = iota
	// absent: the Node does not exist.
	absent
	// foreign: the Node exists without the label.
	foreign
	// owned: the Node carries the label.
	owned
)

// Gate tells whether the agent owns its Node. The zero value is not
// usable; make one with New or AlwaysOwned.
type Gate struct {
	node   string
	logger logr.Logger
	// always is set on AlwaysOwned's Gate, which Observe never closes.
	always bool

	// mu protects state and changed.
	mu    sync.Mutex
	state state
	// changed is closed, and replaced, at every change of state.
	changed chan struct{}
}

// New returns the Gate of node, closed until Observe sees the Node with the
// label. It logs its changes with logger: once at error level when the Node
// is found (or becomes) not the agent's, once at info level when it
// becomes the agent's.
func New(node string, logger logr.Logger) *Gate {
	return &Gate{node: node, logger: logger, changed: make(chan struct{})}
}

// AlwaysOwned returns an open Gate that never closes: standalone mode has
// no Node, and the agent is its node's only volume manager.
func AlwaysOwned() *Gate {
	return &Gate{state: owned, always: true, changed: make(chan struct{}), logger: logr.Discard()}
}

// Owned tells whether the agent may act on the Node and, when it may not,
// why (a sentence naming the Node and the label).
func (g *Gate) Owned() (bool, string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.state == owned, g.reasonLocked()
}

// Err returns nil while the Node is owned, and an error wrapping
// ErrNotOwned with the reason otherwise.
func (g *Gate) Err() error {
	if ok, reason := g.Owned(); !ok {
		return fmt.Errorf("%w: %s", ErrNotOwned, reason)
	}
	return nil
}

// Wait returns nil once the Node is owned (at once when it is), or ctx's
// error when ctx ends first.
func (g *Gate) Wait(ctx context.Context) error {
	for {
		g.mu.Lock()
		ok, changed := g.state == owned, g.changed
		g.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// Changed returns a channel closed at the next change of the answer.
func (g *Gate) Changed() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.changed
}

// Observe tells the Gate what the Node looks like now: its labels, or
// exists false when the Node does not exist. AlwaysOwned's Gate ignores it.
func (g *Gate) Observe(labels map[string]string, exists bool) {
	if g.always {
		return
	}
	next := absent
	switch {
	case exists && HasLabel(labels):
		next = owned
	case exists:
		next = foreign
	}
	g.mu.Lock()
	prev := g.state
	if prev == next {
		g.mu.Unlock()
		return
	}
	g.state = next
	close(g.changed)
	g.changed = make(chan struct{})
	reason := g.reasonLocked()
	g.mu.Unlock()

	switch {
	case next == owned:
		g.logger.Info("The Node carries the volume manager label: acting as its volume manager", "node", g.node, "label", Label+"="+Value)
	case prev == owned || next == foreign:
		// The one error line of the Node being (or becoming) someone
		// else's; nothing is unmounted because of it.
		g.logger.Error(ErrNotOwned, "Not acting on the Node: no new mount, unmount or write to the API server until it carries the label",
			"node", g.node, "label", Label+"="+Value, "reason", reason)
	default:
		g.logger.Info("Waiting for the Node to exist with the volume manager label", "node", g.node, "label", Label+"="+Value)
	}
}

func (g *Gate) reasonLocked() string {
	switch g.state {
	case owned:
		return ""
	case absent:
		return fmt.Sprintf("node %s does not exist; the agent acts only on a Node that carries the label %s=%s", g.node, Label, Value)
	case foreign:
		return fmt.Sprintf("node %s does not carry the label %s=%s; another volume manager (a kubelet) may own it", g.node, Label, Value)
	default:
		return fmt.Sprintf("node %s not seen yet; the agent acts only on a Node that carries the label %s=%s", g.node, Label, Value)
	}
}

// Register adds the gauge csi_volmgr_node_owned (1 while the agent owns
// its Node, 0 otherwise) to reg.
func (g *Gate) Register(reg prometheus.Registerer) error {
	return reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "csi_volmgr_node_owned",
		Help: "1 while the Node carries the label " + Label + "=" + Value + " (or in standalone mode), 0 while the agent acts on nothing",
	}, func() float64 {
		if ok, _ := g.Owned(); ok {
			return 1
		}
		return 0
	}))
}
