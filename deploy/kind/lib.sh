# shellcheck shell=bash
# Shared settings of up.sh, e2e.sh and down.sh; sourced, not run.
# Needs: docker, kind (`deploy/kind/image/build.sh kind` builds v0.33.0), and
# a kubectl with kustomize v5 (`make k8s-bins` builds one into
# bin/k8s/kubectl). `make kind-up` passes all of them in.

KIND=${KIND:-kind}
KUBECTL=${KUBECTL:-kubectl}
CLUSTER=${KIND_CLUSTER:-csi-volmgr}
# The images `make images` builds and `make images-load` puts into Docker,
# under the version's tag; up.sh tags each with the name deploy/kind uses
# (KIND_IMAGE, and csi-volmgr-testplugin:kind, csi-volmgr-example-runtime:kind
# in LOAD_IMAGES). Defaults: those names, for images already tagged so.
IMAGE=${IMAGE:-csi-volmgr:kind}
TESTPLUGIN_IMAGE=${TESTPLUGIN_IMAGE:-csi-volmgr-testplugin:kind}
RUNTIME_IMAGE=${RUNTIME_IMAGE:-csi-volmgr-example-runtime:kind}
# The node image `make kind-image` builds (deploy/kind/image).
KIND_NODE_IMAGE=${KIND_NODE_IMAGE:-csi-volmgr-kind/node:v1.37.2}
TIMEOUT=${E2E_TIMEOUT:-180s}

# The names deploy/kind gives things.
KIND_IMAGE=csi-volmgr:kind
# The other images deploy/kind and its example use that are not in the node
# image; up.sh loads them into the nodes (deploy/kind/image/build.sh
# deploy-images and `make images` build them).
LOAD_IMAGES=(
	csi-volmgr-testplugin:kind
	registry.k8s.io/sig-storage/csi-attacher:v4.13.0
	registry.k8s.io/sig-storage/csi-provisioner:v6.4.0
	csi-volmgr-kind/shell:bookworm
)
# What up.sh deploys: deploy/kind (the agent, --register-node: the virtual
# node's pods get their volumes but nothing runs them) or deploy/kind/runtime
# (the example runtime embedding the agent: they run).
OVERLAY=${KIND_OVERLAY:-deploy/kind}
case "$OVERLAY" in
deploy/kind) RUNTIME=false ;;
deploy/kind/runtime)
	RUNTIME=true
	LOAD_IMAGES+=(csi-volmgr-example-runtime:kind)
	;;
*)
	echo "KIND_OVERLAY=$OVERLAY: want deploy/kind or deploy/kind/runtime" >&2
	exit 2
	;;
esac
NAMESPACE=csi-volmgr
# Only pods that tolerate it are scheduled to the virtual node: the agent
# registers the Node with it (--node-taints of kind/virtual-node), the
# example runtime with its --taint.
VIRTUAL_NODE_TAINT=csi-volmgr.io/virtual=true:NoSchedule
DRIVER=testplugin.csi-volmgr.io
# The kind worker that hosts the agent and the plugin, and whose own kubelet
# serves the second example pod.
AGENT_HOST=$CLUSTER-worker
# The virtual node the agent on AGENT_HOST serves, and acts on the API
# server as (system:node:$VIRTUAL_NODE): deploy/base's csi-volmgr-<host>.
VIRTUAL_NODE=csi-volmgr-$AGENT_HOST
ROOT_DIR=/var/lib/csi-volmgr

k() { "$KUBECTL" --context "kind-$CLUSTER" "$@"; }
log() { printf '\n=== %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

# wait_for DESCRIPTION TIMEOUT_SECONDS COMMAND...: run COMMAND every 2s
# until it succeeds.
wait_for() {
	local what=$1 timeout=$2
	shift 2
	local deadline=$((SECONDS + timeout))
	until "$@" >/dev/null 2>&1; do
		((SECONDS < deadline)) || fail "timed out after ${timeout}s waiting for $what"
		sleep 2
	done
}

# dump prints what helps to understand a failure.
dump() {
	log "diagnostics"
	k get nodes -o wide || true
	k get node "$VIRTUAL_NODE" -o yaml || true
	k get csinode "$VIRTUAL_NODE" -o yaml || true
	k get pods -A -o wide || true
	k get pvc,pv,volumeattachments -A || true
	k get csr -o wide || true
	k get events -A --sort-by=.lastTimestamp | tail -n 40 || true
	k -n "$NAMESPACE" exec ds/csi-volmgr -- /csi-volmgr drivers || true
	k -n "$NAMESPACE" exec ds/csi-volmgr -- /csi-volmgr status || true
	k -n "$NAMESPACE" logs ds/csi-volmgr --tail=200 || true
	k -n "$NAMESPACE" logs statefulset/csi-testplugin --all-containers --tail=100 || true
	k -n "$NAMESPACE" logs deployment/csi-volmgr-csr-approver --tail=50 || true
}
