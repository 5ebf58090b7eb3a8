# csi-volmgr: a static binary on an empty base.
#
#   make image        (builds bin/image/csi-volmgr, then
#                      docker build -f Dockerfile bin/image)
#
# Nothing comes from an image registry: `make image` builds the binary with
# the Go toolchain of the host (CGO_ENABLED=0) and the context holds only it.
# The classic builder and BuildKit both build it.
#
# The agent runs privileged as root (Bidirectional mount propagation, the
# kubelet's directory layout); it needs no shell, no mount binary and no libc:
# it inspects the mount table itself and leaves mounting to the CSI drivers.
FROM scratch
COPY csi-volmgr /csi-volmgr
# Root: the agent creates and removes directories in the kubelet layout
# below --root-dir, which the CSI drivers (also root) mount into.
USER 0:0
ENTRYPOINT ["/csi-volmgr"]
