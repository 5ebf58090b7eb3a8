#!/usr/bin/env bash
# Creates the kind cluster of deploy/kind/cluster.yaml (unless it exists),
# loads the agent image into it and deploys deploy/kind: csi-volmgr serving
# the virtual node csi-volmgr-virtual, and the hostpath driver paired with
# it. Returns once the virtual Node is registered and the driver published
# in its CSINode.
#
#   make image && deploy/kind/up.sh        (or: make kind-up)
set -euo pipefail
cd "$(dirname "$0")/../.."
. deploy/kind/lib.sh
trap 'rc=$?; if ((rc != 0)); then dump; fi' EXIT

if ! "$KIND" get clusters | grep -qx "$CLUSTER"; then
	log "creating kind cluster $CLUSTER"
	"$KIND" create cluster --name "$CLUSTER" --config deploy/kind/cluster.yaml \
		${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"} --wait 120s
fi

log "loading $IMAGE as $KIND_IMAGE"
if [[ "$IMAGE" != "$KIND_IMAGE" ]]; then
	docker tag "$IMAGE" "$KIND_IMAGE"
fi
"$KIND" load docker-image "$KIND_IMAGE" --name "$CLUSTER"

log "deploying deploy/kind"
"$KUBECTL" kustomize deploy/kind | k apply --server-side -f -
# A reloaded image under the same tag needs new pods.
k -n "$NAMESPACE" rollout restart daemonset/csi-volmgr
k -n "$NAMESPACE" rollout status daemonset/csi-volmgr --timeout="$TIMEOUT"
k -n "$NAMESPACE" rollout status statefulset/csi-hostpathplugin --timeout="$TIMEOUT"

log "waiting for the virtual node $VIRTUAL_NODE and its CSINode"
wait_for "Node $VIRTUAL_NODE" 120 k get node "$VIRTUAL_NODE"
k wait --for=condition=Ready "node/$VIRTUAL_NODE" --timeout="$TIMEOUT"
# --register-node creates the Node without taints and without capacity:
# taint it, so that only pods that tolerate it land there, and give it pod
# capacity, without which the scheduler places no pod on it at all.
k taint node "$VIRTUAL_NODE" "$VIRTUAL_NODE_TAINT" --overwrite
k patch node "$VIRTUAL_NODE" --subresource=status --type=merge \
	-p "{\"status\":{\"capacity\":{\"pods\":\"$VIRTUAL_NODE_PODS\"},\"allocatable\":{\"pods\":\"$VIRTUAL_NODE_PODS\"}}}"
csinode_has_driver() {
	k get csinode "$VIRTUAL_NODE" -o jsonpath='{.spec.drivers[*].name}' | grep -qw "$DRIVER"
}
wait_for "$DRIVER in CSINode $VIRTUAL_NODE" 120 csinode_has_driver
k get node "$VIRTUAL_NODE" -o wide
k -n "$NAMESPACE" exec ds/csi-volmgr -- /csi-volmgr drivers
