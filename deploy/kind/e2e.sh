#!/usr/bin/env bash
# End-to-end check under kind (after up.sh): the example pod on the virtual
# node gets its hostpath volume from csi-volmgr, and loses it again when it
# is deleted.
#
#  1. apply deploy/kind/example (StorageClass, PVC, pod);
#  2. wait for the pod condition csi-volmgr.io/VolumesReady=True;
#  3. check the VolumeAttachment, the Node's volumesInUse, the agent's own
#     view (csi-volmgr status, run in the DaemonSet pod) and the mount on
#     the host, by writing through it into the driver's data directory;
#  4. delete the pod and wait until csi-volmgr has torn the volume down and
#     finished the deletion; check that the mount is gone, the volume left
#     volumesInUse and the attach/detach controller detached it;
#  5. delete the PVC and the StorageClass.
#
#   deploy/kind/e2e.sh        (or: make kind-e2e)
set -euo pipefail
cd "$(dirname "$0")/../.."
. deploy/kind/lib.sh
trap 'rc=$?; if ((rc != 0)); then dump; fi' EXIT

POD=csi-volmgr-example
PVC=csi-volmgr-example
PROBE=csi-volmgr-e2e-probe

# The kind node (a Docker container of the same name) the agent runs on.
host=$(k -n "$NAMESPACE" get pods -l app.kubernetes.io/name=csi-volmgr,app.kubernetes.io/component=agent \
	-o jsonpath='{.items[0].spec.nodeName}')
[[ -n "$host" ]] || fail "no csi-volmgr pod"
on_host() { docker exec "$host" "$@"; }
mounted_on_host() { on_host grep -qF " $1 " /proc/self/mountinfo; }

log "1. applying the example workload"
k delete pod "$POD" --ignore-not-found --wait=true --timeout="$TIMEOUT"
"$KUBECTL" kustomize deploy/kind/example | k apply --server-side -f -

log "2. waiting for csi-volmgr.io/VolumesReady=True"
k wait --for=condition=csi-volmgr.io/VolumesReady=True "pod/$POD" --timeout="$TIMEOUT"
uid=$(k get pod "$POD" -o jsonpath='{.metadata.uid}')
node=$(k get pod "$POD" -o jsonpath='{.spec.nodeName}')
[[ "$node" == "$VIRTUAL_NODE" ]] || fail "the pod runs on $node, not on $VIRTUAL_NODE"
pv=$(k get pvc "$PVC" -o jsonpath='{.spec.volumeName}')
handle=$(k get pv "$pv" -o jsonpath='{.spec.csi.volumeHandle}')
target="$ROOT_DIR/pods/$uid/volumes/kubernetes.io~csi/$pv/mount"
echo "pod $uid on $node, PV $pv (handle $handle), target $target on host $host"

log "3. checking attach, volumesInUse, the agent's state and the mount"
attached=$(k get volumeattachments -o jsonpath="{range .items[?(@.spec.source.persistentVolumeName==\"$pv\")]}{.spec.nodeName}={.status.attached}{end}")
[[ "$attached" == "$VIRTUAL_NODE=true" ]] || fail "VolumeAttachment of $pv: got '$attached', want $VIRTUAL_NODE=true"
in_use=$(k get node "$VIRTUAL_NODE" -o jsonpath='{.status.volumesInUse}')
[[ "$in_use" == *"$DRIVER^$handle"* ]] || fail "volumesInUse of $VIRTUAL_NODE is '$in_use', want kubernetes.io/csi/$DRIVER^$handle"
status=$(k -n "$NAMESPACE" exec ds/csi-volmgr -- /csi-volmgr status)
echo "$status"
grep -qF "$uid=Published" <<<"$status" || fail "csi-volmgr status does not show pod $uid Published"
mounted_on_host "$target" || fail "$target is not mounted on host $host"
on_host sh -c "echo csi-volmgr > '$target/$PROBE'"
on_host test -f "/var/lib/csi-hostpath-data/$handle/$PROBE" ||
	fail "a file written through $target is not in the driver's volume /var/lib/csi-hostpath-data/$handle"
on_host rm -f "$target/$PROBE"

log "4. deleting the pod: teardown, then csi-volmgr completes the deletion"
k delete pod "$POD" --wait=false
k wait --for=delete "pod/$POD" --timeout="$TIMEOUT"
! mounted_on_host "$target" || fail "$target is still mounted after the pod was deleted"
not_in_use() { ! k get node "$VIRTUAL_NODE" -o jsonpath='{.status.volumesInUse}' | grep -qF "$handle"; }
wait_for "the volume to leave volumesInUse" 120 not_in_use
detached() { [[ -z "$(k get volumeattachments -o jsonpath="{.items[?(@.spec.source.persistentVolumeName==\"$pv\")].metadata.name}")" ]]; }
wait_for "the attach/detach controller to detach $pv" 180 detached
status=$(k -n "$NAMESPACE" exec ds/csi-volmgr -- /csi-volmgr status)
! grep -qF "$uid" <<<"$status" || fail "csi-volmgr still holds pod $uid: $status"

log "5. cleaning up"
"$KUBECTL" kustomize deploy/kind/example | k delete --ignore-not-found -f -

log "PASS: csi-volmgr published the volume of $POD on $VIRTUAL_NODE and tore it down"
