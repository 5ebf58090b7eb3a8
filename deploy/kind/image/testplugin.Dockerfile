# The project's CSI test plugin (test/plugin/cmd/csi-testplugin): a static
# binary on an empty base. It mounts with mount(2) and manages loop devices
# with ioctls, so it needs no tools.
#
#   make image-testplugin   (docker build -f this bin/image-testplugin)
FROM scratch
COPY csi-testplugin /csi-testplugin
ENTRYPOINT ["/csi-testplugin"]
