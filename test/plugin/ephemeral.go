package plugin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
)

// EphemeralContextKey is the volume_context key a CO sets to "true" on the NodePublishVolume of a
// CSI inline (ephemeral) volume, when the CSIDriver object has podInfoOnMount.
const EphemeralContextKey = "csi.storage.k8s.io/ephemeral"

// ephemeralVolumeSize is the size of an inline volume; a filesystem volume is a directory, so it
// costs no space, only capacity accounting.
const ephemeralVolumeSize int64 = 16 << 20

// isEphemeral says whether a NodePublishVolume's volume_context asks for an inline volume.
func isEphemeral(volumeContext map[string]string) bool {
	return volumeContext[EphemeralContextKey] == "true"
}

// ensureEphemeral returns the inline volume id, creating it (a filesystem volume that is never
// staged) when it does not exist, as csi-driver-host-path does. The volume's lock must be held.
func (d *driver) ensureEphemeral(logger klog.Logger, id string) (Volume, error) {
	if v, ok := d.store.get(id); ok {
		if !v.Ephemeral {
			return Volume{}, status.Errorf(codes.InvalidArgument, "volume %s exists and is not an inline volume", id)
		}
		return v, nil
	}
	v := Volume{
		ID:            id,
		Name:          id,
		CapacityBytes: ephemeralVolumeSize,
		AccessType:    AccessMount,
		Ephemeral:     true,
		Path:          filepath.Join(d.volumesDir, id),
	}
	if err := createBacking(&v, 0); err != nil && !errors.Is(err, os.ErrExist) {
		return Volume{}, status.Error(codes.Internal, err.Error())
	}
	if err := d.store.create(v, d.cfg.Capacity); err != nil {
		_ = os.RemoveAll(v.Path)
		if errors.Is(err, errNoCapacity) {
			return Volume{}, status.Error(codes.ResourceExhausted, err.Error())
		}
		return Volume{}, status.Error(codes.Internal, err.Error())
	}
	logger.V(2).Info("Created inline volume", "volume", id)
	return v, nil
}

// deleteEphemeral removes an inline volume whose last publication went. The volume's lock must be
// held.
func (d *driver) deleteEphemeral(logger klog.Logger, v *Volume) error {
	if err := os.RemoveAll(v.Path); err != nil {
		return fmt.Errorf("remove inline volume storage: %w", err)
	}
	if err := d.store.remove(v.ID); err != nil {
		return err
	}
	logger.V(2).Info("Deleted inline volume", "volume", v.ID)
	return nil
}
