package app

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/driver/front"
	"github.com/csi-volmgr/csi-volmgr/driver/registry"
	"github.com/csi-volmgr/csi-volmgr/lifecycle"
)

// addFrontFlags registers the flags of the front endpoint.
func (o *RunOptions) addFrontFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.FrontEndpoint, "front-endpoint", o.FrontEndpoint, "Unix socket (absolute path or unix:// URL) of csi-volmgr's own CSI endpoint in front of --front-driver: Identity answers as that driver, Controller calls pass through, Node calls run through the volume lifecycle. Empty disables it.")
	fs.StringVar(&o.FrontDriver, "front-driver", o.FrontDriver, "Name of the registered CSI driver that --front-endpoint fronts.")
}

// validateFront checks the flags of addFrontFlags.
func (o *RunOptions) validateFront() error {
	switch {
	case o.FrontEndpoint == "" && o.FrontDriver == "":
		return nil
	case o.FrontEndpoint == "" || o.FrontDriver == "":
		return errors.New("--front-endpoint and --front-driver must be set together")
	}
	if _, err := csiclient.ParseEndpoint(o.FrontEndpoint); err != nil {
		return fmt.Errorf("--front-endpoint: %w", err)
	}
	return nil
}

// runFront serves the front endpoint, when configured, until ctx ends. It
// starts once the lifecycle has reconstructed the actual state and built its
// operations, and first restores what a container orchestrator had staged
// and published through the front before a restart.
func runFront(ctx context.Context, o *RunOptions, manager *lifecycle.Manager, drivers *registry.Registry, reg prometheus.Registerer) error {
	if o.FrontEndpoint == "" {
		return nil
	}
	logger := klog.FromContext(ctx).WithValues("frontEndpoint", o.FrontEndpoint, "driver", o.FrontDriver)
	ops, err := manager.Operations(ctx)
	if err != nil {
		// Stopped before the lifecycle started.
		return nil
	}
	if _, err := ops.RestoreRequests(ctx); err != nil {
		// The records that failed are left alone on disk and logged.
		logger.Error(err, "Some of the front endpoint's records were not restored")
	}
	srv, err := front.New(front.Config{
		Endpoint:   o.FrontEndpoint,
		Driver:     o.FrontDriver,
		Drivers:    front.ClientLookup(drivers.Client),
		Operations: ops,
		Registerer: reg,
	})
	if err != nil {
		return err
	}
	if err := srv.Start(klog.NewContext(ctx, logger)); err != nil {
		return err
	}
	return srv.Wait()
}
