package localattach

import (
	"context"

	corev1 "k8s.io/api/core/v1"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// Drivers finds registered drivers.
type Drivers interface {
	// Client returns the named driver's connection, false when the driver
	// is not registered.
	Client(name string) (*csiclient.Client, bool)
	// NodeID returns the node ID the named driver reported in NodeGetInfo,
	// false when the driver is not registered.
	NodeID(name string) (string, bool)
}

// Policies gives drivers' CSIDriver policies.
type Policies interface {
	// Get returns the named driver's policy.
	Get(driverName string) volume.Policy
}

// Volumes finds PersistentVolumes; the manifest source implements it.
type Volumes interface {
	// PV returns the named PersistentVolume.
	PV(name string) (*corev1.PersistentVolume, error)
}

// Secrets reads Secrets; the manifest source implements it.
type Secrets interface {
	// GetSecret returns a Secret's data. Errors never contain secret data.
	GetSecret(ctx context.Context, namespace, name string) (map[string]string, error)
}

// Steps runs the lifecycle's CSI steps; *operations.Operations implements
// it, and so does what Wrap returns (it is the reconciler's Operations).
type Steps interface {
	// WaitForAttach checks that the volume is attached.
	WaitForAttach(ctx context.Context, name volume.Name, src volume.Source) error
	// Stage stages the volume.
	Stage(ctx context.Context, name volume.Name, src volume.Source, fsGroup *int64) error
	// Publish publishes one pod's use of the volume.
	Publish(ctx context.Context, key volume.PodKey, src volume.Source, pv volume.PodVolume) error
	// Unpublish tears one pod's use down.
	Unpublish(ctx context.Context, key volume.PodKey) error
	// Unstage unstages the volume.
	Unstage(ctx context.Context, name volume.Name) error
}
