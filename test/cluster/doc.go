// Package cluster is the end-to-end test of a virtual node on a real
// control plane, without Docker: kube-apiserver and etcd (test/k8s),
// kube-controller-manager (PV binder, attach/detach, ephemeral-volume and
// protection controllers) and kube-scheduler built from k8s.io/kubernetes,
// the kubernetes-csi external-attacher against the CSI test plugin's
// controller service, and the example runtime (examples/vk-runtime: a
// virtual-kubelet provider that embeds csi-volmgr and runs containers as
// local processes). Its tests carry the build tag e2e and run with
// `make e2e`; they need root and the binaries `make e2e-bins` builds.
package cluster
