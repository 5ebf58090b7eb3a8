package volumemanager

import (
	"context"

	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/front"
)

// runFront serves the front endpoint, when configured, until ctx ends. It
// starts once the lifecycle has rebuilt the actual state from disk, the
// front endpoint's own records included.
func (vm *VolumeManager) runFront(ctx context.Context) error {
	if vm.cfg.FrontEndpoint == "" {
		return nil
	}
	select {
	case <-ctx.Done():
		return nil // stopped before the lifecycle started
	case <-vm.manager.Reconstructed():
	}
	logger := klog.FromContext(ctx).WithValues("frontEndpoint", vm.cfg.FrontEndpoint, "driver", vm.cfg.FrontDriver)
	srv, err := front.New(front.Config{
		Endpoint:   vm.cfg.FrontEndpoint,
		Driver:     vm.cfg.FrontDriver,
		Drivers:    vm.registry,
		Operations: vm.manager.Operations(),
		Registerer: vm.metrics,
	})
	if err != nil {
		return err
	}
	if err := srv.Start(klog.NewContext(ctx, logger)); err != nil {
		return err
	}
	return srv.Wait()
}
