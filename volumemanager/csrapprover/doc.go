// Package csrapprover approves the client certificate requests of
// csi-volmgr agents, and only theirs, for the signer
// kubernetes.io/kube-apiserver-client-kubelet: `csi-volmgr
// approve-node-csrs`.
//
// The agent acts on the API server as its Node (user system:node:<name>,
// group system:nodes), so that the Node authorizer and NodeRestriction
// limit it to that Node's objects. Its certificate comes from a
// CertificateSigningRequest that kube-controller-manager signs once it is
// approved. Kube-controller-manager's own approver approves such a request
// for anyone allowed to create certificatesigningrequests/nodeclient,
// without checking that the requester is the node it asks to become: a
// credential with that right may become any node. The agents' credentials
// therefore never get it, and this approver approves a request only when
// the requester is proven to be the node it asks for (Rules.Decide):
//
//   - renewal: the requester is system:node:<X> itself (group system:nodes),
//     the agent's current certificate;
//   - DaemonSet bootstrap: the requester is an agent ServiceAccount whose
//     token is bound to a pod (user extras authentication.kubernetes.io/
//     pod-name and node-name, set by the API server): X is the prefix and
//     the pod's Node name;
//   - edge or systemd bootstrap: the requester is a bootstrap token
//     (system:bootstrap:<token id>) of the group
//     <bootstrap group prefix><X>, the token Secret's auth-extra-groups.
//     Such group names must match system:bootstrappers:[a-z0-9:-]{0,255}[a-z0-9],
//     so this path serves only Node names without dots.
//
// In every case X must start with the node name prefix (csi-volmgr- by
// default): the approver serves exactly those Nodes, and renews only them.
// The request itself must be a kubelet client request as kube-controller-
// manager's signer checks it (subject, no SANs, usages), with an ECDSA or
// RSA key.
//
// A request of one of these requesters that does not pass is denied, with
// a condition message that says what did not match. Requests of anyone
// else are left alone: they may be kubelets' requests that the built-in
// approver handles.
//
// The approver needs, in API group certificates.k8s.io: get, list and
// watch on certificatesigningrequests; update on
// certificatesigningrequests/approval; approve on signers, resourceNames
// kubernetes.io/kube-apiserver-client-kubelet.
package csrapprover
