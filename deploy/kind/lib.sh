# shellcheck shell=bash
# Shared settings of up.sh and e2e.sh; sourced, not run.
# Needs: docker, kind (v0.31 or newer), and a kubectl with kustomize v5
# (`make k8s-bins` builds one into bin/k8s/kubectl).

KIND=${KIND:-kind}
KUBECTL=${KUBECTL:-kubectl}
CLUSTER=${KIND_CLUSTER:-csi-volmgr}
# The image `make image` builds; up.sh tags it as the name deploy/kind uses.
IMAGE=${IMAGE:-csi-volmgr:kind}
# Empty: the default node image of the kind release in use.
KIND_NODE_IMAGE=${KIND_NODE_IMAGE:-}
TIMEOUT=${E2E_TIMEOUT:-180s}

# The names deploy/kind gives things.
KIND_IMAGE=csi-volmgr:kind
NAMESPACE=csi-volmgr
VIRTUAL_NODE=csi-volmgr-virtual
# Only pods that tolerate it are scheduled to the virtual node.
VIRTUAL_NODE_TAINT=csi-volmgr.io/virtual=true:NoSchedule
# The pods the scheduler may place on the virtual node (its allocatable).
VIRTUAL_NODE_PODS=110
DRIVER=hostpath.csi.k8s.io
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
	k get events -A --sort-by=.lastTimestamp | tail -n 40 || true
	k -n "$NAMESPACE" exec ds/csi-volmgr -- /csi-volmgr drivers || true
	k -n "$NAMESPACE" exec ds/csi-volmgr -- /csi-volmgr status || true
	k -n "$NAMESPACE" logs ds/csi-volmgr --tail=200 || true
	k -n "$NAMESPACE" logs statefulset/csi-hostpathplugin --all-containers --tail=100 || true
}
