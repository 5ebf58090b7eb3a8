package operations

import (
	"context"
	"fmt"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// healthClient is a driver connection that can ask for a volume's health;
// *csiclient.Client is one.
type healthClient interface {
	NodeGetVolumeHealth(ctx context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error)
}

// VolumeHealth calls NodeGetVolumeHealth for a volume of driver that this
// node has staged or published, whoever asked for it, at the publish and
// staging paths req names when it names them; any other volume or path is
// an error wrapping volume.ErrNotFound. Like VolumeStats it holds the
// volume's lock shared.
func (o *Operations) VolumeHealth(ctx context.Context, driver string, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	name := volume.PersistentName(driver, req.GetVolumeId())
	unlock, err := o.locks.lockVolume(ctx, name, false)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if _, ok := o.state.Volume(name); !ok {
		return nil, fmt.Errorf("%w: volume %q of driver %q", volume.ErrNotFound, req.GetVolumeId(), driver)
	}
	for _, p := range []string{req.GetVolumePublishPath(), req.GetStagingTargetPath()} {
		if p == "" {
			continue
		}
		if err := o.knowsPath(name, p); err != nil {
			return nil, err
		}
	}
	client, err := o.driver(driver)
	if err != nil {
		return nil, err
	}
	hc, ok := client.(healthClient)
	if !ok {
		return nil, status.Error(codes.Unimplemented, "the driver's connection cannot ask for volume health")
	}
	return hc.NodeGetVolumeHealth(ctx, req)
}
