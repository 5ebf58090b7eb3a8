#!/usr/bin/env bash
# Builds the kind node image, and the images deployed under kind, from Go
# modules and Debian packages only: no image registry is reachable here.
#
#   deploy/kind/image/build.sh node      # the node image (KIND_NODE_IMAGE)
#   deploy/kind/image/build.sh deploy-images  # external-attacher, external-provisioner, a shell
#   deploy/kind/image/build.sh kind      # only the kind CLI; prints its path
#   deploy/kind/image/build.sh step FN   # one step (a function below)
#
# Every step is cached under OUT (default bin/kind) and in Docker, keyed by
# its inputs, and skipped when they did not change; README.md in this folder
# explains the steps. Needs: root, go, gcc, apt-get (it installs
# debootstrap, jq and libseccomp-dev when missing), a running Docker engine
# (deploy/kind/dockerd.sh start).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
# shellcheck source=deploy/kind/image/versions.sh
. "$HERE/versions.sh"

OUT=${OUT:-$ROOT/bin/kind}
GO=${GO:-go}
DOCKER=${DOCKER:-docker}
KIND_NODE_IMAGE=${KIND_NODE_IMAGE:-csi-volmgr-kind/node:$KUBERNETES_VERSION}
ARCH=amd64
mkdir -p "$OUT"

log() { printf '\n=== %s\n' "$*" >&2; }

# hash_of ARGS...: a short hash of the named files' contents and of the
# other arguments (versions, image IDs).
hash_of() {
	local a
	for a in "$@"; do
		if [[ -f "$a" ]]; then
			sha256sum <"$a"
		else
			printf '%s\n' "$a"
		fi
	done | sha256sum | cut -c1-12
}

have_image() { "$DOCKER" image inspect "$1" >/dev/null 2>&1; }
# untag_others IMAGE: removes the other tags of IMAGE's repository, earlier
# builds keyed by other inputs.
untag_others() {
	"$DOCKER" images --format '{{.Repository}}:{{.Tag}}' "${1%:*}" | grep -vxF "$1" |
		xargs -r "$DOCKER" rmi >/dev/null 2>&1 || true
}
image_id() { "$DOCKER" image inspect -f '{{.Id}}' "$1"; }

# need FILE PACKAGE: installs Debian's PACKAGE unless FILE (a command or a
# path) is there.
need() {
	if command -v "$1" >/dev/null || [[ -e "$1" ]]; then
		return
	fi
	log "installing Debian's $2"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
}

# --- Go programs ----------------------------------------------------------

# go_install DIR ENV... -- PACKAGE@VERSION...: `go install` of released
# modules whose go.mod has no replace directives, with their own go.sum.
go_install() {
	local dir=$1
	shift
	local env=()
	while [[ $1 != -- ]]; do
		env+=("$1")
		shift
	done
	shift
	if [[ -f "$dir/.done" ]]; then
		return
	fi
	log "go install $*"
	rm -rf "$dir"
	mkdir -p "$dir"
	env "${env[@]}" GOBIN="$dir" GOFLAGS=-mod=mod "$GO" install "$@"
	touch "$dir/.done"
}

# go_build_module DIR MODULE VERSION LDFLAGS PACKAGE...: builds packages of a
# released module as its own main module (with its go.mod, go.sum and
# replace directives), as `git checkout VERSION && go build` would.
go_build_module() {
	local dir=$1 module=$2 version=$3 ldflags=$4
	shift 4
	if [[ -f "$dir/.done" ]]; then
		return
	fi
	log "go build $module@$version $*"
	local src
	src=$("$GO" mod download -json "$module@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	[[ -d "$src" ]] || {
		echo "go mod download $module@$version gave no directory" >&2
		exit 1
	}
	rm -rf "$dir"
	mkdir -p "$dir"
	(cd "$src" && CGO_ENABLED=0 GOFLAGS=-mod=mod "$GO" build -ldflags "$ldflags" -o "$dir/" "$@")
	touch "$dir/.done"
}

# k8s_binaries: kubelet, kubeadm, kubectl, the control plane, kube-proxy and
# etcd from the tools module, with the version stamps of a release build, and
# nodecni (the kindnetd stand-in).
K8S_OUT=$OUT/k8s
k8s_binaries() {
	local key
	key=$(hash_of "$HERE/versions.sh" "$HERE/tools/go.mod" "$HERE/tools/go.sum" "$HERE"/tools/nodecni/*.go)
	if [[ "$(cat "$K8S_OUT/.done" 2>/dev/null)" == "$key" ]]; then
		return
	fi
	log "building Kubernetes $KUBERNETES_VERSION, etcd $ETCD_VERSION and nodecni (long the first time)"
	local v=$KUBERNETES_VERSION minor ld="-s -w" p
	minor=${v#v1.}
	minor=${minor%%.*}
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ld+=" -X $p.gitVersion=$v -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
		ld+=" -X $p.buildDate=1970-01-01T00:00:00Z"
	done
	ld+=" -X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION"
	mkdir -p "$K8S_OUT"
	(cd "$HERE/tools" && CGO_ENABLED=0 "$GO" build -ldflags "$ld" -o "$K8S_OUT/" \
		k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubeadm k8s.io/kubernetes/cmd/kubectl \
		k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
		k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-proxy \
		go.etcd.io/etcd/server/v3 ./nodecni)
	mv "$K8S_OUT/server" "$K8S_OUT/etcd"
	echo "$key" >"$K8S_OUT/.done"
}

GOB=$OUT/go
runtime_binaries() {
	go_install "$GOB/containerd-$CONTAINERD_VERSION" CGO_ENABLED=0 -- \
		-tags 'no_btrfs no_devmapper no_zfs' \
		-ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
		"github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
		"github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION" \
		"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION"
	# runc needs cgo (nsenter) and libseccomp (Debian's libseccomp-dev here,
	# libseccomp2 on the node).
	need /usr/include/seccomp.h libseccomp-dev
	go_install "$GOB/runc-$RUNC_VERSION" CGO_ENABLED=1 -- -tags seccomp \
		-ldflags "-X main.version=${RUNC_VERSION#v}" "github.com/opencontainers/runc@$RUNC_VERSION"
	go_install "$GOB/crictl-$CRICTL_VERSION" CGO_ENABLED=0 -- -ldflags "-s -w" \
		"sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
	go_install "$GOB/cni-plugins-$CNI_PLUGINS_VERSION" CGO_ENABLED=0 -- -ldflags "-s -w" \
		"github.com/containernetworking/plugins/plugins/ipam/host-local@$CNI_PLUGINS_VERSION" \
		"github.com/containernetworking/plugins/plugins/main/loopback@$CNI_PLUGINS_VERSION" \
		"github.com/containernetworking/plugins/plugins/main/ptp@$CNI_PLUGINS_VERSION" \
		"github.com/containernetworking/plugins/plugins/meta/portmap@$CNI_PLUGINS_VERSION"
}

addon_binaries() {
	go_install "$GOB/coredns-$COREDNS_VERSION" CGO_ENABLED=0 -- -ldflags "-s -w" \
		"github.com/coredns/coredns@$COREDNS_VERSION"
	go_install "$GOB/local-path-provisioner-$LOCAL_PATH_PROVISIONER_VERSION" CGO_ENABLED=0 -- -ldflags "-s -w" \
		"github.com/rancher/local-path-provisioner@$LOCAL_PATH_PROVISIONER_VERSION"
	# The pause container: k8s.io/kubernetes's build/pause, a static C program.
	local pause=$OUT/pause-$PAUSE_VERSION/pause
	if [[ ! -x "$pause" ]]; then
		log "building pause $PAUSE_VERSION"
		local src
		src=$("$GO" mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
		mkdir -p "$(dirname "$pause")"
		gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_VERSION" -o "$pause.tmp" "$src/build/pause/linux/pause.c"
		mv "$pause.tmp" "$pause"
	fi
}

KIND_BIN=$GOB/kind-$KIND_VERSION/kind
kind_cli() {
	go_install "$GOB/kind-$KIND_VERSION" CGO_ENABLED=0 -- "sigs.k8s.io/kind@$KIND_VERSION"
}

# --- Root file systems ----------------------------------------------------

# debian_image: a minimal Debian from debootstrap, imported into Docker. The
# base of the node image and of the images that need a shell or iptables.
DEBIAN_IMAGE=csi-volmgr-kind/debian:$DEBIAN_SUITE-minbase
debian_image() {
	if have_image "$DEBIAN_IMAGE"; then
		return
	fi
	local dir=$OUT/rootfs/$DEBIAN_SUITE-minbase
	if [[ ! -f "$dir.done" ]]; then
		need debootstrap debootstrap
		log "debootstrap --variant=minbase $DEBIAN_SUITE"
		rm -rf "$dir"
		mkdir -p "$(dirname "$dir")"
		debootstrap --variant=minbase --arch="$ARCH" "$DEBIAN_SUITE" "$dir" "$DEBIAN_MIRROR" >"$dir.log"
		touch "$dir.done"
	fi
	log "importing $DEBIAN_IMAGE"
	tar -C "$dir" --numeric-owner -c . | "$DOCKER" import \
		--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
		--change 'CMD ["/bin/bash"]' - "$DEBIAN_IMAGE" >/dev/null
}

# docker_build IMAGE CONTEXT DOCKERFILE [BUILD-ARGS...]: the classic
# builder (no BuildKit, which Debian's docker.io does not bring).
docker_build() {
	local image=$1 context=$2 dockerfile=$3
	shift 3
	DOCKER_BUILDKIT=0 "$DOCKER" build -q -t "$image" -f "$dockerfile" "$@" "$context" >/dev/null
}

# squash SOURCE TARGET CHANGES...: one layer, as kind's base image is.
squash() {
	local src=$1 dst=$2
	shift 2
	local cid changes=()
	for c in "$@"; do changes+=(--change "$c"); done
	cid=$("$DOCKER" create "$src")
	local rc=0
	"$DOCKER" export "$cid" | "$DOCKER" import "${changes[@]}" - "$dst" >/dev/null || rc=$?
	"$DOCKER" rm "$cid" >/dev/null
	return "$rc"
}

# base_image: kind's images/base, with our Debian and runtime binaries: kind's
# own files (entrypoint, systemd units, containerd configuration) from the
# sigs.k8s.io/kind module, the packages its Dockerfile installs.
base_image() {
	runtime_binaries
	local kind_src key
	kind_src=$("$GO" mod download -json "sigs.k8s.io/kind@$KIND_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	key=$(hash_of "$HERE/versions.sh" "$HERE/base/Dockerfile" "$(image_id "$DEBIAN_IMAGE")" \
		"$GOB/containerd-$CONTAINERD_VERSION" "$GOB/runc-$RUNC_VERSION" "$GOB/crictl-$CRICTL_VERSION" \
		"$GOB/cni-plugins-$CNI_PLUGINS_VERSION")
	BASE_IMAGE=csi-volmgr-kind/base:$key
	if have_image "$BASE_IMAGE"; then
		return
	fi
	log "building the node base image $BASE_IMAGE"
	local ctx=$OUT/stage/base
	rm -rf "$ctx"
	mkdir -p "$OUT/stage/empty" "$ctx/bin/usr/local/bin" "$ctx/bin/usr/local/sbin" "$ctx/bin/opt/cni/bin"
	cp -r "$kind_src/images/base/files" "$ctx/files"
	chmod -R u+w,go-w "$ctx/files"
	find "$ctx/files" -type f -exec chmod 0644 {} +
	find "$ctx/files" -type d -exec chmod 0755 {} +
	chmod 0755 "$ctx"/files/usr/local/bin/* "$ctx"/files/kind/bin/*
	cp "$GOB/containerd-$CONTAINERD_VERSION"/{containerd,ctr,containerd-shim-runc-v2} "$ctx/bin/usr/local/bin/"
	cp "$GOB/crictl-$CRICTL_VERSION/crictl" "$ctx/bin/usr/local/bin/"
	cp "$GOB/runc-$RUNC_VERSION/runc" "$ctx/bin/usr/local/sbin/"
	cp "$GOB/cni-plugins-$CNI_PLUGINS_VERSION"/{host-local,loopback,ptp,portmap} "$ctx/bin/opt/cni/bin/"
	docker_build "$BASE_IMAGE-build" "$ctx" "$HERE/base/Dockerfile" --build-arg "DEBIAN_IMAGE=$DEBIAN_IMAGE" \
		--build-arg "PAUSE_IMAGE=registry.k8s.io/pause:$PAUSE_VERSION"
	squash "$BASE_IMAGE-build" "$BASE_IMAGE-squashed" 'ENV container=docker' \
		'ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]'
	# `docker import` of Docker 20.10 takes no STOPSIGNAL; a build adds it
	# without a layer. systemd exits on SIGRTMIN+3, not on SIGTERM.
	printf 'FROM %s\nSTOPSIGNAL SIGRTMIN+3\n' "$BASE_IMAGE-squashed" >"$ctx/Dockerfile.stopsignal"
	docker_build "$BASE_IMAGE" "$OUT/stage/empty" "$ctx/Dockerfile.stopsignal"
	"$DOCKER" rmi "$BASE_IMAGE-build" "$BASE_IMAGE-squashed" >/dev/null
	untag_others "$BASE_IMAGE"
}

# tools_image: Debian with iptables, nftables and conntrack, for kube-proxy,
# and a shell for local-path-provisioner's helper pods.
tools_image() {
	local key
	key=$(hash_of "$HERE/tools.Dockerfile" "$(image_id "$DEBIAN_IMAGE")")
	TOOLS_IMAGE=csi-volmgr-kind/debian-tools:$key
	if ! have_image "$TOOLS_IMAGE"; then
		log "building $TOOLS_IMAGE"
		mkdir -p "$OUT/stage/empty"
		docker_build "$TOOLS_IMAGE" "$OUT/stage/empty" "$HERE/tools.Dockerfile" --build-arg "DEBIAN_IMAGE=$DEBIAN_IMAGE"
		untag_others "$TOOLS_IMAGE"
	fi
}

# image_from NAME BASE ENTRYPOINT-JSON FILE=PATH...: an image of BASE
# ("scratch" for none) plus files, as one imported layer on top.
image_from() {
	local name=$1 base=$2 entrypoint=$3
	shift 3
	local key stamp spec srcs=()
	for spec in "$@"; do srcs+=("${spec%%=*}" "${spec#*=}"); done
	key=$(hash_of "$base" "$([[ $base == scratch ]] || image_id "$base")" "$entrypoint" "${srcs[@]}")
	stamp=$OUT/images/$(tr '/:' '__' <<<"$name").key
	if have_image "$name" && [[ "$(cat "$stamp" 2>/dev/null)" == "$key $(image_id "$name")" ]]; then
		return
	fi
	log "image $name"
	local ctx=$OUT/stage/image
	rm -rf "$ctx"
	mkdir -p "$ctx/root"
	for spec in "$@"; do
		local src=${spec%%=*} dst=${spec#*=}
		mkdir -p "$ctx/root$(dirname "$dst")"
		cp "$src" "$ctx/root$dst"
	done
	if [[ "$base" == scratch ]]; then
		tar -C "$ctx/root" --numeric-owner --owner=0 --group=0 -c . | "$DOCKER" import \
			--change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
			--change "ENTRYPOINT $entrypoint" - "$name" >/dev/null
	else
		printf 'FROM %s\nCOPY root/ /\nENTRYPOINT %s\n' "$base" "$entrypoint" >"$ctx/Dockerfile"
		docker_build "$name" "$ctx" "$ctx/Dockerfile"
	fi
	mkdir -p "$(dirname "$stamp")"
	echo "$key $(image_id "$name")" >"$stamp"
}

# component_images: the control plane, kube-proxy, etcd, CoreDNS, pause,
# and kind's CNI and storage images, under the names kubeadm and kind use.
component_images() {
	local k=$K8S_OUT v=$KUBERNETES_VERSION c
	for c in kube-apiserver kube-controller-manager kube-scheduler; do
		image_from "registry.k8s.io/$c-$ARCH:$v" scratch "[\"/usr/local/bin/$c\"]" "$k/$c=/usr/local/bin/$c"
	done
	tools_image
	image_from "registry.k8s.io/kube-proxy-$ARCH:$v" "$TOOLS_IMAGE" '["/usr/local/bin/kube-proxy"]' \
		"$k/kube-proxy=/usr/local/bin/kube-proxy"
	image_from "registry.k8s.io/etcd:$ETCD_IMAGE_TAG" scratch '["/usr/local/bin/etcd"]' "$k/etcd=/usr/local/bin/etcd"
	image_from "registry.k8s.io/coredns/coredns:$COREDNS_VERSION" scratch '["/coredns"]' \
		"$GOB/coredns-$COREDNS_VERSION/coredns=/coredns"
	image_from "registry.k8s.io/pause:$PAUSE_VERSION" scratch '["/pause"]' "$OUT/pause-$PAUSE_VERSION/pause=/pause"
	image_from "$KINDNETD_IMAGE" scratch '["/bin/kindnetd"]' "$k/nodecni=/bin/kindnetd"
	image_from "$LOCAL_PATH_PROVISIONER_IMAGE" scratch '["/usr/local/bin/local-path-provisioner"]' \
		"$GOB/local-path-provisioner-$LOCAL_PATH_PROVISIONER_VERSION/local-path-provisioner=/usr/local/bin/local-path-provisioner"
	"$DOCKER" tag "$TOOLS_IMAGE" "$LOCAL_PATH_HELPER_IMAGE"
}

# archive OUTPUT IMAGE...: a docker image archive whose "repositories" entry
# comes first. kind's builder reads the image names of an archive from the
# first of "repositories" and "manifest.json" it meets, and the latter names
# only the first image: this way it learns all of them, and pulls none.
archive() {
	local out=$1
	shift
	local dir=$OUT/stage/archive
	need jq jq
	rm -rf "$dir"
	mkdir -p "$dir"
	"$DOCKER" save "$@" | tar -C "$dir" -x
	# Docker writes Docker Hub names short (kindest/kindnetd); the builder
	# compares them with the full names kind's manifests use
	# (docker.io/kindest/kindnetd). containerd reads manifest.json, and
	# expands the short names there itself.
	jq 'with_entries(.key |= (if (split("/")[0] | test("[.:]") or . == "localhost") then .
		elif (contains("/")) then "docker.io/" + . else "docker.io/library/" + . end))' \
		"$dir/repositories" >"$dir/repositories.full"
	mv "$dir/repositories.full" "$dir/repositories"
	local entries=() e
	for e in "$dir"/*; do
		[[ "${e##*/}" == repositories ]] || entries+=("${e##*/}")
	done
	(cd "$dir" && tar --numeric-owner -cf "$out" repositories "${entries[@]}")
}

# server_tarball: what kind's `--type file` builder takes, laid out as a
# kubernetes-server-linux-amd64.tar.gz release: kubernetes/version and
# kubernetes/server/bin with kubeadm, kubelet, kubectl and the image
# archives. kube-apiserver.tar also carries the images kind would otherwise
# pull: etcd, CoreDNS, pause, kindnetd and local-path-provisioner.
server_tarball() {
	local dir=$OUT/stage/server
	rm -rf "$dir"
	mkdir -p "$dir/kubernetes/server/bin"
	local bin=$dir/kubernetes/server/bin v=$KUBERNETES_VERSION
	echo "$v" >"$dir/kubernetes/version"
	cp "$K8S_OUT"/{kubeadm,kubelet,kubectl} "$bin/"
	archive "$bin/kube-apiserver.tar" "registry.k8s.io/kube-apiserver-$ARCH:$v" \
		"registry.k8s.io/etcd:$ETCD_IMAGE_TAG" "registry.k8s.io/coredns/coredns:$COREDNS_VERSION" \
		"registry.k8s.io/pause:$PAUSE_VERSION" "$KINDNETD_IMAGE" \
		"$LOCAL_PATH_PROVISIONER_IMAGE" "$LOCAL_PATH_HELPER_IMAGE"
	local c
	for c in kube-controller-manager kube-scheduler kube-proxy; do
		archive "$bin/$c.tar" "registry.k8s.io/$c-$ARCH:$v"
	done
	tar -C "$dir" -czf "$SERVER_TARBALL" kubernetes
	rm -rf "$dir"
}

node_image() {
	k8s_binaries
	addon_binaries
	kind_cli
	debian_image
	base_image
	component_images
	local key ids=() i
	for i in "registry.k8s.io/kube-apiserver-$ARCH:$KUBERNETES_VERSION" \
		"registry.k8s.io/kube-controller-manager-$ARCH:$KUBERNETES_VERSION" \
		"registry.k8s.io/kube-scheduler-$ARCH:$KUBERNETES_VERSION" \
		"registry.k8s.io/kube-proxy-$ARCH:$KUBERNETES_VERSION" "registry.k8s.io/etcd:$ETCD_IMAGE_TAG" \
		"registry.k8s.io/coredns/coredns:$COREDNS_VERSION" "registry.k8s.io/pause:$PAUSE_VERSION" \
		"$KINDNETD_IMAGE" "$LOCAL_PATH_PROVISIONER_IMAGE" "$LOCAL_PATH_HELPER_IMAGE"; do
		ids+=("$(image_id "$i")")
	done
	key=$(hash_of "$BASE_IMAGE" "${ids[@]}" "$K8S_OUT/kubeadm" "$K8S_OUT/kubelet" "$K8S_OUT/kubectl")
	if have_image "$KIND_NODE_IMAGE" && [[ "$(cat "$OUT/node-image.key" 2>/dev/null)" == "$KIND_NODE_IMAGE $key" ]]; then
		log "$KIND_NODE_IMAGE is up to date"
		return
	fi
	# The tarball, its staging and kind's extraction of it (a few GB) go
	# whatever happens; a build that is killed leaves them to the next.
	# kind's tarball builder extracts into $TMPDIR/k8s-tar-extract-* and
	# never removes it, on success as on failure (1.2 GB a build): it gets a
	# directory of its own.
	local kind_tmp=$OUT/stage/kind-tmp
	SERVER_TARBALL=$OUT/kubernetes-server-linux-$ARCH.tar.gz
	rm -rf "$kind_tmp"
	mkdir -p "$kind_tmp"
	# shellcheck disable=SC2064 # expanded now, on purpose
	trap "rm -rf '$kind_tmp' '$SERVER_TARBALL' '$OUT/stage/server' '$OUT/stage/archive'" EXIT
	server_tarball
	log "kind build node-image --type file (kind $KIND_VERSION) -> $KIND_NODE_IMAGE"
	TMPDIR=$kind_tmp "$KIND_BIN" build node-image --type file --arch "$ARCH" --base-image "$BASE_IMAGE" \
		--image "$KIND_NODE_IMAGE" "$SERVER_TARBALL"
	echo "$KIND_NODE_IMAGE $key" >"$OUT/node-image.key"
}

deploy_images() {
	debian_image
	tools_image
	# The kubelet example pod's image: Debian with a shell.
	"$DOCKER" tag "$TOOLS_IMAGE" csi-volmgr-kind/shell:$DEBIAN_SUITE
	local v
	v=$EXTERNAL_ATTACHER_VERSION
	go_build_module "$GOB/external-attacher-$v" github.com/kubernetes-csi/external-attacher/v4 "$v" \
		"-s -w -X main.version=$v" ./cmd/csi-attacher
	image_from "registry.k8s.io/sig-storage/csi-attacher:$v" scratch '["/csi-attacher"]' \
		"$GOB/external-attacher-$v/csi-attacher=/csi-attacher"
	v=$EXTERNAL_PROVISIONER_VERSION
	go_build_module "$GOB/external-provisioner-$v" github.com/kubernetes-csi/external-provisioner/v6 "$v" \
		"-s -w -X main.version=$v" ./cmd/csi-provisioner
	image_from "registry.k8s.io/sig-storage/csi-provisioner:$v" scratch '["/csi-provisioner"]' \
		"$GOB/external-provisioner-$v/csi-provisioner=/csi-provisioner"
}

case "${1:-}" in
node) node_image ;;
# One step of the above, for working on this script: build.sh step base_image
step)
	shift
	"$@"
	;;
deploy-images) deploy_images ;;
kind)
	kind_cli >&2
	echo "$KIND_BIN"
	;;
*)
	echo "usage: $0 node|deploy-images|kind|step FN" >&2
	exit 2
	;;
esac
