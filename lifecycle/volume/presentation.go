package volume

// Presentation is how a published volume is handed to the pod's
// containers, besides its target path: what a container runtime needs
// from the agent (the kubelet keeps the same in its actual state of world,
// for the runtime manager). The supplemental group of a volume is its
// Source.GID (pv.beta.kubernetes.io/gid) in the desired state.
type Presentation struct {
	// DevicePath is, for a block volume, the pod's device: a symbolic link
	// at <root>/pods/<podUID>/volumeDevices/kubernetes.io~csi/<name> to the
	// published device (paths.Publishing.DeviceLink), what the runtime
	// exposes at the container's volumeDevices[].devicePath. Empty for
	// filesystem volumes.
	DevicePath string
	// SELinuxContext is the SELinux context the volume was mounted with
	// (the context= mount option); empty when it was mounted without one.
	// The pod's containers run with the same label.
	SELinuxContext string
}
