#!/usr/bin/env bash
# Makes the bootstrap credentials of one edge host's csi-volmgr (systemd,
# no ServiceAccount): a bootstrap token for that host's Node alone, which
# expires, and the kubeconfig the agent asks for its Node's client
# certificate with (config.yaml: kubeconfig, nodeIdentity: true).
#
#   deploy/systemd/bootstrap-token.sh NODE [TTL] > bootstrap-kubeconfig
#   install -D -m 0600 bootstrap-kubeconfig /etc/csi-volmgr/bootstrap-kubeconfig   (on the host)
#
# NODE is the Node the agent serves (config.yaml: nodeName): csi-volmgr-
# and then lowercase letters, digits and '-', no dots. TTL is how long the
# token authenticates, a number and s, m, h or d (default 24h): enough to
# install the host; the agent needs it only for its first certificate, and
# renews that certificate as its Node.
#
# The token (a Secret bootstrap-token-<id> of type bootstrap.kubernetes.io/token
# in kube-system) authenticates as system:bootstrap:<id> in the groups
# system:bootstrappers:csi-volmgr, which may create a certificate request
# (the ClusterRoleBinding of rbac-bootstrap.yaml: kubectl apply -k
# deploy/systemd), and system:bootstrappers:csi-volmgr:NODE, for which the
# approver of deploy/base (csi-volmgr-csr-approver) approves a certificate
# of system:node:NODE and nothing else. kube-controller-manager's
# tokencleaner deletes it once expired.
#
# kubeadm makes the same token with
#   kubeadm token create --ttl 24h --usages authentication \
#     --groups system:bootstrappers:csi-volmgr,system:bootstrappers:csi-volmgr:NODE
# (then write the kubeconfig with that token as below).
#
# Needs kubectl (KUBECTL, default kubectl) whose current context may create
# Secrets in kube-system, od and date. The kubeconfig names the current
# context's server and CA (SERVER, CA_FILE override them).
set -euo pipefail

KUBECTL=${KUBECTL:-kubectl}
# The approver's --node-name-prefix and --bootstrap-group-prefix.
NODE_NAME_PREFIX=${NODE_NAME_PREFIX:-csi-volmgr-}
GROUP=system:bootstrappers:csi-volmgr

usage() {
	echo "usage: $0 NODE [TTL] > bootstrap-kubeconfig   (TTL: e.g. 30m, 24h, 7d; default 24h)" >&2
	exit 2
}
die() {
	echo "$0: $*" >&2
	exit 1
}

(($# >= 1 && $# <= 2)) || usage
node=$1
ttl=${2:-24h}

# A group name allows [a-z0-9:-] only, and the approver serves only the
# Nodes of its prefix: a token for another name would never be approved.
[[ "$node" =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ && ${#node} -le 63 ]] ||
	die "node name '$node': want lowercase letters, digits and '-' (no dots), at most 63"
[[ "$node" == "$NODE_NAME_PREFIX"?* ]] ||
	die "node name '$node' does not start with $NODE_NAME_PREFIX: the approver (--node-name-prefix) would never approve its certificate"

[[ "$ttl" =~ ^([1-9][0-9]*)([smhd])$ ]] || die "TTL '$ttl': want a number and s, m, h or d"
case ${BASH_REMATCH[2]} in
s) seconds=${BASH_REMATCH[1]} ;;
m) seconds=$((BASH_REMATCH[1] * 60)) ;;
h) seconds=$((BASH_REMATCH[1] * 3600)) ;;
d) seconds=$((BASH_REMATCH[1] * 86400)) ;;
esac
expires_at=$(($(date -u +%s) + seconds))
# GNU date, else BSD date.
expiration=$(date -u -d "@$expires_at" +%Y-%m-%dT%H:%M:%SZ 2>/dev/null || date -u -r "$expires_at" +%Y-%m-%dT%H:%M:%SZ)

# rand N prints N characters of [a-z0-9] from /dev/urandom, each equally
# likely (bytes from 252 up are dropped): a token id of 6, a secret of 16,
# as kubeadm's.
rand() {
	local alphabet=abcdefghijklmnopqrstuvwxyz0123456789 out="" b
	while ((${#out} < $1)); do
		for b in $(od -An -tu1 -N64 /dev/urandom); do
			if ((b < 252 && ${#out} < $1)); then
				out+=${alphabet:b%36:1}
			fi
		done
	done
	printf '%s' "$out"
}
id=$(rand 6)
secret=$(rand 16)

# The kubeconfig's server and CA: the current context's, unless given.
server=${SERVER:-$("$KUBECTL" config view --minify -o jsonpath='{.clusters[0].cluster.server}')}
[[ -n "$server" ]] || die "no server in the current context; set SERVER"
if [[ -n "${CA_FILE:-}" ]]; then
	ca=$(base64 <"$CA_FILE" | tr -d '\n')
else
	ca=$("$KUBECTL" config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')
	if [[ -z "$ca" ]]; then
		file=$("$KUBECTL" config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority}')
		[[ -n "$file" ]] || die "the current context names no CA (certificate-authority-data or -file); set CA_FILE"
		ca=$(base64 <"$file" | tr -d '\n')
	fi
fi

"$KUBECTL" create -f - >/dev/null <<EOF
apiVersion: v1
kind: Secret
metadata:
  name: bootstrap-token-$id
  namespace: kube-system
  labels:
    app.kubernetes.io/part-of: csi-volmgr
    csi-volmgr.io/bootstrap-node: $node
type: bootstrap.kubernetes.io/token
stringData:
  description: csi-volmgr bootstrap token of Node $node
  token-id: "$id"
  token-secret: "$secret"
  expiration: "$expiration"
  usage-bootstrap-authentication: "true"
  auth-extra-groups: "$GROUP,$GROUP:$node"
EOF
echo "bootstrap token $id for Node $node, valid until $expiration (Secret kube-system/bootstrap-token-$id)" >&2

cat <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: cluster
    cluster:
      server: $server
      certificate-authority-data: $ca
users:
  - name: bootstrap-$node
    user:
      token: $id.$secret
contexts:
  - name: bootstrap
    context:
      cluster: cluster
      user: bootstrap-$node
current-context: bootstrap
EOF
