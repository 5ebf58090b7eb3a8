// Package deploy holds the manifests of csi-volmgr (kustomize: base/, kind/
// for a virtual node under kind, systemd/ for edge hosts; the Helm chart in
// helm/) and the tests that hold them to a real kube-apiserver that
// authorizes as kubeadm's does (the Node authorizer, RBAC, NodeRestriction,
// bootstrap tokens): every kustomization renders and passes a server-side
// dry-run; the agent, run with exactly the DaemonSet's flags and its
// ServiceAccount's RBAC, acts as its Node and publishes a pod's volume with
// no request denied; it gets that Node's certificate through the approver
// the manifests deploy, with the approver's RBAC; every verb of both
// ServiceAccounts' RBAC is shown to be needed; and neither they nor an edge
// host's bootstrap token may do anything beyond asking for, or approving,
// a Node certificate.
package deploy
