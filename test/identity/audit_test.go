//go:build e2e

package identity_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
)

// auditPolicy records, once answered, every request of a Node or a
// ServiceAccount (the agent as its Node, its bootstrap token, the
// approver) with its status code, and every SubjectAccessReview with its
// body and answer: kube-controller-manager's approver asks one for each
// CSR it recognizes, so the log shows whether it would approve. Everything
// else (the test as admin, the controllers) is left out.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: RequestResponse
    resources:
      - group: authorization.k8s.io
        resources: ["subjectaccessreviews"]
  - level: Metadata
    userGroups: ["system:nodes", "system:serviceaccounts"]
  - level: None
`

// auditEvent is the part of an audit.k8s.io/v1 Event the test reads.
type auditEvent struct {
	Stage      string `json:"stage"`
	RequestURI string `json:"requestURI"`
	Verb       string `json:"verb"`
	User       struct {
		Username string              `json:"username"`
		Groups   []string            `json:"groups"`
		Extra    map[string][]string `json:"extra"`
	} `json:"user"`
	UserAgent string `json:"userAgent"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		APIGroup    string `json:"apiGroup"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"responseStatus"`
	RequestObject  json.RawMessage `json:"requestObject"`
	ResponseObject json.RawMessage `json:"responseObject"`
}

func (e auditEvent) code() int {
	if e.ResponseStatus == nil {
		return 0
	}
	return e.ResponseStatus.Code
}

// access is "verb group/resource/subresource namespace/name", for the log.
func (e auditEvent) access() string {
	if e.ObjectRef == nil {
		return e.Verb + " " + e.RequestURI
	}
	r := e.ObjectRef.Resource
	if e.ObjectRef.APIGroup != "" {
		r = e.ObjectRef.APIGroup + "/" + r
	}
	if e.ObjectRef.Subresource != "" {
		r += "/" + e.ObjectRef.Subresource
	}
	return e.Verb + " " + r
}

// readAudit reads the whole audit log at path (ResponseComplete and Panic
// events: every request that has an answer). A last line being written is
// left for the next read.
func readAudit(path string) ([]auditEvent, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the audit log: %w", err)
	}
	var out []auditEvent
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		var ev auditEvent
		if err := json.Unmarshal(line, &ev); err != nil {
			if !bytes.HasSuffix(data, []byte("\n")) && bytes.HasSuffix(data, line) {
				break // the last line, not complete yet
			}
			return nil, fmt.Errorf("decoding an audit event %q: %w", line, err)
		}
		if ev.Stage == "ResponseComplete" || ev.Stage == "Panic" {
			out = append(out, ev)
		}
	}
	return out, sc.Err()
}

// sarEvent is a SubjectAccessReview from the audit log: whom it asked
// about, for which access, and the answer.
type sarEvent struct {
	userAgent   string
	user        string
	resource    string
	subresource string
	verb        string
	allowed     bool
}

// subjectAccessReviews are the SubjectAccessReviews of the audit log that
// got an answer.
func subjectAccessReviews(t testing.TB, events []auditEvent) []sarEvent {
	t.Helper()
	type sar struct {
		Spec struct {
			User               string `json:"user"`
			ResourceAttributes *struct {
				Verb        string `json:"verb"`
				Resource    string `json:"resource"`
				Subresource string `json:"subresource"`
			} `json:"resourceAttributes"`
		} `json:"spec"`
		Status struct {
			Allowed bool `json:"allowed"`
		} `json:"status"`
	}
	var out []sarEvent
	for _, ev := range events {
		if ev.ObjectRef == nil || ev.ObjectRef.Resource != "subjectaccessreviews" || ev.Verb != "create" || ev.code() != 201 {
			continue
		}
		var req, resp sar
		if err := json.Unmarshal(ev.RequestObject, &req); err != nil {
			t.Fatalf("decoding a SubjectAccessReview of the audit log: %v", err)
		}
		if err := json.Unmarshal(ev.ResponseObject, &resp); err != nil {
			t.Fatalf("decoding a SubjectAccessReview's answer in the audit log: %v", err)
		}
		s := sarEvent{userAgent: ev.UserAgent, user: req.Spec.User, allowed: resp.Status.Allowed}
		if ra := req.Spec.ResourceAttributes; ra != nil {
			s.verb, s.resource, s.subresource = ra.Verb, ra.Resource, ra.Subresource
		}
		out = append(out, s)
	}
	return out
}

// builtInApproverSARs are the SubjectAccessReviews kube-controller-manager's
// approver (csrapproving) asked about requester: one per CSR of that
// requester it recognized as a kubelet client request, before approving it.
func builtInApproverSARs(t testing.TB, events []auditEvent, requester string) []sarEvent {
	t.Helper()
	var out []sarEvent
	for _, s := range subjectAccessReviews(t, events) {
		if strings.Contains(s.userAgent, "kube-controller-manager") && s.user == requester &&
			s.resource == "certificatesigningrequests" && slices.Contains([]string{"nodeclient", "selfnodeclient"}, s.subresource) {
			out = append(out, s)
		}
	}
	return out
}
