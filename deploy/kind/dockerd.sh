#!/usr/bin/env bash
# Makes a Docker engine available for the kind targets, and takes away only
# the one it started.
#
#   deploy/kind/dockerd.sh start   # install docker.io if dockerd is missing,
#                                  # start dockerd unless one answers
#   deploy/kind/dockerd.sh stop    # stop dockerd if `start` started it
#
# The machines this project runs on have no init system that manages
# dockerd; `start` runs it in the background with its log and pid file in
# STATE_DIR (default bin/kind/dockerd), and leaves a marker there that `stop`
# reads. A dockerd that was already running is never stopped.
set -euo pipefail
cd "$(dirname "$0")/../.."

STATE_DIR=${DOCKERD_STATE_DIR:-$PWD/bin/kind/dockerd}
MARKER=$STATE_DIR/started-by-csi-volmgr
PIDFILE=$STATE_DIR/dockerd.pid
LOG=$STATE_DIR/dockerd.log
DOCKER=${DOCKER:-docker}

answers() { "$DOCKER" info >/dev/null 2>&1; }

# full_bounding_set tells whether this process may hold every capability
# the kernel knows, as Docker 20.10 gives privileged containers.
full_bounding_set() {
	local last bounding
	last=$(cat /proc/sys/kernel/cap_last_cap)
	bounding=$((16#$(sed -n 's/^CapBnd:[[:space:]]*//p' /proc/self/status)))
	((bounding == (1 << (last + 1)) - 1))
}

start() {
	if answers; then
		echo "dockerd is running"
		return
	fi
	if ! command -v dockerd >/dev/null; then
		echo "installing Debian's docker.io"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
	fi
	mkdir -p "$STATE_DIR"
	local args=(--pidfile="$PIDFILE")
	if ! full_bounding_set; then
		# Privileged containers (kind nodes) need a runtime that leaves out
		# the capabilities this machine does not have; see runc-bounded.sh.
		command -v jq >/dev/null || {
			apt-get update -qq
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq jq >/dev/null
		}
		echo "the capability bounding set lacks some capabilities: runtime deploy/kind/runc-bounded.sh"
		args+=(--add-runtime "runc-bounded=$PWD/deploy/kind/runc-bounded.sh" --default-runtime runc-bounded)
	fi
	echo "starting dockerd (log: $LOG)"
	# setsid: the engine outlives this make target; `stop` ends it.
	setsid dockerd "${args[@]}" >"$LOG" 2>&1 </dev/null &
	echo $! >"$MARKER"
	for _ in $(seq 60); do
		if answers; then
			"$DOCKER" info --format 'dockerd {{.ServerVersion}}: storage {{.Driver}}, cgroup {{.CgroupDriver}} v{{.CgroupVersion}}'
			return
		fi
		if ! kill -0 "$(cat "$MARKER")" 2>/dev/null; then
			rm -f "$MARKER"
			tail -n 20 "$LOG" >&2
			echo "dockerd exited; log: $LOG" >&2
			exit 1
		fi
		sleep 1
	done
	echo "dockerd did not answer within 60s; log: $LOG" >&2
	exit 1
}

stop() {
	if [[ ! -f "$MARKER" ]]; then
		echo "dockerd was not started by deploy/kind/dockerd.sh; leaving it alone"
		return
	fi
	local pid
	pid=$(cat "$MARKER")
	if kill -0 "$pid" 2>/dev/null; then
		echo "stopping dockerd (pid $pid)"
		kill -TERM "$pid"
		for _ in $(seq 60); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 1
		done
		if kill -0 "$pid" 2>/dev/null; then
			echo "dockerd (pid $pid) did not stop within 60s" >&2
			exit 1
		fi
	fi
	rm -f "$MARKER"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
*)
	echo "usage: $0 start|stop" >&2
	exit 2
	;;
esac
