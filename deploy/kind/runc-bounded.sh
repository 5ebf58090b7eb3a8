#!/usr/bin/env bash
# runc, for a dockerd whose host lacks capabilities: it removes from the
# container's (create, run) or process's (exec) capability sets every
# capability that is not in this process's bounding set, then runs the real
# runc (RUNC, default /usr/sbin/runc) with the same arguments.
#
# Docker 20.10 (Debian 12's docker.io) gives a privileged container every
# capability the kernel knows. Where the machine's own bounding set lacks
# one (here CAP_SYS_RESOURCE), the kernel refuses it and no privileged
# container starts ("unable to apply caps: operation not permitted"); kind
# nodes are privileged containers. Newer container engines (containerd, as
# in the kind nodes) grant privileged containers only the capabilities they
# hold; this does the same for dockerd. deploy/kind/dockerd.sh starts dockerd
# with it as the default runtime when the bounding set is incomplete.
set -euo pipefail
RUNC=${RUNC:-/usr/sbin/runc}

# The capability names by number (linux/capability.h).
names=(CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP
	LINUX_IMMUTABLE NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER
	SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE
	SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP
	MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF
	CHECKPOINT_RESTORE)

bounding=$((16#$(sed -n 's/^CapBnd:[[:space:]]*//p' /proc/self/status)))
missing=()
for i in "${!names[@]}"; do
	if (((bounding >> i & 1) == 0)); then
		missing+=("CAP_${names[i]}")
	fi
done

file='' path=''
prev=''
for a in "$@"; do
	case "$prev" in
	--bundle | -b) file=$a/config.json path=.process.capabilities ;;
	--process | -p) file=$a path=.capabilities ;;
	esac
	case "$a" in
	--bundle=*) file=${a#--bundle=}/config.json path=.process.capabilities ;;
	--process=*) file=${a#--process=} path=.capabilities ;;
	esac
	prev=$a
done

if ((${#missing[@]} > 0)) && [[ -n "$file" && -f "$file" ]]; then
	drop=$(printf '%s\n' "${missing[@]}" | jq -R . | jq -s .)
	tmp=$(mktemp "$file.XXXXXX")
	jq --argjson drop "$drop" \
		"if $path then $path |= with_entries(.value |= map(select(. as \$c | \$drop | index(\$c) | not))) else . end" \
		"$file" >"$tmp"
	mv "$tmp" "$file"
fi
exec "$RUNC" "$@"
