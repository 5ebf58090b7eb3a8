package operations

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// ErrExpandNotSupported is wrapped by Expand's error when the driver does
// not advertise the node capability EXPAND_VOLUME (the kubelet's
// OperationNotSupportedError): a final error.
var ErrExpandNotSupported = errors.New("NodeExpandVolume is not supported by the CSI driver (no EXPAND_VOLUME node capability)")

// Expand grows the file system of a published volume to requiredBytes
// (NodeExpandVolume, as the kubelet's csi/expander.go NodeExpand) and
// returns the capacity the driver reports. key names the pod whose publish
// the call is made on: volume_path is its target path, and
// staging_target_path the volume's staging path when the driver stages.
// volume_capability is built as for NodeStageVolume from the first access
// mode, fsType and mount options (block for block volumes), secrets come
// from nodeExpandSecretRef.
//
// The pod's publish must be present (Published, or uncertain while the
// mount is being set up); the call holds the volume's lock exclusively, as a
// stage does, so it never runs during a stage, unstage or another
// expansion of the volume. Errors: volume.ErrNotFound when the pod's
// publish is not known, ErrExpandNotSupported, volume.ErrDriverNotRegistered,
// a Secret that cannot be read, and the driver's classified error.
func (o *Operations) Expand(ctx context.Context, key volume.PodKey, src volume.Source, requiredBytes int64) (capacity int64, err error) {
	if err := o.notOwned(); err != nil {
		return 0, err
	}
	unlock, err := o.locks.lockVolume(ctx, key.Volume, true)
	if err != nil {
		return 0, err
	}
	defer unlock()
	start := time.Now()
	defer func() { o.observe(src.Driver, volume.StepExpand, src.AccessType, src.Migrated, start, err) }()
	logger := klog.FromContext(ctx).WithValues("volume", key.Volume, "driver", src.Driver, "podUID", key.Pod)

	p, ok := o.state.Pod(key)
	if !ok || p.State == volume.NotPublished || p.TargetPath == "" {
		return 0, fmt.Errorf("%w: %s is not published", volume.ErrNotFound, key)
	}
	client, err := o.driver(src.Driver)
	if err != nil {
		return 0, err
	}
	caps, err := client.NodeCapabilities(ctx)
	if err != nil {
		return 0, fmt.Errorf("getting the node capabilities of driver %q: %w", src.Driver, err)
	}
	if !caps.Expand() {
		return 0, fmt.Errorf("%w: driver %q", ErrExpandNotSupported, src.Driver)
	}
	stagingPath := ""
	if !src.Inline && caps.StageUnstage() {
		if v, ok := o.state.Volume(key.Volume); ok {
			stagingPath = v.StagingPath
		}
	}
	secrets, err := o.secret(ctx, src.ExpandSecret)
	if err != nil {
		return 0, err
	}
	c := capability(src, caps, nil)
	if m := c.GetMount(); m != nil {
		// The kubelet sends the PV's mountOptions and fsType only.
		m.MountFlags = slices.Clone(src.MountOptions)
	}
	resp, err := client.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{
		VolumeId:          src.Handle,
		VolumePath:        p.TargetPath,
		StagingTargetPath: stagingPath,
		CapacityRange:     &csi.CapacityRange{RequiredBytes: requiredBytes},
		VolumeCapability:  c,
		Secrets:           secrets,
	})
	if err != nil {
		logger.V(2).Info("NodeExpandVolume failed", "requiredBytes", requiredBytes, "err", err)
		return 0, err
	}
	logger.V(2).Info("Expanded volume on the node", "requiredBytes", requiredBytes, "capacityBytes", resp.GetCapacityBytes())
	return resp.GetCapacityBytes(), nil
}

// MarkMountUncertain records a pod's publish of a volume as uncertain after
// a step that completes the mount failed (the kubelet marks the mount
// uncertain when expanding the volume during the mount fails): the pod is
// not ready, the publish is repeated while it is wanted and torn down when
// not, and err is the pod's last error, for step. A publish that is not
// known is left alone.
func (o *Operations) MarkMountUncertain(ctx context.Context, key volume.PodKey, step volume.Step, err error) error {
	unlock, lockErr := o.locks.lockPod(ctx, key, false)
	if lockErr != nil {
		return lockErr
	}
	defer unlock()
	p, ok := o.state.Pod(key)
	if !ok || p.State == volume.NotPublished {
		return nil
	}
	v, _ := o.state.Volume(key.Volume)
	o.state.RecordPublish(key, v.ID, asw.PublishOutcome{Step: step, State: volume.PublishUncertain, TargetPath: p.TargetPath, External: p.External, Err: err})
	return nil
}
