# The example virtual-kubelet runtime (examples/vk-runtime), which embeds
# csi-volmgr, for deploy/kind/runtime: static binaries on an empty base. The
# containers it runs see the kind node's system directories (--host-root),
# so the image needs no shell; /csi-volmgr is there for
# `kubectl exec ds/csi-volmgr -- /csi-volmgr status`.
#
#   make image-example-runtime   (docker build -f this bin/image-example-runtime)
FROM scratch
COPY csi-volmgr-example-runtime /csi-volmgr-example-runtime
COPY csi-volmgr /csi-volmgr
USER 0:0
ENTRYPOINT ["/csi-volmgr-example-runtime"]
