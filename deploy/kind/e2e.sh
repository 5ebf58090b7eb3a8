#!/usr/bin/env bash
# End-to-end check under kind (after up.sh): two pods of one StorageClass,
# one on the virtual node csi-volmgr-<host>, whose volume csi-volmgr stages
# and publishes, and one on the kind worker next to it, whose kubelet does;
# both volumes come from the CSI test plugin through the real
# external-provisioner, attach/detach controller and external-attacher.
#
#  0. the agent's identity: its ServiceAccount's one CSR was approved by
#     csi-volmgr-csr-approver and signed, the ServiceAccount can do nothing
#     but ask for it, and the agent, as system:node:<virtual node>, is held
#     to its own Node's objects;
#  1. apply deploy/kind/example (StorageClass, two PVCs, two pods);
#  2. wait for the pod condition csi-volmgr.io/VolumesReady=True of the
#     virtual node's pod, and for the kubelet node's pod to be Ready;
#  3. virtual node: check the VolumeAttachment (attached by csi-attacher's
#     ControllerPublishVolume, with the plugin's publish_context), the Node's
#     volumesInUse, the agent's own view (csi-volmgr status, run in the
#     DaemonSet pod), the staging and publish mounts on the kind node, and
#     write through the mount into the plugin's volume;
#  4. kubelet node: check its VolumeAttachment, its mount and the file its
#     container wrote through it;
#  5. delete both pods: csi-volmgr tears the volume down and finishes the
#     deletion, the mounts are gone, the volumes leave volumesInUse and the
#     attach/detach controller and csi-attacher detach them;
#  6. delete the claims: csi-provisioner deletes the volumes, which the
#     plugin allows only once they are unpublished, unstaged and detached.
#
#   deploy/kind/e2e.sh        (or: make kind-e2e)
set -euo pipefail
cd "$(dirname "$0")/../.."
. deploy/kind/lib.sh
trap 'rc=$?; if ((rc != 0)); then dump; fi' EXIT

POD=csi-volmgr-example
PVC=csi-volmgr-example
KPOD=csi-volmgr-example-kubelet
KPVC=csi-volmgr-example-kubelet
PROBE=csi-volmgr-e2e-probe
# Where the plugin keeps a volume: <state-dir>/volumes/<volume ID>.
VOLUMES=/var/lib/csi-testplugin/volumes
KUBELET_DIR=/var/lib/kubelet

# The kind node (a Docker container of the same name) the agent runs on.
host=$(k -n "$NAMESPACE" get pods -l app.kubernetes.io/name=csi-volmgr,app.kubernetes.io/component=agent \
	-o jsonpath='{.items[0].spec.nodeName}')
[[ -n "$host" ]] || fail "no csi-volmgr pod"
on_host() { docker exec "$host" "$@"; }
mounted_on_host() { on_host grep -qF " $1 " /proc/self/mountinfo; }
# attachment PV: "<node>=<attached> <devicePath>" of the PV's VolumeAttachments.
# Fails when the API server does not answer, so that no answer never reads
# as "detached".
attachment() {
	local out
	out=$(k get volumeattachments -o jsonpath="{range .items[?(@.spec.source.persistentVolumeName==\"$1\")]}{.spec.nodeName}={.status.attached} {.status.attachmentMetadata.devicePath}{end}") || return 1
	printf '%s' "$out"
}

log "0. the agent acts as system:node:$VIRTUAL_NODE"
agent_sa=system:serviceaccount:$NAMESPACE:csi-volmgr
issued=$(k get csr -o jsonpath="{range .items[?(@.spec.username==\"$agent_sa\")]}{.status.conditions[?(@.type==\"Approved\")].reason} {.status.certificate}{\"\\n\"}{end}" |
	awk '$1 == "CSIVolmgrApprove" && $2 != "" {n++} END {print n + 0}')
((issued >= 1)) || fail "no CSR of $agent_sa approved by csi-volmgr-csr-approver (reason CSIVolmgrApprove) and signed"
# can_i prints kubectl auth can-i's yes or no (its exit code is 1 for no).
can_i() { k auth can-i "$@" 2>/dev/null || true; }
[[ "$(can_i create certificatesigningrequests --as="$agent_sa")" == yes ]] ||
	fail "$agent_sa may not create the CSR of its Node's certificate"
for denied in "create serviceaccounts --subresource=token -n kube-system" "get secrets -n kube-system" \
	"create certificatesigningrequests --subresource=nodeclient" "patch nodes" "delete pods -n default" \
	"update leases -n kube-node-lease"; do
	# shellcheck disable=SC2086 # the words are kubectl's arguments
	[[ "$(can_i $denied --as="$agent_sa")" == no ]] || fail "$agent_sa may $denied"
done
as_node=(--as="system:node:$VIRTUAL_NODE" --as-group=system:nodes)
[[ "$(can_i get "node/$VIRTUAL_NODE" "${as_node[@]}")" == yes ]] || fail "system:node:$VIRTUAL_NODE may not read its own Node"
for denied in "get node/$AGENT_HOST" "get secrets -n kube-system" "create serviceaccounts --subresource=token -n kube-system" \
	"update lease/$AGENT_HOST -n kube-node-lease" "list pods -A"; do
	# shellcheck disable=SC2086 # the words are kubectl's arguments
	[[ "$(can_i $denied "${as_node[@]}")" == no ]] || fail "system:node:$VIRTUAL_NODE may $denied"
done

log "1. applying the example workloads"
k delete pod "$POD" "$KPOD" --ignore-not-found --wait=true --timeout="$TIMEOUT"
"$KUBECTL" kustomize deploy/kind/example | k apply --server-side -f -

log "2. waiting for csi-volmgr.io/VolumesReady=True on $VIRTUAL_NODE and Ready on $host"
k wait --for=condition=csi-volmgr.io/VolumesReady=True "pod/$POD" --timeout="$TIMEOUT"
k wait --for=condition=Ready "pod/$KPOD" --timeout="$TIMEOUT"

log "3. virtual node: attach, volumesInUse, the agent's state, the mounts"
uid=$(k get pod "$POD" -o jsonpath='{.metadata.uid}')
node=$(k get pod "$POD" -o jsonpath='{.spec.nodeName}')
[[ "$node" == "$VIRTUAL_NODE" ]] || fail "the pod runs on $node, not on $VIRTUAL_NODE"
pv=$(k get pvc "$PVC" -o jsonpath='{.spec.volumeName}')
handle=$(k get pv "$pv" -o jsonpath='{.spec.csi.volumeHandle}')
target="$ROOT_DIR/pods/$uid/volumes/kubernetes.io~csi/$pv/mount"
echo "pod $uid on $node, PV $pv (handle $handle), target $target on host $host"
attached=$(attachment "$pv") || fail "listing VolumeAttachments"
[[ "$attached" == "$VIRTUAL_NODE=true $VOLUMES/$handle" ]] ||
	fail "VolumeAttachment of $pv: got '$attached', want $VIRTUAL_NODE=true with the plugin's devicePath $VOLUMES/$handle"
in_use=$(k get node "$VIRTUAL_NODE" -o jsonpath='{.status.volumesInUse}')
[[ "$in_use" == *"kubernetes.io/csi/$DRIVER^$handle"* ]] ||
	fail "volumesInUse of $VIRTUAL_NODE is '$in_use', want kubernetes.io/csi/$DRIVER^$handle"
podns=$(k get pod "$POD" -o jsonpath='{.metadata.namespace}')
status=$(k -n "$NAMESPACE" exec ds/csi-volmgr -- /csi-volmgr status)
echo "$status"
grep -qF "$podns/$POD=Published" <<<"$status" || fail "csi-volmgr status does not show pod $podns/$POD Published"
k -n "$NAMESPACE" exec ds/csi-volmgr -- /csi-volmgr status -o json | grep -qF "$uid" ||
	fail "csi-volmgr status -o json does not show pod $uid"
staged=$(on_host grep -cF " $ROOT_DIR/plugins/kubernetes.io/csi/$DRIVER/" /proc/self/mountinfo || true)
((staged >= 1)) || fail "no staging mount of $DRIVER below $ROOT_DIR/plugins on host $host"
mounted_on_host "$target" || fail "$target is not mounted on host $host"
on_host sh -c "echo csi-volmgr > '$target/$PROBE'"
on_host test -f "$VOLUMES/$handle/$PROBE" ||
	fail "a file written through $target is not in the plugin's volume $VOLUMES/$handle"
on_host rm -f "$target/$PROBE"

# With the example runtime (KIND_OVERLAY=deploy/kind/runtime) the pod's
# container runs once VolumesReady is True, with the published path as its
# /data: wait for Ready and check the file it wrote through its mount, as
# step 4 does for the kubelet's pod. With the bare agent nothing runs the
# container: the pod stays Pending, and this run says so instead of
# claiming it.
if [[ "$RUNTIME" == true ]]; then
	k wait --for=condition=Ready "pod/$POD" --timeout="$TIMEOUT"
	wait_for "the container's write through its mount" 60 on_host test -f "$VOLUMES/$handle/probe"
	written=$(on_host cat "$VOLUMES/$handle/probe")
	[[ "$written" == written-by-the-pod ]] || fail "the virtual node's pod's file in $VOLUMES/$handle holds '$written'"
	ran="ran its container, which wrote through the mount"
else
	phase=$(k get pod "$POD" -o jsonpath='{.status.phase}')
	echo "pod $POD is $phase: no runtime serves $VIRTUAL_NODE (KIND_OVERLAY=$OVERLAY; not checked: Running, the container's writes)"
	ran="did not run its container: no runtime"
fi

log "4. kubelet node: attach, the mount, the container's write"
kuid=$(k get pod "$KPOD" -o jsonpath='{.metadata.uid}')
knode=$(k get pod "$KPOD" -o jsonpath='{.spec.nodeName}')
kpv=$(k get pvc "$KPVC" -o jsonpath='{.spec.volumeName}')
khandle=$(k get pv "$kpv" -o jsonpath='{.spec.csi.volumeHandle}')
sc=$(k get pv "$pv" "$kpv" -o jsonpath='{.items[*].spec.storageClassName}')
[[ "$sc" == "csi-volmgr-testplugin csi-volmgr-testplugin" ]] || fail "the PVs' StorageClasses are '$sc'"
ktarget="$KUBELET_DIR/pods/$kuid/volumes/kubernetes.io~csi/$kpv/mount"
echo "pod $kuid on $knode, PV $kpv (handle $khandle), target $ktarget"
[[ "$knode" == "$host" ]] || fail "the kubelet's pod runs on $knode, not on $host"
attached=$(attachment "$kpv") || fail "listing VolumeAttachments"
[[ "$attached" == "$knode=true $VOLUMES/$khandle" ]] ||
	fail "VolumeAttachment of $kpv: got '$attached', want $knode=true with devicePath $VOLUMES/$khandle"
mounted_on_host "$ktarget" || fail "$ktarget is not mounted on host $host"
written=$(on_host cat "$VOLUMES/$khandle/probe")
[[ "$written" == written-by-the-pod ]] || fail "the pod's file in $VOLUMES/$khandle holds '$written'"

log "5. deleting both pods: teardown, detach; csi-volmgr (or the example runtime) completes its pod's deletion"
k delete pod "$POD" "$KPOD" --wait=false
k wait --for=delete "pod/$POD" "pod/$KPOD" --timeout="$TIMEOUT"
! mounted_on_host "$target" || fail "$target is still mounted after the pod was deleted"
! mounted_on_host "$ktarget" || fail "$ktarget is still mounted after the pod was deleted"
not_in_use() {
	local in_use
	in_use=$(k get node "$VIRTUAL_NODE" -o jsonpath='{.status.volumesInUse}') || return 1
	! grep -qF "$handle" <<<"$in_use"
}
wait_for "the volume to leave volumesInUse" 120 not_in_use
detached() {
	local a
	a=$(attachment "$1") || return 1
	[[ -z "$a" ]]
}
wait_for "the attach/detach controller and csi-attacher to detach $pv" 180 detached "$pv"
wait_for "the attach/detach controller and csi-attacher to detach $kpv" 180 detached "$kpv"
unstaged() { ! on_host grep -qF " $ROOT_DIR/plugins/kubernetes.io/csi/$DRIVER/" /proc/self/mountinfo; }
unstaged || fail "a staging mount of $DRIVER is left below $ROOT_DIR/plugins"
status=$(k -n "$NAMESPACE" exec ds/csi-volmgr -- /csi-volmgr status -o json)
! grep -qF "$uid" <<<"$status" || fail "csi-volmgr still holds pod $uid: $status"

log "6. deleting the claims: the plugin deletes the volumes"
"$KUBECTL" kustomize deploy/kind/example | k delete --ignore-not-found -f -
# gone PV: the API server answers that PV does not exist (no answer is not
# "gone").
gone() {
	local out
	if out=$(k get pv "$1" 2>&1); then
		return 1
	fi
	grep -q NotFound <<<"$out"
}
wait_for "PV $pv to be deleted" 120 gone "$pv"
wait_for "PV $kpv to be deleted" 120 gone "$kpv"
! on_host test -e "$VOLUMES/$handle" || fail "the plugin kept the volume $VOLUMES/$handle"

log "PASS: one StorageClass, two nodes: csi-volmgr served $POD on $VIRTUAL_NODE ($OVERLAY $ran), the kubelet $KPOD on $host; both torn down and detached"
