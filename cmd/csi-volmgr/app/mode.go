package app

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/pflag"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/csi-volmgr/csi-volmgr/driver/nodeinfo"
	"github.com/csi-volmgr/csi-volmgr/driver/policy"
	"github.com/csi-volmgr/csi-volmgr/driver/registry"
	"github.com/csi-volmgr/csi-volmgr/lifecycle"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/source/manifests"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/virtualnode"
)

// addModeFlags registers the flags that choose where the node's pods come
// from and what the agent does for a node without kubelet.
func (o *RunOptions) addModeFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Manifests, "manifests", o.Manifests, "Standalone mode: read Pods, PersistentVolumeClaims, PersistentVolumes, Secrets and CSIDrivers from the YAML/JSON files of this directory (watched) instead of an API server; volumes are attached with ControllerPublishVolume by the agent itself.")
	fs.BoolVar(&o.RegisterNode, "register-node", o.RegisterNode, "Create and keep the Node object of a node without kubelet (labels, controller-managed-attach-detach annotation, Ready condition, node Lease), tear down the volumes of pods marked for deletion, and then complete their deletion. Implies --remove-terminating-pods.")
}

// validateMode checks the flags of addModeFlags against the others.
func (o *RunOptions) validateMode() error {
	if o.Manifests == "" {
		return nil
	}
	var errs []error
	for flag, set := range map[string]bool{
		"--kubeconfig": o.Kubeconfig != "", "--register-node": o.RegisterNode,
		"--remove-terminating-pods": o.RemoveTerminating, "--cluster-wide-informers": o.ClusterWideInformers,
	} {
		if set {
			errs = append(errs, fmt.Errorf("--manifests runs without an API server: %s cannot be used with it", flag))
		}
	}
	return errors.Join(errs...)
}

// backend is where the node's pods come from: an API server (informers,
// CSIDriver policies, node info publishing, and with --register-node the
// Node itself), or a manifest directory in standalone mode.
type backend struct {
	// client is nil in standalone mode, standalone nil otherwise.
	client     kubernetes.Interface
	standalone *manifests.Source
	policies   lifecycle.Policies
	// nodeInfo publishes registered drivers; nil in standalone mode.
	nodeInfo registry.NodeInfoPublisher
	// factory holds the informers to start; nil in standalone mode.
	factory informers.SharedInformerFactory
	// node keeps the Node object; nil without --register-node.
	node *virtualnode.Node
}

// newBackend connects to the API server, or reads the manifest directory.
// Its errors are the user's to fix and name the flag at fault.
func newBackend(ctx context.Context, o *RunOptions) (*backend, error) {
	if o.Manifests != "" {
		src, err := manifests.New(ctx, manifests.Config{Dir: o.Manifests, NodeName: o.NodeName})
		if err != nil {
			return nil, fmt.Errorf("--manifests %s: %w", o.Manifests, err)
		}
		return &backend{standalone: src, policies: src.Policies()}, nil
	}
	restConfig, err := kubeConfig(o)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return nil, fmt.Errorf("creating the API client: %w", err)
	}
	b := &backend{client: client, factory: informers.NewSharedInformerFactory(client, 0)}
	if b.policies, err = policy.New(ctx, b.factory.Storage().V1().CSIDrivers()); err != nil {
		return nil, err
	}
	if b.nodeInfo, err = nodeinfo.New(nodeinfo.Config{Client: client, NodeName: o.NodeName}); err != nil {
		return nil, err
	}
	if o.RegisterNode {
		if b.node, err = virtualnode.New(virtualnode.Config{Client: client, NodeName: o.NodeName}); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// lifecycleConfig is the mode's part of the lifecycle configuration.
func (b *backend) lifecycleConfig(o *RunOptions) lifecycle.Config {
	cfg := lifecycle.Config{
		Policies:              b.policies,
		RemoveTerminatingPods: o.RemoveTerminating || o.RegisterNode,
		CompletePodDeletion:   o.RegisterNode,
		ClusterWideInformers:  o.ClusterWideInformers,
	}
	if b.standalone != nil {
		cfg.Standalone = b.standalone
	} else {
		cfg.Client = b.client
	}
	return cfg
}

// start starts the informers and, with --register-node, registers the Node
// before anything else uses it (driver registration writes into it). It
// returns nil when ctx ends first.
func (b *backend) start(ctx context.Context) error {
	if b.factory != nil {
		b.factory.Start(ctx.Done())
	}
	if b.node == nil {
		return nil
	}
	if err := b.node.Register(ctx); err != nil && ctx.Err() == nil {
		return fmt.Errorf("--register-node: %w", err)
	}
	return nil
}

// keepNode keeps the Node with --register-node until ctx ends.
func (b *backend) keepNode(ctx context.Context) {
	if b.node != nil {
		b.node.Run(ctx)
	}
}
