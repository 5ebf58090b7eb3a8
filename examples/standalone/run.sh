#!/usr/bin/env bash
# The standalone demo (make run): the CSI test plugin registers into a demo
# registration directory, csi-volmgr runs in standalone mode on a copy of
# examples/standalone/, the example pod's volume is attached
# (ControllerPublishVolume), staged and published (real bind mounts), and
# `csi-volmgr status` shows it. Ctrl-C removes the pod's manifest, waits
# until the volume is unpublished, unstaged and detached, stops both
# processes and checks that no mount is left behind.
#
# Environment: BIN (where the binaries go, default <repo>/bin), GO (default
# go), LDFLAGS (of the csi-volmgr build), DEMO_HTTP (the agent's --http-endpoint, default 127.0.0.1:9809),
# DEMO_DIR (default: a new directory under /tmp, removed at the end).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
BIN=${BIN:-$repo/bin}
GO=${GO:-go}
http=${DEMO_HTTP:-127.0.0.1:9809}
node=demo-node
driver=testplugin.csi-volmgr.io
timeout=60

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }
die() { printf 'run.sh: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) == 0 ]] || die "the demo mounts volumes and needs root: run it as root (e.g. sudo make run)"

say "Building csi-volmgr, the CSI test plugin and the demo's volume helper into $BIN"
mkdir -p "$BIN"
(
	cd "$repo"
	"$GO" build -ldflags "${LDFLAGS:-}" -o "$BIN/csi-volmgr" ./cmd/csi-volmgr
	"$GO" build -o "$BIN/csi-testplugin" ./test/plugin/cmd/csi-testplugin
	"$GO" build -o "$BIN/demo-createvolume" ./examples/standalone/createvolume
)

# Unix socket paths are limited to 107 bytes: keep the demo directory short.
demo=${DEMO_DIR:-$(mktemp -d /tmp/csi-volmgr-demo.XXXXXX)}
reg=$demo/registry root=$demo/root manifests=$demo/manifests plugin=$demo/plugin
mkdir -p "$reg" "$root" "$manifests" "$plugin"
agent_pid='' plugin_pid='' sleeper='' finished=''

# The client talks to the agent's root-only API socket, $root/csi-volmgr.sock.
status() { "$BIN/csi-volmgr" status --root-dir "$root" "$@"; }
published() { status -o json | grep -q '"state": "Published"'; }
no_volumes() { [[ $(status -o json | tr -d ' \n') == "[]" ]]; }
alive() { [[ -n $1 ]] && kill -0 "$1" 2>/dev/null; }

# wait_for waits up to $timeout seconds for "$@" to succeed; it fails early
# when the agent has exited.
wait_for() {
	local deadline=$((SECONDS + timeout))
	until "$@" >/dev/null 2>&1; do
		if [[ -n $agent_pid ]] && ! alive "$agent_pid"; then
			tail -n 20 "$demo/agent.log" >&2
			echo "run.sh: csi-volmgr exited; the end of its log ($demo/agent.log) is above" >&2
			return 1
		fi
		if ((SECONDS >= deadline)); then
			echo "run.sh: timed out after ${timeout}s waiting for: $*" >&2
			return 1
		fi
		sleep 0.2
	done
}

# stop sends SIGTERM to a process and waits for it to exit.
stop() {
	alive "$1" || return 0
	kill -TERM "$1"
	local deadline=$((SECONDS + timeout))
	while alive "$1"; do
		((SECONDS < deadline)) || { kill -KILL "$1"; break; }
		sleep 0.1
	done
}

# mounts_left prints the mount points at or below the demo directory.
mounts_left() { awk -v d="$demo" '$5 == d || index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo; }

# volume_calls prints the volume calls the plugin answered OK, in order.
volume_calls() {
	grep '"event":"end"' "$plugin/journal.jsonl" 2>/dev/null | grep '"code":"OK"' |
		grep -oE '"method":"(ControllerPublish|NodeStage|NodePublish|NodeUnpublish|NodeUnstage|ControllerUnpublish)Volume"' |
		cut -d'"' -f4 | paste -sd' ' -
}

# detached says whether the plugin answered ControllerUnpublishVolume: the
# agent detaches after the unstage, so the status API no longer shows it.
detached() { volume_calls | grep -q ControllerUnpublishVolume; }

# finish removes the pod, waits for its volume's teardown, stops both
# processes and fails if a mount is left. It runs once, on Ctrl-C or exit.
finish() {
	[[ -z $finished ]] || return 0
	finished=1
	# Tear down whatever happens to the terminal: no early exit, no SIGPIPE.
	set +e
	trap '' INT TERM HUP PIPE
	[[ -z $sleeper ]] || kill "$sleeper" 2>/dev/null || true
	local rc=0
	echo
	if alive "$agent_pid" && [[ -e $manifests/pod.yaml ]]; then
		say "Removing the pod: $manifests/pod.yaml"
		rm -f "$manifests/pod.yaml"
		say "Waiting for NodeUnpublishVolume, NodeUnstageVolume and ControllerUnpublishVolume"
		if wait_for no_volumes && wait_for detached; then
			status
		else
			rc=1
		fi
		say "CSI calls of the demo volume: $(volume_calls)"
	fi
	say "Stopping csi-volmgr and the CSI test plugin"
	stop "$agent_pid"
	stop "$plugin_pid"
	local left
	left=$(mounts_left)
	if [[ -n $left ]]; then
		printf 'run.sh: mounts left behind under %s:\n%s\n' "$demo" "$left" >&2
		return 1
	fi
	say "No mount left under $demo"
	[[ -n ${DEMO_DIR:-} ]] || rm -rf "$demo"
	return "$rc"
}
trap 'rc=$?; finish || rc=1; exit "$rc"' EXIT
trap 'exit 0' INT TERM HUP

# Both run in their own session, so that Ctrl-C reaches this script only:
# the agent keeps running while the pod's volume is torn down.
say "Starting the CSI test plugin ($driver), registering into $reg"
setsid "$BIN/csi-testplugin" --endpoint="$plugin/csi.sock" --state-dir="$plugin/state" \
	--registration-dir="$reg" --node-id="$node" --node-stage-unstage --controller-publish-unpublish \
	--journal="$plugin/journal.jsonl" --v=2 >"$demo/plugin.log" 2>&1 &
plugin_pid=$!
wait_for test -S "$reg/$driver-reg.sock"

handle=$("$BIN/demo-createvolume" --endpoint="$plugin/csi.sock" --name=demo-volume)
say "Created volume $handle on the plugin; writing the manifests into $manifests"
sed "s/VOLUME_HANDLE/$handle/" "$here/volume.yaml" >"$manifests/volume.yaml"
cp "$here/csidriver.yaml" "$manifests/"

say "Starting csi-volmgr in standalone mode (log: $demo/agent.log)"
setsid "$BIN/csi-volmgr" run --manifests="$manifests" --node-name="$node" --root-dir="$root" \
	--registration-dir="$reg" --http-endpoint="$http" >"$demo/agent.log" 2>&1 &
agent_pid=$!
wait_for status

say "Adding the pod: $manifests/pod.yaml"
cp "$here/pod.yaml" "$manifests/"
wait_for published
echo
status
echo
"$BIN/csi-volmgr" drivers --root-dir "$root"
echo
target=$(status -o json | sed -n 's/.*"targetPath": "\(.*\)".*/\1/p' | head -n1)
say "The pod's volume is mounted at $target"
say "CSI calls of the demo volume: $(volume_calls)"
echo
say "Press Ctrl-C to remove the pod, tear its volume down and stop"
while true; do
	sleep 3600 &
	sleeper=$!
	wait "$sleeper" || true
done
