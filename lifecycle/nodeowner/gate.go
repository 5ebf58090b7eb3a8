package nodeowner

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
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
	// replaced: a Node of the name exists with another UID than the
	// pinned one: it is not the Node the agent served.
	replaced
)

// Gate tells whether the agent owns its Node. The zero value is not
// usable; make one with New or AlwaysOwned.
type Gate struct {
	node   string
	logger logr.Logger
	// always is set on AlwaysOwned's Gate, which Observe never closes.
	always bool

	// mu protects the fields below.
	mu    sync.Mutex
	state state
	// pin is the UID of the Node the agent serves: set when a Node is
	// first seen with the label through ObserveNode, or by Pin. A Node of
	// the same name with another UID is another Node.
	pin types.UID
	// seen is the UID of the Node's last version told to ObserveNode
	// (empty when it does not exist); labels its labels.
	seen   types.UID
	labels map[string]string
	// uids is set by the first ObserveNode: from then on the Gate follows
	// that feed, which has UIDs, and ignores Observe's labels-only one, so
	// that one ordered view of the Node decides.
	uids bool
	// hold, when not empty, closes the Gate whatever the Node looks like:
	// the reason of Hold.
	hold string
	// changed is closed, and replaced, at every change of the answer.
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
	return g.openLocked(), g.reasonLocked()
}

// openLocked tells whether the agent may act.
func (g *Gate) openLocked() bool { return g.state == owned && g.hold == "" }

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
		ok, changed := g.openLocked(), g.changed
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
// exists false when the Node does not exist. AlwaysOwned's Gate ignores
// it, and so does a Gate that ObserveNode was called on: that view has the
// Node's UID.
func (g *Gate) Observe(labels map[string]string, exists bool) {
	if g.always {
		return
	}
	g.mu.Lock()
	if g.uids {
		g.mu.Unlock()
		return
	}
	next := absent
	switch {
	case exists && HasLabel(labels):
		next = owned
	case exists:
		next = foreign
	}
	g.setLocked(next)
}

// ObserveNode tells the Gate of the Node's latest version: its UID and
// labels, or exists false when it does not exist. The first Node seen with
// the label is pinned: from then on a Node of the same name with another
// UID is another Node, and the Gate stays closed for it (the replaced
// state) until Pin names it. Once called, the Gate ignores Observe. The
// caller tells the versions in the order the API server made them (one
// informer's events).
func (g *Gate) ObserveNode(uid types.UID, labels map[string]string, exists bool) {
	if g.always {
		return
	}
	g.mu.Lock()
	g.uids = true
	g.seen, g.labels = "", nil
	if exists {
		g.seen, g.labels = uid, maps.Clone(labels)
	}
	if exists && g.pin == "" && HasLabel(labels) {
		g.pin = uid
	}
	g.setLocked(g.judgeLocked())
}

// Pin makes uid the Node the agent serves: one the caller created itself
// (the node keeper). A Node seen with another UID is another Node.
func (g *Gate) Pin(uid types.UID) {
	if g.always {
		return
	}
	g.mu.Lock()
	prev := g.pin
	g.pin = uid
	if !g.uids {
		g.mu.Unlock()
		return
	}
	if prev != "" && prev != uid {
		g.logger.Info("Serving a new Node of the same name, created by the agent", "node", g.node, "uid", uid, "previousUID", prev)
	}
	g.setLocked(g.judgeLocked())
}

// Pinned returns the UID of the Node the agent serves; empty while none
// is pinned.
func (g *Gate) Pinned() types.UID {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.pin
}

// Check tells whether the agent may write to the Node version (uid,
// labels): nil when it carries the label and is the pinned Node (or none
// is pinned yet), an error wrapping ErrNotOwned that says why otherwise. It
// does not look at Hold: the holder of a hold checks its own reason.
func (g *Gate) Check(uid types.UID, labels map[string]string) error {
	if g.always {
		return nil
	}
	g.mu.Lock()
	pin := g.pin
	g.mu.Unlock()
	switch {
	case pin != "" && uid != pin:
		return fmt.Errorf("%w: %s", ErrNotOwned, replacedReason(g.node, uid, pin))
	case !HasLabel(labels):
		return fmt.Errorf("%w: %s", ErrNotOwned, foreignReason(g.node))
	}
	return nil
}

// Hold closes the Gate for reason, whatever the Node looks like, until
// Release: e.g. another agent renews the Node's Lease. It logs nothing;
// the caller says why once. A later Hold replaces the reason.
func (g *Gate) Hold(reason string) {
	if g.always {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.hold == reason {
		return
	}
	g.hold = reason
	g.notifyLocked()
}

// Release ends a Hold.
func (g *Gate) Release() { g.Hold("") }

// judgeLocked is the state of the Node's last version told to ObserveNode.
func (g *Gate) judgeLocked() state {
	switch {
	case g.seen == "":
		return absent
	case g.pin != "" && g.seen != g.pin:
		return replaced
	case HasLabel(g.labels):
		return owned
	}
	return foreign
}

// setLocked moves the Gate to next, logs the change and unlocks g.mu.
func (g *Gate) setLocked(next state) {
	prev := g.state
	if prev == next {
		g.mu.Unlock()
		return
	}
	g.state = next
	g.notifyLocked()
	reason, uid, pin := g.reasonLocked(), g.seen, g.pin
	g.mu.Unlock()

	switch {
	case next == owned:
		g.logger.Info("The Node carries the volume manager label: acting as its volume manager", "node", g.node, "label", Label+"="+Value, "uid", uid)
	case next == replaced:
		// The one error line of the Node being replaced: what is mounted
		// stays mounted.
		g.logger.Error(ErrNotOwned, "Not acting on the Node: it is another Node than the one the agent served",
			"node", g.node, "uid", uid, "servedUID", pin, "reason", reason)
	case prev == owned || next == foreign:
		// The one error line of the Node being (or becoming) someone
		// else's; nothing is unmounted because of it.
		g.logger.Error(ErrNotOwned, "Not acting on the Node: no new mount, unmount or write to the API server until it carries the label",
			"node", g.node, "label", Label+"="+Value, "reason", reason)
	default:
		g.logger.Info("Waiting for the Node to exist with the volume manager label", "node", g.node, "label", Label+"="+Value)
	}
}

// notifyLocked wakes those who wait for a change.
func (g *Gate) notifyLocked() {
	close(g.changed)
	g.changed = make(chan struct{})
}

func (g *Gate) reasonLocked() string {
	switch g.state {
	case owned:
		return g.hold
	case replaced:
		return replacedReason(g.node, g.seen, g.pin)
	case absent:
		return fmt.Sprintf("node %s does not exist; the agent acts only on a Node that carries the label %s=%s", g.node, Label, Value)
	case foreign:
		return foreignReason(g.node)
	default:
		return fmt.Sprintf("node %s not seen yet; the agent acts only on a Node that carries the label %s=%s", g.node, Label, Value)
	}
}

func foreignReason(node string) string {
	return fmt.Sprintf("node %s does not carry the label %s=%s; another volume manager (a kubelet) may own it", node, Label, Value)
}

func replacedReason(node string, uid, pin types.UID) string {
	return fmt.Sprintf("node %s was replaced: it has UID %s, the agent served UID %s; the agent does not adopt a Node of the same name "+
		"that someone else created (restart the agent to adopt it, or delete it and let --register-node create its own)", node, uid, pin)
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
