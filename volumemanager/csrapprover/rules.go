package csrapprover

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/apiserver/pkg/authentication/user"
)

const (
	// SignerName is the only signer whose requests the approver decides:
	// client certificates of nodes for the API server.
	SignerName = certificatesv1.KubeAPIServerClientKubeletSignerName

	// ConditionReasonApprove is the reason of the Approved condition the
	// approver writes.
	ConditionReasonApprove = "CSIVolmgrApprove"
	// ConditionReasonDeny is the reason of the Denied condition the
	// approver writes; the message says what did not match.
	ConditionReasonDeny = "CSIVolmgrDeny"

	// DefaultNodeNamePrefix starts the name of every Node the approver
	// serves.
	DefaultNodeNamePrefix = "csi-volmgr-"
	// DefaultAgentServiceAccount is the agent DaemonSet's ServiceAccount,
	// namespace/name.
	DefaultAgentServiceAccount = "csi-volmgr/csi-volmgr"
	// DefaultBootstrapGroupPrefix starts the group of a per-node bootstrap
	// token; the rest of the group is the Node's name.
	DefaultBootstrapGroupPrefix = "system:bootstrappers:csi-volmgr:"

	// ExtraNodeName is the user extra the API server sets from a pod-bound
	// ServiceAccount token: the name of the Node the pod is bound to.
	ExtraNodeName = "authentication.kubernetes.io/node-name"
	// ExtraPodName is the user extra the API server sets from a pod-bound
	// ServiceAccount token: the name of the pod.
	ExtraPodName = "authentication.kubernetes.io/pod-name"

	// nodeUserPrefix starts the user name of a node, and the common name
	// of its client certificate.
	nodeUserPrefix = "system:node:"
	// bootstrapUserPrefix starts the user name of a bootstrap token.
	bootstrapUserPrefix = "system:bootstrap:"
)

// bootstrapGroupPrefix is what a bootstrap token's group may look like
// (system:bootstrappers:[a-z0-9:-]{0,255}[a-z0-9], k8s.io/cluster-bootstrap),
// cut before a node name: at least one segment of its own, so that the
// groups of other tokens (system:bootstrappers:kubeadm:default-node-token)
// are never taken for ours.
var bootstrapGroupPrefix = regexp.MustCompile(`^system:bootstrappers:[a-z0-9-]+(:[a-z0-9-]+)*:$`)

// Rules say whose requests the approver decides and which it approves.
type Rules struct {
	// NodeNamePrefix starts the name of every Node the approver serves.
	NodeNamePrefix string
	// AgentServiceAccounts are the agents' ServiceAccounts, each
	// namespace/name: their pod-bound tokens may bootstrap the Node
	// NodeNamePrefix+<the pod's Node>. None turns that path off.
	AgentServiceAccounts []string
	// BootstrapGroupPrefix starts the group of a per-node bootstrap token,
	// the rest being the Node's name. Empty turns that path off.
	BootstrapGroupPrefix string
}

// DefaultRules are the rules of the defaults.
func DefaultRules() Rules {
	return Rules{
		NodeNamePrefix:       DefaultNodeNamePrefix,
		AgentServiceAccounts: []string{DefaultAgentServiceAccount},
		BootstrapGroupPrefix: DefaultBootstrapGroupPrefix,
	}
}

// Validate checks the rules.
func (r Rules) Validate() error {
	var errs []error
	if r.NodeNamePrefix == "" {
		errs = append(errs, errors.New("node name prefix: empty, which would serve every Node of the cluster"))
	} else if msgs := validation.IsDNS1123Subdomain(r.NodeNamePrefix + "x"); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("node name prefix %q does not start a Node name: %s", r.NodeNamePrefix, strings.Join(msgs, ", ")))
	}
	for _, sa := range r.AgentServiceAccounts {
		if _, err := serviceAccountUser(sa); err != nil {
			errs = append(errs, err)
		}
	}
	if r.BootstrapGroupPrefix != "" && !bootstrapGroupPrefix.MatchString(r.BootstrapGroupPrefix) {
		errs = append(errs, fmt.Errorf("bootstrap group prefix %q does not match %s", r.BootstrapGroupPrefix, bootstrapGroupPrefix))
	}
	return errors.Join(errs...)
}

// serviceAccountUser returns the user name of the ServiceAccount
// namespace/name.
func serviceAccountUser(nsName string) (string, error) {
	ns, name, ok := strings.Cut(nsName, "/")
	if !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
		return "", fmt.Errorf("agent ServiceAccount %q: want namespace/name", nsName)
	}
	return serviceaccount.MakeUsername(ns, name), nil
}

// Verdict is what the approver does with a request.
type Verdict string

const (
	// Ignore leaves the request alone: not one the approver decides.
	Ignore Verdict = "Ignore"
	// Approve approves the request.
	Approve Verdict = "Approve"
	// Deny denies the request.
	Deny Verdict = "Deny"
)

// Decision is the approver's answer to one request.
type Decision struct {
	Verdict Verdict
	// Node is the Node the request asks to become, once known.
	Node string
	// Message says why: the condition's message for Approve and Deny.
	Message string
}

// Decide says what to do with csr, from csr alone. It approves only a
// kubelet client request for a Node the rules serve from a requester
// proven to be that Node, denies the other requests of the requesters the
// rules name (agent ServiceAccounts, bootstrap tokens of the bootstrap
// groups, the served Nodes themselves) and ignores the rest, and every
// request already decided or issued.
func (r Rules) Decide(csr *certificatesv1.CertificateSigningRequest) Decision {
	if csr.Spec.SignerName != SignerName {
		return Decision{Verdict: Ignore, Message: "signer " + csr.Spec.SignerName + " is not " + SignerName}
	}
	if len(csr.Status.Certificate) > 0 {
		return Decision{Verdict: Ignore, Message: "already issued"}
	}
	for _, c := range csr.Status.Conditions {
		switch c.Type {
		case certificatesv1.CertificateApproved, certificatesv1.CertificateDenied, certificatesv1.CertificateFailed:
			return Decision{Verdict: Ignore, Message: "already " + string(c.Type)}
		}
	}
	proofs := r.proofs(&csr.Spec)
	if len(proofs) == 0 {
		return Decision{Verdict: Ignore, Message: "requester " + csr.Spec.Username + " is none of csi-volmgr's"}
	}
	node, err := kubeletClientNode(csr.Spec.Request, csr.Spec.Usages)
	if err != nil {
		return Decision{Verdict: Deny, Node: node, Message: "not a node client certificate request: " + err.Error()}
	}
	if !strings.HasPrefix(node, r.NodeNamePrefix) {
		return Decision{Verdict: Deny, Node: node, Message: fmt.Sprintf(
			"the CSR asks for %s%s, whose name lacks the prefix %q of the Nodes csi-volmgr serves", nodeUserPrefix, node, r.NodeNamePrefix)}
	}
	var why []string
	for _, proof := range proofs {
		msg, ok := proof(node)
		if ok {
			return Decision{Verdict: Approve, Node: node, Message: nodeUserPrefix + node + ": " + msg}
		}
		why = append(why, msg)
	}
	return Decision{Verdict: Deny, Node: node, Message: strings.Join(why, "; ")}
}

// proof tells whether the requester is the Node node, and why (not).
type proof func(node string) (msg string, ok bool)

// proofs are the ways in which the requester of spec may prove to be a
// Node: one per identity of csi-volmgr's it has, none for anyone else.
func (r Rules) proofs(spec *certificatesv1.CertificateSigningRequestSpec) []proof {
	var out []proof
	if self, ok := strings.CutPrefix(spec.Username, nodeUserPrefix); ok && strings.HasPrefix(self, r.NodeNamePrefix) {
		out = append(out, func(node string) (string, bool) { return renewal(spec, self, node) })
	}
	for _, sa := range r.AgentServiceAccounts {
		if u, err := serviceAccountUser(sa); err == nil && u == spec.Username {
			out = append(out, func(node string) (string, bool) { return r.podBound(spec, node) })
			break
		}
	}
	if r.BootstrapGroupPrefix != "" {
		var groups []string
		for _, g := range spec.Groups {
			if n, ok := strings.CutPrefix(g, r.BootstrapGroupPrefix); ok {
				groups = append(groups, n)
			}
		}
		if len(groups) > 0 {
			out = append(out, func(node string) (string, bool) { return r.bootstrapToken(spec, groups, node) })
		}
	}
	return out
}

// renewal: the Node self asks for its own certificate again.
func renewal(spec *certificatesv1.CertificateSigningRequestSpec, self, node string) (string, bool) {
	switch {
	case !slices.Contains(spec.Groups, user.NodesGroup):
		return fmt.Sprintf("requester %s is not in group %s", spec.Username, user.NodesGroup), false
	case self != node:
		return fmt.Sprintf("requester is node %s; the CSR asks for %s%s", self, nodeUserPrefix, node), false
	}
	return "renewal by node " + node + " itself", true
}

// podBound: an agent's ServiceAccount token bound to a pod on the Node H
// asks for NodeNamePrefix+H.
func (r Rules) podBound(spec *certificatesv1.CertificateSigningRequestSpec, node string) (string, bool) {
	hosts, pods := spec.Extra[ExtraNodeName], spec.Extra[ExtraPodName]
	if len(pods) != 1 || pods[0] == "" {
		return fmt.Sprintf("requester %s has no token bound to one pod (user extra %s: %q); the agent must use its pod's projected ServiceAccount token",
			spec.Username, ExtraPodName, []string(pods)), false
	}
	if len(hosts) != 1 || hosts[0] == "" {
		return fmt.Sprintf("requester %s has a token bound to pod %s but to no one Node (user extra %s: %q)",
			spec.Username, pods[0], ExtraNodeName, []string(hosts)), false
	}
	if want := r.NodeNamePrefix + hosts[0]; node != want {
		return fmt.Sprintf("requester runs on node %s (token bound to pod %s); the CSR asks for %s%s, not %s%s",
			hosts[0], pods[0], nodeUserPrefix, node, nodeUserPrefix, want), false
	}
	return fmt.Sprintf("requester %s runs on node %s (token bound to pod %s)", spec.Username, hosts[0], pods[0]), true
}

// bootstrapToken: a bootstrap token of the group BootstrapGroupPrefix+node
// asks for node.
func (r Rules) bootstrapToken(spec *certificatesv1.CertificateSigningRequestSpec, nodes []string, node string) (string, bool) {
	if !strings.HasPrefix(spec.Username, bootstrapUserPrefix) {
		return fmt.Sprintf("requester %s is in a group %s* but is no bootstrap token (user %s<token id>)",
			spec.Username, r.BootstrapGroupPrefix, bootstrapUserPrefix), false
	}
	if !slices.Contains(nodes, node) {
		return fmt.Sprintf("requester %s is a bootstrap token for node %s; the CSR asks for %s%s",
			spec.Username, strings.Join(nodes, ", "), nodeUserPrefix, node), false
	}
	return fmt.Sprintf("bootstrap token %s of group %s%s", spec.Username, r.BootstrapGroupPrefix, node), true
}
