package csrapprover

import (
	"encoding/pem"
	"net"
	"net/url"
	"strings"
	"testing"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
)

func TestDecide(t *testing.T) {
	keys(t)
	type change func(*certificatesv1.CertificateSigningRequest)
	withUsages := func(u ...certificatesv1.KeyUsage) change {
		return func(c *certificatesv1.CertificateSigningRequest) { c.Spec.Usages = u }
	}
	withCondition := func(typ certificatesv1.RequestConditionType) change {
		return func(c *certificatesv1.CertificateSigningRequest) {
			c.Status.Conditions = append(c.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{Type: typ, Status: corev1.ConditionTrue})
		}
	}
	h1 := nodeRequest("csi-volmgr-h1")
	cases := map[string]struct {
		who    requester
		req    request
		change change
		want   Verdict
		// words must all be in the decision's message.
		words []string
	}{
		// Path (b): the agent DaemonSet's pod-bound token.
		"agent pod on h1 asks for csi-volmgr-h1": {
			who: agentPod("h1", "csi-volmgr-x7k2p"), req: h1, want: Approve,
			words: []string{"runs on node h1", "csi-volmgr-x7k2p"},
		},
		"agent pod with an RSA key and key encipherment": {
			who: agentPod("h1", "p"), req: request{cn: h1.cn, org: h1.org, key: rsaKey},
			change: withUsages(certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment, certificatesv1.UsageClientAuth),
			want:   Approve,
		},
		"agent pod on h1 asks for csi-volmgr-h2": {
			who: agentPod("h1", "p"), req: nodeRequest("csi-volmgr-h2"), want: Deny,
			words: []string{"requester runs on node h1 (token bound to pod p); the CSR asks for system:node:csi-volmgr-h2"},
		},
		"agent pod on h1 asks for h1, without the prefix": {
			who: agentPod("h1", "p"), req: nodeRequest("h1"), want: Deny,
			words: []string{"system:node:h1", `lacks the prefix "csi-volmgr-"`},
		},
		"agent token bound to no pod": {
			who: requester{user: agentPod("h1", "p").user, groups: agentPod("h1", "p").groups,
				extra: map[string]certificatesv1.ExtraValue{ExtraNodeName: {"h1"}}},
			req: h1, want: Deny, words: []string{"no token bound to one pod", ExtraPodName},
		},
		"agent token without a node": {
			who: requester{user: agentPod("h1", "p").user, extra: map[string]certificatesv1.ExtraValue{ExtraPodName: {"p"}}},
			req: h1, want: Deny, words: []string{"bound to pod p but to no one Node", ExtraNodeName},
		},
		"agent token with two nodes": {
			who: requester{user: agentPod("h1", "p").user,
				extra: map[string]certificatesv1.ExtraValue{ExtraPodName: {"p"}, ExtraNodeName: {"h1", "h2"}}},
			req: h1, want: Deny, words: []string{"no one Node"},
		},
		// Path (a): renewal with the current certificate.
		"renewal by the node itself": {
			who: nodeUser("csi-volmgr-h1"), req: h1, want: Approve, words: []string{"renewal by node csi-volmgr-h1 itself"},
		},
		"renewal by another node": {
			who: nodeUser("csi-volmgr-h1"), req: nodeRequest("csi-volmgr-h2"), want: Deny,
			words: []string{"requester is node csi-volmgr-h1; the CSR asks for system:node:csi-volmgr-h2"},
		},
		"node user outside group system:nodes": {
			who: requester{user: "system:node:csi-volmgr-h1"}, req: h1, want: Deny, words: []string{"not in group system:nodes"},
		},
		// Path (c): a per-node bootstrap token.
		"bootstrap token of the group for csi-volmgr-e1": {
			who: bootstrapToken("abcdef", "system:bootstrappers:csi-volmgr:csi-volmgr-e1"), req: nodeRequest("csi-volmgr-e1"), want: Approve,
			words: []string{"system:bootstrap:abcdef", "system:bootstrappers:csi-volmgr:csi-volmgr-e1"},
		},
		"bootstrap token of the group for csi-volmgr-e1 asks for csi-volmgr-e2": {
			who: bootstrapToken("abcdef", "system:bootstrappers:csi-volmgr:csi-volmgr-e1"), req: nodeRequest("csi-volmgr-e2"), want: Deny,
			words: []string{"bootstrap token for node csi-volmgr-e1; the CSR asks for system:node:csi-volmgr-e2"},
		},
		"bootstrap token of the group for e1, without the prefix": {
			who: bootstrapToken("abcdef", "system:bootstrappers:csi-volmgr:e1"), req: nodeRequest("e1"), want: Deny,
			words: []string{"lacks the prefix"},
		},
		"a user, not a token, in a bootstrap group": {
			who: requester{user: "alice", groups: []string{"system:bootstrappers:csi-volmgr:csi-volmgr-e1"}}, req: nodeRequest("csi-volmgr-e1"),
			want: Deny, words: []string{"requester alice", "no bootstrap token"},
		},
		// The request itself, from one of our requesters.
		"common name not system:node:": {
			who: agentPod("h1", "p"), req: request{cn: "csi-volmgr-h1", org: h1.org}, want: Deny, words: []string{"common name", "system:node:"},
		},
		"common name names no valid Node": {
			who: agentPod("h1", "p"), req: request{cn: "system:node:Csi_h1", org: h1.org}, want: Deny, words: []string{"names no valid Node"},
		},
		"organization system:masters too": {
			who: agentPod("h1", "p"), req: request{cn: h1.cn, org: []string{"system:nodes", "system:masters"}}, want: Deny, words: []string{"organization"},
		},
		"no organization": {
			who: agentPod("h1", "p"), req: request{cn: h1.cn}, want: Deny, words: []string{"organization"},
		},
		"DNS SAN": {
			who: agentPod("h1", "p"), req: request{cn: h1.cn, org: h1.org, dns: []string{"h1"}}, want: Deny, words: []string{"DNS subjectAltNames"},
		},
		"IP SAN": {
			who: agentPod("h1", "p"), req: request{cn: h1.cn, org: h1.org, ips: []net.IP{net.IPv4(10, 0, 0, 1)}}, want: Deny, words: []string{"IP subjectAltNames"},
		},
		"email SAN": {
			who: agentPod("h1", "p"), req: request{cn: h1.cn, org: h1.org, emails: []string{"a@b.c"}}, want: Deny, words: []string{"email subjectAltNames"},
		},
		"URI SAN": {
			who: agentPod("h1", "p"), req: request{cn: h1.cn, org: h1.org, uris: []*url.URL{{Scheme: "spiffe", Host: "x"}}}, want: Deny, words: []string{"URI subjectAltNames"},
		},
		"server auth usage": {
			who: agentPod("h1", "p"), req: h1, change: withUsages(certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth),
			want: Deny, words: []string{"usages", "server auth"},
		},
		"client and server auth": {
			who: agentPod("h1", "p"), req: h1,
			change: withUsages(certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth, certificatesv1.UsageServerAuth),
			want:   Deny, words: []string{"usages"},
		},
		"client auth without digital signature": {
			who: agentPod("h1", "p"), req: h1, change: withUsages(certificatesv1.UsageClientAuth), want: Deny, words: []string{"usages"},
		},
		"Ed25519 key": {
			who: agentPod("h1", "p"), req: request{cn: h1.cn, org: h1.org, key: edKey}, want: Deny, words: []string{"key algorithm Ed25519"},
		},
		"not PEM": {
			who: agentPod("h1", "p"), req: h1,
			change: func(c *certificatesv1.CertificateSigningRequest) { c.Spec.Request = []byte("not a request") },
			want:   Deny, words: []string{"no PEM block"},
		},
		"bad signature": {
			who: agentPod("h1", "p"), req: h1,
			change: func(c *certificatesv1.CertificateSigningRequest) {
				block, _ := pem.Decode(c.Spec.Request)
				block.Bytes[len(block.Bytes)-1] ^= 0xff
				c.Spec.Request = pem.EncodeToMemory(block)
			},
			want: Deny, words: []string{"signature"},
		},
		// Not ours to decide.
		"another signer": {
			who: agentPod("h1", "p"), req: h1, change: func(c *certificatesv1.CertificateSigningRequest) {
				c.Spec.SignerName = certificatesv1.KubeAPIServerClientSignerName
			},
			want: Ignore,
		},
		"already approved":          {who: agentPod("h1", "p"), req: nodeRequest("csi-volmgr-h2"), change: withCondition(certificatesv1.CertificateApproved), want: Ignore},
		"already denied":            {who: agentPod("h1", "p"), req: h1, change: withCondition(certificatesv1.CertificateDenied), want: Ignore},
		"failed by the signer":      {who: agentPod("h1", "p"), req: h1, change: withCondition(certificatesv1.CertificateFailed), want: Ignore},
		"already issued":            {who: agentPod("h1", "p"), req: h1, change: func(c *certificatesv1.CertificateSigningRequest) { c.Status.Certificate = []byte("x") }, want: Ignore},
		"kubelet renews":            {who: nodeUser("worker1"), req: nodeRequest("worker1"), want: Ignore},
		"kubelet asks for our node": {who: nodeUser("worker1"), req: h1, want: Ignore},
		"kubeadm bootstrap token": {
			who: bootstrapToken("abcdef", "system:bootstrappers:kubeadm:default-node-token"), req: nodeRequest("worker1"), want: Ignore,
		},
		"kubeadm bootstrap token asks for our node": {
			who: bootstrapToken("abcdef", "system:bootstrappers:kubeadm:default-node-token"), req: h1, want: Ignore,
		},
		"another ServiceAccount's pod-bound token": {
			who: requester{user: "system:serviceaccount:kube-system:other",
				extra: map[string]certificatesv1.ExtraValue{ExtraNodeName: {"h1"}, ExtraPodName: {"p"}}},
			req: h1, want: Ignore,
		},
		"a user": {who: requester{user: "alice", groups: []string{"system:authenticated"}}, req: h1, want: Ignore},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			csr := newCSR(t, "csr-1", tc.who, tc.req)
			if tc.change != nil {
				tc.change(csr)
			}
			got := DefaultRules().Decide(csr)
			if got.Verdict != tc.want {
				t.Fatalf("Decide: %s (%s), want %s", got.Verdict, got.Message, tc.want)
			}
			for _, w := range tc.words {
				if !strings.Contains(got.Message, w) {
					t.Errorf("message %q lacks %q", got.Message, w)
				}
			}
			if got.Verdict != Ignore && got.Message == "" {
				t.Error("no message")
			}
		})
	}
}

// TestDecideFollowsTheRules: the flags change whose requests are decided.
func TestDecideFollowsTheRules(t *testing.T) {
	rules := Rules{
		NodeNamePrefix:       "vn-",
		AgentServiceAccounts: []string{"other/agent", "csi-volmgr/csi-volmgr"},
	}
	if err := rules.Validate(); err != nil {
		t.Fatal(err)
	}
	other := agentPod("h1", "p")
	other.user = "system:serviceaccount:other:agent"
	for name, tc := range map[string]struct {
		who  requester
		node string
		want Verdict
	}{
		"second ServiceAccount, its prefix":  {who: other, node: "vn-h1", want: Approve},
		"default ServiceAccount, its prefix": {who: agentPod("h1", "p"), node: "vn-h1", want: Approve},
		"the default prefix is not served":   {who: other, node: "csi-volmgr-h1", want: Deny},
		"renewal with the prefix":            {who: nodeUser("vn-h1"), node: "vn-h1", want: Approve},
		"renewal with the default prefix":    {who: nodeUser("csi-volmgr-h1"), node: "csi-volmgr-h1", want: Ignore},
		"bootstrap groups are off":           {who: bootstrapToken("abcdef", DefaultBootstrapGroupPrefix+"vn-e1"), node: "vn-e1", want: Ignore},
	} {
		t.Run(name, func(t *testing.T) {
			got := rules.Decide(newCSR(t, "csr-1", tc.who, nodeRequest(tc.node)))
			if got.Verdict != tc.want {
				t.Errorf("Decide: %s (%s), want %s", got.Verdict, got.Message, tc.want)
			}
		})
	}
}

func TestRulesValidate(t *testing.T) {
	if err := DefaultRules().Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
	for name, change := range map[string]func(*Rules){
		"empty prefix":                     func(r *Rules) { r.NodeNamePrefix = "" },
		"prefix with capitals":             func(r *Rules) { r.NodeNamePrefix = "CSI-" },
		"ServiceAccount without namespace": func(r *Rules) { r.AgentServiceAccounts = []string{"csi-volmgr"} },
		"ServiceAccount with a bad name":   func(r *Rules) { r.AgentServiceAccounts = []string{"ns/Bad_Name"} },
		"every bootstrap token":            func(r *Rules) { r.BootstrapGroupPrefix = "system:bootstrappers:" },
		"group prefix without colon":       func(r *Rules) { r.BootstrapGroupPrefix = "system:bootstrappers:csi-volmgr" },
		"not a bootstrap group":            func(r *Rules) { r.BootstrapGroupPrefix = "system:nodes:" },
	} {
		r := DefaultRules()
		change(&r)
		if err := r.Validate(); err == nil {
			t.Errorf("%s: %+v accepted", name, r)
		}
	}
	r := DefaultRules()
	r.AgentServiceAccounts, r.BootstrapGroupPrefix = nil, ""
	if err := r.Validate(); err != nil {
		t.Errorf("renewal only: %v", err)
	}
}
