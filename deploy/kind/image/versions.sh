# shellcheck shell=bash
# Every version that goes into the kind node image and the images deployed
# under kind; sourced by build.sh. Each comes from the Go module proxy or
# Debian's archive, nothing from an image registry. README.md explains the
# choices.

# The Kubernetes release of the node (kubelet, kubeadm, kubectl, control
# plane). v1.37.2's kubelet still runs on cgroup v1 with failCgroupV1: false
# (deploy/kind/cluster.yaml sets it).
KUBERNETES_VERSION=v1.37.2
# kind itself: the CLI and the node image builder (`kind build node-image
# --type file`), and the files of its base image (images/base/files).
KIND_VERSION=v0.33.0
# What kubeadm v1.37.2 deploys (`kubeadm config images list`).
ETCD_VERSION=v3.7.0
ETCD_IMAGE_TAG=3.7.0-0
COREDNS_VERSION=v1.14.6
# Built from build/pause/linux/pause.c of k8s.io/kubernetes v1.37.2; also
# containerd's sandbox image.
PAUSE_VERSION=3.10.2
# The node's container runtime, as kind v0.33.0 pins them (images/base),
# except crictl: kind's v1.36.0 is not served, v1.37.0 matches the kubelet.
CONTAINERD_VERSION=v2.3.4
RUNC_VERSION=v1.4.3
CRICTL_VERSION=v1.37.0
CNI_PLUGINS_VERSION=v1.9.1
# kind's default storage (local-path-provisioner); kind pins v0.0.34, the
# newest the module proxy serves is v0.0.30.
LOCAL_PATH_PROVISIONER_VERSION=v0.0.30
# The image names kind v0.33.0 bakes into its CNI and storage manifests
# (pkg/build/nodeimage/const_cni.go, const_storage.go); our images carry them
# so that nothing is pulled.
KINDNETD_IMAGE=docker.io/kindest/kindnetd:v20260820-69b56db7
LOCAL_PATH_PROVISIONER_IMAGE=docker.io/kindest/local-path-provisioner:v20260820-69b56db7
LOCAL_PATH_HELPER_IMAGE=docker.io/kindest/local-path-helper:v20260131-7181c60a
# The root file systems: Debian 12, the host's own release, so that the
# one cgo binary (runc, with libseccomp) runs on the node as built.
DEBIAN_SUITE=bookworm
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

# The CSI sidecars deployed with the CSI test plugin.
EXTERNAL_ATTACHER_VERSION=v4.13.0
EXTERNAL_PROVISIONER_VERSION=v6.4.0
