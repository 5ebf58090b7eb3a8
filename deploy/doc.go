// Package deploy holds the Kubernetes manifests of csi-volmgr (kustomize:
// base/, and kind/ for a virtual node under kind) and the tests that hold
// them to a real kube-apiserver: every kustomization renders and passes a
// server-side dry-run, and the agent, run with exactly the DaemonSet's flags
// and RBAC, publishes a pod's volume while every verb of its ClusterRoles is
// shown to be needed.
package deploy
