// Package identity is the proof, on a real API server, that an agent run
// with --node-identity is held to its own Node (issue 36, item 2).
//
// One control plane is shared by the whole test: etcd and kube-apiserver
// (test/k8s) run as kubeadm and kind run them, with
// --authorization-mode=Node,RBAC and the NodeRestriction admission plugin,
// writing an audit log; kube-controller-manager built from
// k8s.io/kubernetes signs node client certificates (csrsigning, with the
// Env's Signer) and runs its own approver (csrapproving) and the PV binder
// and attach/detach controllers; `csi-volmgr approve-node-csrs`, the built
// binary, runs with the RBAC of deploy/base/csr-approver.yaml.
//
// The agent (the real binary, `csi-volmgr run --node-identity
// --register-node`) starts with nothing but a pod-bound token of the
// ServiceAccount csi-volmgr/csi-volmgr (deploy/base/rbac.yaml: the
// ClusterRole system:node-bootstrapper), gets the certificate of
// system:node:csi-volmgr-<host>, registers its Node, publishes a volume of
// the CSI test plugin for a pod and tears it down. The test then acts with
// the agent's own certificate, as a compromised agent host would, and
// shows what the API server refuses it: each refusal is a subtest of
// TestNodeIdentity/CompromisedHost, one row of the table "What a
// compromised agent host can reach".
//
// The tests carry the build tag e2e and run with `make e2e`; they need
// root and the binaries of `make e2e-bins`.
package identity
