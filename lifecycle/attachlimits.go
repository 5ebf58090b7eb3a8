package lifecycle

import (
	"google.golang.org/grpc/codes"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/source"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// AttachLimits is told when an attach failed because the node reached a
// driver's volume limit (the VolumeAttachment's attachError has errorCode
// ResourceExhausted, KEP-4876), so that the driver's allocatable count in
// the CSINode is refreshed, as the kubelet does. The wiring adapts the
// driver layer's refresher to it.
type AttachLimits interface {
	// ResourceExhausted asks for a refresh of the driver's count. It must
	// not block.
	ResourceExhausted(driver string)
}

// watchAttachLimits tells limits of every VolumeAttachment of a wanted
// volume whose attach failed with ResourceExhausted.
func watchAttachLimits(m *Manager, src *source.Source) {
	limits := m.cfg.AttachLimits
	if limits == nil {
		return
	}
	vas := src.Attachments()
	src.OnAttachmentChange(func(name volume.Name) {
		s, ok := m.desire.Volume(name)
		if !ok || s.Inline {
			return
		}
		va, err := vas.Get(volume.AttachmentName(s.Handle, s.Driver, m.cfg.NodeName))
		if err != nil || va.Status.Attached {
			return
		}
		if e := va.Status.AttachError; e != nil && e.ErrorCode != nil && *e.ErrorCode == int32(codes.ResourceExhausted) {
			limits.ResourceExhausted(s.Driver)
		}
	})
}
