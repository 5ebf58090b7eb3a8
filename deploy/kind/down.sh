#!/usr/bin/env bash
# Deletes the kind cluster that up.sh created.
#
#   make kind-down   (also stops dockerd if deploy/kind/dockerd.sh started it)
set -euo pipefail
cd "$(dirname "$0")/../.."
. deploy/kind/lib.sh

if "$KIND" get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
	log "deleting kind cluster $CLUSTER"
	"$KIND" delete cluster --name "$CLUSTER"
else
	echo "no kind cluster $CLUSTER"
fi
