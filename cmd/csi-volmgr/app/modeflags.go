package app

import (
	"errors"
	"fmt"

	"github.com/spf13/pflag"
)

// addModeFlags registers the flags that choose where the node's pods come
// from and what the agent does for a node without kubelet.
func (o *RunOptions) addModeFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Manifests, "manifests", o.Manifests, "Standalone mode: read Pods, PersistentVolumeClaims, PersistentVolumes, Secrets and CSIDrivers from the YAML/JSON files of this directory (watched) instead of an API server; volumes are attached with ControllerPublishVolume by the agent itself.")
	fs.BoolVar(&o.RegisterNode, "register-node", o.RegisterNode, "Create and keep the Node object of a node without kubelet: the owner label csi-volmgr.io/volume-manager=csi-volmgr, kubernetes.io/hostname, os and arch labels and --node-labels, the taints of --node-taints, the capacity and allocatable of --node-pods, --node-cpu and --node-memory, the controller-managed-attach-detach annotation, the Ready condition and the node Lease; tear down the volumes of pods marked for deletion, and then complete their deletion. Implies --remove-terminating-pods. An existing Node is kept only if it carries that label (or is one the agent registered before: no kubeletVersion, Ready reason CSIVolmgrReady); any other, a kubelet's, is left alone and the agent acts on nothing.")
}

// validateMode checks the flags of addModeFlags against the others.
func (o *RunOptions) validateMode() error {
	if o.Manifests == "" {
		return nil
	}
	var errs []error
	for flag, set := range map[string]bool{
		"--kubeconfig": o.Kubeconfig != "", "--register-node": o.RegisterNode,
		"--remove-terminating-pods": o.RemoveTerminatingPods, "--cluster-wide-informers": o.ClusterWideInformers,
		"--node-identity": o.NodeIdentity,
	} {
		if set {
			errs = append(errs, fmt.Errorf("--manifests runs without an API server: %s cannot be used with it", flag))
		}
	}
	return errors.Join(errs...)
}

// addFrontFlags registers the flags of the front endpoint.
func (o *RunOptions) addFrontFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.FrontEndpoint, "front-endpoint", o.FrontEndpoint, "Unix socket (absolute path or unix:// URL) of csi-volmgr's own CSI endpoint in front of --front-driver: Identity answers as that driver, Controller calls pass through, Node calls run through the volume lifecycle. Empty disables it.")
	fs.StringVar(&o.FrontDriver, "front-driver", o.FrontDriver, "Name of the registered CSI driver that --front-endpoint fronts.")
}
