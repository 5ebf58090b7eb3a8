package deploy_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"time"
)

// auditPollInterval is how often the audit log is read for new lines.
const auditPollInterval = 20 * time.Millisecond

// auditEvent is the part of an audit.k8s.io/v1 Event the tests read.
type auditEvent struct {
	Verb             string       `json:"verb"`
	Stage            string       `json:"stage"`
	RequestURI       string       `json:"requestURI"`
	User             auditUser    `json:"user"`
	ImpersonatedUser *auditUser   `json:"impersonatedUser,omitempty"`
	ObjectRef        *auditObject `json:"objectRef,omitempty"`
	ResponseStatus   *struct {
		Code int `json:"code"`
	} `json:"responseStatus,omitempty"`
}

type auditUser struct {
	Username string   `json:"username"`
	Groups   []string `json:"groups"`
}

// actor is the user the request was authorized as: the impersonated user,
// if any, else the authenticated one (a client certificate's system:node:X,
// a ServiceAccount's or a bootstrap token's user).
func (e auditEvent) actor() auditUser {
	if e.ImpersonatedUser != nil {
		return *e.ImpersonatedUser
	}
	return e.User
}

// object is the request's namespace/name, "" for a collection.
func (e auditEvent) object() string {
	if e.ObjectRef == nil || e.ObjectRef.Name == "" {
		return ""
	}
	return e.ObjectRef.Namespace + "/" + e.ObjectRef.Name
}

type auditObject struct {
	Resource    string `json:"resource"`
	Subresource string `json:"subresource"`
	APIGroup    string `json:"apiGroup"`
	Namespace   string `json:"namespace"`
	Name        string `json:"name"`
}

// code is the response status code, 0 when there is none yet.
func (e auditEvent) code() int {
	if e.ResponseStatus == nil {
		return 0
	}
	return e.ResponseStatus.Code
}

// access is "verb group/resource[/subresource]", as RBAC sees a request.
func (e auditEvent) access() access {
	a := access{Verb: e.Verb}
	if e.ObjectRef != nil {
		a.Group, a.Resource = e.ObjectRef.APIGroup, e.ObjectRef.Resource
		if e.ObjectRef.Subresource != "" {
			a.Resource += "/" + e.ObjectRef.Subresource
		}
	}
	return a
}

// access is one verb on one resource (with its subresource, "pods/status").
type access struct {
	Verb, Group, Resource string
}

func (a access) String() string {
	if a.Group == "" {
		return a.Verb + " " + a.Resource
	}
	return a.Verb + " " + a.Group + "/" + a.Resource
}

// auditLog follows the API server's audit log and keeps the events of every
// user but the tests' own (system:masters) and the API server's loopback
// requests: the agent's identities (its Node, its ServiceAccount), the
// approver's and the impersonated ones.
type auditLog struct {
	path string
	stop chan struct{}
	done chan struct{}

	// mu protects byUser, changed and err.
	mu     sync.Mutex
	byUser map[string][]auditEvent
	// changed is closed and replaced whenever events arrive.
	changed chan struct{}
	err     error
}

// tailAuditLog follows the audit log at path until Close.
func tailAuditLog(path string) *auditLog {
	a := &auditLog{
		path:    path,
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		byUser:  map[string][]auditEvent{},
		changed: make(chan struct{}),
	}
	go a.follow()
	return a
}

// Close stops following the log.
func (a *auditLog) Close() {
	close(a.stop)
	<-a.done
}

func (a *auditLog) follow() {
	defer close(a.done)
	tick := time.NewTicker(auditPollInterval)
	defer tick.Stop()
	var (
		f       *os.File
		r       *bufio.Reader
		partial []byte
	)
	defer func() {
		if f != nil {
			_ = f.Close()
		}
	}()
	for {
		if f == nil {
			var err error
			if f, err = os.Open(a.path); err == nil {
				r = bufio.NewReaderSize(f, 1<<20)
			} else if !errors.Is(err, os.ErrNotExist) {
				a.fail(err)
				return
			}
		}
		if r != nil {
			var batch []auditEvent
			for {
				line, err := r.ReadBytes('\n')
				partial = append(partial, line...)
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					a.fail(err)
					return
				}
				var ev auditEvent
				if err := json.Unmarshal(bytes.TrimSpace(partial), &ev); err != nil {
					a.fail(fmt.Errorf("decoding audit event %q: %w", partial, err))
					return
				}
				partial = partial[:0]
				if ev.ImpersonatedUser != nil || !slices.Contains(ev.User.Groups, "system:masters") {
					batch = append(batch, ev)
				}
			}
			a.add(batch)
		}
		select {
		case <-a.stop:
			return
		case <-tick.C:
		}
	}
}

func (a *auditLog) fail(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.err = fmt.Errorf("reading the audit log %s: %w", a.path, err)
	close(a.changed)
	a.changed = make(chan struct{})
}

func (a *auditLog) add(events []auditEvent) {
	if len(events) == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, ev := range events {
		user := ev.actor().Username
		a.byUser[user] = append(a.byUser[user], ev)
	}
	close(a.changed)
	a.changed = make(chan struct{})
}

// Events returns the events of user so far.
func (a *auditLog) Events(user string) ([]auditEvent, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]auditEvent(nil), a.byUser[user]...), a.err
}

// Changed returns a channel that is closed when new events arrive.
func (a *auditLog) Changed() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.changed
}

// Denied returns the requests of user that were answered 403 Forbidden.
func (a *auditLog) Denied(user string) ([]auditEvent, error) {
	events, err := a.Events(user)
	var denied []auditEvent
	for _, ev := range events {
		if ev.code() == 403 {
			denied = append(denied, ev)
		}
	}
	return denied, err
}

// WaitDenied waits until user has been denied acc and returns that request.
func (a *auditLog) WaitDenied(ctx context.Context, user string, acc access) (auditEvent, error) {
	for {
		changed := a.Changed()
		denied, err := a.Denied(user)
		if err != nil {
			return auditEvent{}, err
		}
		for _, ev := range denied {
			if ev.access() == acc {
				return ev, nil
			}
		}
		select {
		case <-ctx.Done():
			return auditEvent{}, fmt.Errorf("no denied %s for %s: %w", acc, user, ctx.Err())
		case <-changed:
		}
	}
}

// Unresolved returns the requests of user that were answered 403 Forbidden
// and not later allowed. A GET the Node authorizer denies and allows later,
// once the object exists and its graph (fed by the API server's own
// watches) links it to the Node, is how a kubelet reads an object that
// another controller is about to create, or one created a moment before
// the graph learnt of it: transient lists those, each with the allowed GET
// that followed.
func (a *auditLog) Unresolved(user string) (unresolved, transient []auditEvent, err error) {
	events, err := a.Events(user)
	for i, ev := range events {
		if ev.code() != 403 {
			continue
		}
		resolved := ev.Verb == "get" && ev.object() != "" && slices.ContainsFunc(events[i+1:], func(later auditEvent) bool {
			return later.Verb == ev.Verb && later.access() == ev.access() && later.object() == ev.object() &&
				(later.code() < 400 || later.code() == 404)
		})
		if resolved {
			transient = append(transient, ev)
		} else {
			unresolved = append(unresolved, ev)
		}
	}
	return unresolved, transient, err
}
