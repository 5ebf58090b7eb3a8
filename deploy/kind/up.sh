#!/usr/bin/env bash
# Creates the kind cluster of deploy/kind/cluster.yaml from the node image
# that `make kind-image` builds (unless the cluster exists), loads the
# agent's image and the other images deploy/kind uses into it and deploys
# deploy/kind (or KIND_OVERLAY=deploy/kind/runtime, the example runtime
# embedding the agent): csi-volmgr serving the virtual node csi-volmgr-<host>
# as that Node (its certificate approved by csi-volmgr-csr-approver), and the
# CSI test plugin with its sidecars. Returns once the virtual Node is
# registered and the driver is published in its CSINode and in the worker's.
#
#   make kind-up     (builds the images, `make images-load` puts ours into
#                     Docker, then runs this)
set -euo pipefail
cd "$(dirname "$0")/../.."
. deploy/kind/lib.sh
trap 'rc=$?; if ((rc != 0)); then dump; fi' EXIT

if ! "$KIND" get clusters | grep -qx "$CLUSTER"; then
	log "creating kind cluster $CLUSTER from $KIND_NODE_IMAGE"
	"$KIND" create cluster --name "$CLUSTER" --config deploy/kind/cluster.yaml \
		--image "$KIND_NODE_IMAGE" --wait 180s
fi

# The images of `make images-load`, under the names deploy/kind uses.
retag() {
	if [[ "$1" != "$2" ]]; then
		docker tag "$1" "$2"
	fi
}
retag "$IMAGE" "$KIND_IMAGE"
retag "$TESTPLUGIN_IMAGE" csi-volmgr-testplugin:kind
if [[ "$RUNTIME" == true ]]; then
	retag "$RUNTIME_IMAGE" csi-volmgr-example-runtime:kind
fi
log "loading $KIND_IMAGE and ${LOAD_IMAGES[*]}"
"$KIND" load docker-image --name "$CLUSTER" "$KIND_IMAGE" "${LOAD_IMAGES[@]}"

log "deploying $OVERLAY"
# What deploy/ created before the agent acted as its Node, and no longer
# ships: the ServiceAccount's cluster-wide grants. kubectl apply does not
# remove them, and left in place they would keep every right the agent
# gave up.
k delete clusterrolebinding,clusterrole csi-volmgr csi-volmgr-register-node --ignore-not-found
k -n kube-node-lease delete rolebinding,role csi-volmgr-node-lease --ignore-not-found
"$KUBECTL" kustomize "$OVERLAY" | k apply --server-side -f -
# A reloaded image under the same tag needs new pods.
k -n "$NAMESPACE" rollout restart daemonset/csi-volmgr statefulset/csi-testplugin deployment/csi-volmgr-csr-approver
k -n "$NAMESPACE" rollout status deployment/csi-volmgr-csr-approver --timeout="$TIMEOUT"
k -n "$NAMESPACE" rollout status daemonset/csi-volmgr --timeout="$TIMEOUT"
k -n "$NAMESPACE" rollout status statefulset/csi-testplugin --timeout="$TIMEOUT"

if [[ "$RUNTIME" == true ]]; then
	# The example runtime runs whatever is bound to the virtual node, and
	# kind's DaemonSets (kube-proxy, the CNI) tolerate every taint: keep them
	# off virtual-kubelet nodes (label type=virtual-kubelet), as
	# virtual-kubelet advises, instead of starting their commands there.
	not_virtual='{"spec":{"template":{"spec":{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"type","operator":"NotIn","values":["virtual-kubelet"]}]}]}}}}}}}'
	for ds in $(k -n kube-system get daemonsets -o name); do
		k -n kube-system patch "$ds" --type=strategic -p "$not_virtual"
	done
fi

log "waiting for the virtual node $VIRTUAL_NODE and its CSINode"
wait_for "Node $VIRTUAL_NODE" 120 k get node "$VIRTUAL_NODE"
k wait --for=condition=Ready "node/$VIRTUAL_NODE" --timeout="$TIMEOUT"
csinode_has_driver() {
	k get csinode "$1" -o jsonpath='{.spec.drivers[*].name}' | grep -qw "$DRIVER"
}
wait_for "$DRIVER in CSINode $VIRTUAL_NODE" 120 csinode_has_driver "$VIRTUAL_NODE"
wait_for "$DRIVER in CSINode $AGENT_HOST" 120 csinode_has_driver "$AGENT_HOST"
k get nodes -o wide
k -n "$NAMESPACE" exec ds/csi-volmgr -- /csi-volmgr drivers
