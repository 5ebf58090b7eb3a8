# Debian with iptables, nftables and conntrack: the base of kube-proxy's
# image (the upstream one is distroless-iptables) and, as it has a shell,
# mkdir and rm, of local-path-provisioner's helper pods.
ARG DEBIAN_IMAGE
FROM ${DEBIAN_IMAGE}
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends iptables nftables conntrack \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* /var/cache/debconf/* /var/log/* /usr/share/doc/* /usr/share/man/*
