package operations

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// ErrAttachFailed is wrapped by the error of WaitForAttach when the
// VolumeAttachment reports an attachError: the attach was tried and failed.
var ErrAttachFailed = errors.New("attach failed")

// WaitForAttach checks, without waiting, whether volume name may be staged
// as far as attach goes, and records the answer in the actual state (with
// the publish_context that Stage and Publish send):
//
//   - inline volumes are never attached: nothing to do, nothing recorded;
//   - when the driver's policy says attachRequired=false the volume counts
//     as attached with a nil publish_context;
//   - otherwise the VolumeAttachment volume.AttachmentName(handle, driver,
//     node) is read from the Attachments cache: status.attached makes the
//     volume attached with status.attachmentMetadata as publish_context; a
//     missing or not yet attached object, or one being deleted, is an error
//     wrapping volume.ErrNotAttached; one with status.attachError is an
//     error wrapping ErrAttachFailed that carries the attach error's
//     message. The caller retries when the VolumeAttachment changes.
func (o *Operations) WaitForAttach(ctx context.Context, name volume.Name, src volume.Source) (err error) {
	if src.Inline {
		return nil
	}
	unlock, err := o.locks.lockVolume(ctx, name, false)
	if err != nil {
		return err
	}
	defer unlock()
	start := time.Now()
	defer func() { o.observe(src.Driver, volume.StepWaitForAttach, src.AccessType, src.Migrated, start, err) }()
	logger := klog.FromContext(ctx).WithValues("volume", name, "driver", src.Driver)

	if !o.policies.Get(src.Driver).AttachRequired {
		o.state.RecordAttach(name, src.ID, nil, nil)
		logger.V(4).Info("Volume needs no attach")
		return nil
	}
	vaName := volume.AttachmentName(src.Handle, src.Driver, o.nodeName)
	publishContext, err := o.attachment(vaName, src.Driver)
	o.state.RecordAttach(name, src.ID, publishContext, err)
	if err != nil {
		logger.V(4).Info("Volume is not attached", "volumeAttachment", vaName, "err", err)
		return err
	}
	logger.V(4).Info("Volume is attached", "volumeAttachment", vaName)
	return nil
}

// attachment reads the VolumeAttachment vaName and returns its
// attachmentMetadata when it is attached (the kubelet's csi_attacher.go WaitForAttach).
// One that names another node or another attacher than driver does not
// attach the volume here, whatever its status says: its name was made to
// look like this node's (the attach/detach controller never does that).
func (o *Operations) attachment(vaName, driver string) (map[string]string, error) {
	va, err := o.attachments.Get(vaName)
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("%w: VolumeAttachment %s does not exist", volume.ErrNotAttached, vaName)
	case err != nil:
		return nil, fmt.Errorf("reading VolumeAttachment %s: %w", vaName, err)
	case va.Spec.NodeName != o.nodeName || va.Spec.Attacher != driver:
		return nil, fmt.Errorf("%w: VolumeAttachment %s is for node %q and attacher %q, not node %q and driver %q",
			volume.ErrNotAttached, vaName, truncateName(va.Spec.NodeName), truncateName(va.Spec.Attacher), o.nodeName, driver)
	case va.DeletionTimestamp != nil:
		return nil, fmt.Errorf("%w: VolumeAttachment %s is being deleted", volume.ErrNotAttached, vaName)
	case va.Status.Attached:
		return va.Status.AttachmentMetadata, nil
	case isAttachLimitError(va.Status.AttachError):
		return nil, fmt.Errorf("%w: %w: VolumeAttachment %s: %s", volume.ErrAttachLimitExceeded, ErrAttachFailed, vaName, va.Status.AttachError.Message)
	case va.Status.AttachError != nil && va.Status.AttachError.Message != "":
		// Not ErrNotAttached: the attach was tried and failed, and the pod's
		// condition says AttachFailed with the attacher's message.
		return nil, fmt.Errorf("%w: VolumeAttachment %s: %s", ErrAttachFailed, vaName, va.Status.AttachError.Message)
	}
	return nil, fmt.Errorf("%w: VolumeAttachment %s is not attached yet", volume.ErrNotAttached, vaName)
}

// publishContext returns the publish_context for staging or publishing a
// volume of src: nil for inline volumes and drivers without attach,
// otherwise the attachmentMetadata of the VolumeAttachment as it is now.
// The VolumeAttachment is read again (from the cache) for every stage and
// publish, as the kubelet's csi_attacher.go MountDevice and csi_mounter.go
// SetUpAt read it again: an attacher may update attachmentMetadata (a new
// device path after a re-attach), and a step must not send what an earlier
// WaitForAttach saw. WaitForAttach must have found the volume attached
// first; the error wraps volume.ErrNotAttached otherwise, or when the
// VolumeAttachment is no longer attached.
func (o *Operations) publishContext(name volume.Name, src volume.Source, attachRequired bool) (map[string]string, error) {
	if src.Inline || !attachRequired {
		return nil, nil
	}
	v, ok := o.state.Volume(name)
	if !ok || !v.Attached {
		return nil, fmt.Errorf("%w: %s (wait for attach first)", volume.ErrNotAttached, name)
	}
	return o.attachment(volume.AttachmentName(src.Handle, src.Driver, o.nodeName), src.Driver)
}

// isAttachLimitError says whether an attach error is the driver's
// ResourceExhausted (errorCode, KEP-4876): the node's attach limit.
func isAttachLimitError(e *storagev1.VolumeError) bool {
	return e != nil && e.ErrorCode != nil && *e.ErrorCode == int32(codes.ResourceExhausted)
}

// truncateName keeps a name from another object short in a message.
func truncateName(s string) string {
	const limit = 64
	if len(s) <= limit {
		return s
	}
	return s[:limit] + "…"
}
