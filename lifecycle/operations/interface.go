package operations

import (
	"context"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	authenticationv1 "k8s.io/api/authentication/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// DriverClient is the part of a CSI driver connection the operations call.
// *csiclient.Client and *csiclienttest.Client implement it. Errors must be
// classified as csiclient's are (csiclient.ErrFinal, ErrUncertain,
// ErrAlreadyDone); an unclassified error counts as uncertain.
type DriverClient interface {
	// NodeCapabilities returns the driver's node capabilities.
	NodeCapabilities(ctx context.Context) (csiclient.NodeCapabilities, error)
	// NodeStageVolume calls the driver's NodeStageVolume.
	NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) error
	// NodeUnstageVolume calls the driver's NodeUnstageVolume.
	NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) error
	// NodePublishVolume calls the driver's NodePublishVolume.
	NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) error
	// NodeUnpublishVolume calls the driver's NodeUnpublishVolume.
	NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) error
	// NodeGetVolumeStats calls the driver's NodeGetVolumeStats.
	NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error)
	// NodeExpandVolume calls the driver's NodeExpandVolume.
	NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error)
	// NodeGetInfo calls the driver's NodeGetInfo.
	NodeGetInfo(ctx context.Context) (*csi.NodeGetInfoResponse, error)
}

var (
	_ DriverClient = &csiclient.Client{}
)

// Drivers finds the connection of a registered driver.
type Drivers interface {
	// Driver returns the client of the named driver, false when the driver
	// is not registered.
	Driver(name string) (DriverClient, bool)
}

// DriversFunc adapts a function to Drivers.
type DriversFunc func(name string) (DriverClient, bool)

// Driver implements Drivers.
func (f DriversFunc) Driver(name string) (DriverClient, bool) { return f(name) }

// ClientLookup adapts a lookup that returns a concrete client type, such as
// (*registry.Registry).Client, to Drivers. A lookup that reports false
// yields no client (never a typed nil).
func ClientLookup[C DriverClient](lookup func(name string) (C, bool)) Drivers {
	return DriversFunc(func(name string) (DriverClient, bool) {
		c, ok := lookup(name)
		if !ok {
			return nil, false
		}
		return c, true
	})
}

// Policies returns a driver's CSIDriver policy.
type Policies interface {
	// Get returns the policy of the named driver, the kubelet's defaults
	// when it has no CSIDriver object.
	Get(driverName string) volume.Policy
}

// Secrets reads the Secrets named by nodeStageSecretRef and
// nodePublishSecretRef.
type Secrets interface {
	// GetSecret returns every key of the Secret with its value as a
	// string. Its errors must not contain secret data; operations never
	// logs the values nor puts them in errors.
	GetSecret(ctx context.Context, namespace, name string) (map[string]string, error)
}

// Attachments reads VolumeAttachments from a cache (never a live GET);
// the VolumeAttachment lister of client-go implements it.
type Attachments interface {
	// Get returns the VolumeAttachment with the given name, or an error
	// for which apierrors.IsNotFound is true when there is none.
	Get(name string) (*storagev1.VolumeAttachment, error)
}

// Mounts inspects the mount table; k8s.io/mount-utils' mount.Interface
// implements it.
type Mounts interface {
	// IsMountPoint reports whether file (a directory or a file) is a mount
	// point, detecting bind mounts; fs.ErrNotExist when it does not exist.
	IsMountPoint(file string) (bool, error)
	// GetMountRefs returns the other mount points of what is mounted at
	// (or contains) pathname.
	GetMountRefs(pathname string) ([]string, error)
}

// Tokens issues service account tokens for drivers whose CSIDriver has
// tokenRequests, as the kubelet's csi_mounter.go
// podServiceAccountTokenAttrs does.
type Tokens interface {
	// ServiceAccountToken returns a token of pod's service account for
	// req.Audience (the API server's audiences when empty), expiring after
	// req.ExpirationSeconds, bound to the pod.
	ServiceAccountToken(ctx context.Context, pod volume.PodInfo, req storagev1.TokenRequest) (authenticationv1.TokenRequestStatus, error)
}

// Observer receives the duration and outcome of every step, e.g. to record
// storage_operation_duration_seconds{volume_plugin="kubernetes.io/csi:<driver>",
// operation_name=<the kubelet's name of the step for the access type>,
// status="success"|"fail-unknown", migrated="true"|"false"}.
type Observer interface {
	// ObserveOperation is called once per step that ran (after its locks
	// were taken), with the volume's access type, whether it is an in-tree
	// volume translated to CSI (volume.Source's Migrated), its error (nil
	// for success) and duration. It must not block.
	ObserveOperation(driver string, step volume.Step, access volume.AccessType, migrated bool, err error, d time.Duration)
}

// OwnershipObserver receives what the recursive fsGroup ownership changes
// do, e.g. to export them as metrics; *metrics.Ownership implements it. Its
// methods must not block.
type OwnershipObserver interface {
	// OwnershipFiles adds n files and directories done for a volume of
	// driver, while a change runs.
	OwnershipFiles(driver string, n int64)
	// OwnershipRunning adds delta (+1 when a change starts, -1 when it
	// ends) to the changes in progress.
	OwnershipRunning(driver string, delta int)
	// OwnershipDone counts a finished change by result: "changed" (walked),
	// "skipped" (OnRootMismatch found the root in place), "interrupted"
	// (the pod no longer wants the volume, or the agent stops) or "failed".
	OwnershipDone(driver, result string)
}

// StateReader is what operations read from the actual state of world;
// *asw.World implements it.
type StateReader interface {
	// Volume returns what is recorded about a volume.
	Volume(name volume.Name) (asw.Volume, bool)
	// Pod returns what is recorded about one pod's publish of a volume.
	Pod(key volume.PodKey) (asw.Pod, bool)
	// Publishers returns the pods whose publish of the volume is present or
	// uncertain.
	Publishers(name volume.Name) []types.UID
	// MayUnstage is the unstage rule: nil, or an error wrapping
	// volume.ErrInUse.
	MayUnstage(name volume.Name) error
}

// StateRecorder is how operations record outcomes in the actual state of
// world; *asw.World implements it.
type StateRecorder interface {
	// RecordAttach records the outcome of WaitForAttach.
	RecordAttach(name volume.Name, id volume.ID, publishContext map[string]string, err error)
	// RecordStage records the outcome of Stage or Unstage.
	RecordStage(name volume.Name, id volume.ID, o asw.StageOutcome)
	// RecordPublish records the outcome of Publish or Unpublish.
	RecordPublish(key volume.PodKey, id volume.ID, o asw.PublishOutcome)
	// ForgetPod drops a pod's entry after a successful unpublish.
	ForgetPod(key volume.PodKey)
	// ForgetVolume drops a volume after a successful unstage.
	ForgetVolume(name volume.Name)
	// RecordProgress records (nil: clears) the progress of a long setup
	// step on a pod's volume.
	RecordProgress(key volume.PodKey, id volume.ID, p *asw.Progress)
}

// ActualState is the actual state of world as operations use it.
type ActualState interface {
	StateReader
	StateRecorder
}

var _ ActualState = &asw.World{}
