package volumemanager

import (
	"context"
	"time"

	"k8s.io/client-go/discovery"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/volumemanager/kubeversion"
)

// serverVersionTimeout bounds the wait for the API server's version at
// start; past it the agent runs as with the oldest supported minor.
const serverVersionTimeout = 30 * time.Second

// detectServer asks the API server its version once, logs what the agent
// makes of it (kubeversion.Report: a warning outside the supported range,
// one line per feature the minor lacks) and sets the features the
// lifecycle and the allocatable refresher run with. It returns when they
// are set, at the latest after serverVersionTimeout or when ctx ends.
func (vm *VolumeManager) detectServer(ctx context.Context) {
	v, err := kubeversion.Detect(ctx, discovery.ToServerVersionInterfaceWithContext(vm.cfg.KubeClient.Discovery()), serverVersionTimeout)
	f := kubeversion.Report(klog.FromContext(ctx).WithName("server-version"), v, err)
	vm.features.Store(&f)
	close(vm.serverKnown)
}

// serverFeatures waits until the API server's features are known and
// returns them; false when ctx ended first.
func (vm *VolumeManager) serverFeatures(ctx context.Context) (kubeversion.Features, bool) {
	select {
	case <-vm.serverKnown:
		return *vm.features.Load(), true
	case <-ctx.Done():
		return kubeversion.Features{}, false
	}
}

// seLinuxMountReadWriteOncePodOnly tells the populator to mount only
// ReadWriteOncePod PVs with an SELinux context: the API server is older
// than 1.37, or its version is not known yet (the cautious choice; the
// populator runs only once it is).
func (vm *VolumeManager) seLinuxMountReadWriteOncePodOnly() bool {
	f := vm.features.Load()
	return f == nil || !f.SELinuxMountAllAccessModes
}
