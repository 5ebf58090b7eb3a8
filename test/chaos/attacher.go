package chaos

import (
	"context"
	"fmt"
	"slices"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// attacher plays the attach/detach controller and the external attacher for the volumes of the
// attach-required driver, as they work in a cluster: a volume a live pod on the node uses is
// attached (ControllerPublishVolume, then a VolumeAttachment with attached=true and the
// publish_context as attachmentMetadata); one no live pod uses is detached once the node no
// longer lists it in node.status.volumesInUse. Detaching a volume the plugin's journal shows
// staged or published is a violation of InvDetachStaged: the agent dropped it from
// volumesInUse too early. Such a volume is left attached.
type attacher struct {
	h        *Harness
	attached map[VolKey]bool
	// reported holds the volumes already reported as detached while staged, to report each
	// episode once.
	reported map[VolKey]bool
	attaches int
	detaches int
}

func (h *Harness) runAttacher(ctx context.Context) {
	a := &attacher{h: h, attached: map[VolKey]bool{}, reported: map[VolKey]bool{}}
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			h.stats.setAttach(a.attaches, a.detaches)
			return
		case <-tick.C:
		}
		if h.apiDown.Load() {
			continue
		}
		a.sync(ctx)
		h.stats.setAttach(a.attaches, a.detaches)
	}
}

func (a *attacher) sync(ctx context.Context) {
	h := a.h
	for _, v := range h.vols.byKind[kindAttach] {
		if ctx.Err() != nil || h.apiDown.Load() {
			return
		}
		wanted := h.vols.wanted(v.key)
		switch {
		case wanted && !a.attached[v.key]:
			if err := a.attach(ctx, v); err != nil {
				continue
			}
			a.attached[v.key] = true
			a.attaches++
			delete(a.reported, v.key)
		case !wanted && a.attached[v.key]:
			ok, err := a.mayDetach(ctx, v)
			if err != nil || !ok {
				continue
			}
			if err := a.detach(ctx, v); err != nil {
				continue
			}
			a.attached[v.key] = false
			a.detaches++
		}
	}
}

func attachmentName(v *poolVolume) string {
	return volume.AttachmentName(v.key.Handle, v.key.Driver, nodeName)
}

// attach calls ControllerPublishVolume and writes the attached VolumeAttachment.
func (a *attacher) attach(ctx context.Context, v *poolVolume) error {
	h := a.h
	dp := h.plugins[roleAttach]
	pc, err := dp.controllerPublish(ctx, v.key.Handle, true)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	vas := h.client.StorageV1().VolumeAttachments()
	va, err := vas.Create(ctx, &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: attachmentName(v)},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: v.key.Driver, NodeName: nodeName,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &v.pvName},
		},
	}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		va, err = vas.Get(ctx, attachmentName(v), metav1.GetOptions{})
	}
	if err != nil {
		return err
	}
	va.Status = storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: pc}
	_, err = vas.UpdateStatus(ctx, va, metav1.UpdateOptions{})
	return err
}

// mayDetach says whether the node no longer reports the volume in use; a volume that is not
// reported but that the journal shows staged is a violation and stays attached.
func (a *attacher) mayDetach(ctx context.Context, v *poolVolume) (bool, error) {
	h := a.h
	name := corev1.UniqueVolumeName(volume.PersistentName(v.key.Driver, v.key.Handle))
	inUse := func() (bool, error) {
		ctx, cancel := context.WithTimeout(ctx, apiTimeout)
		defer cancel()
		node, err := h.client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return slices.Contains(node.Status.VolumesInUse, name), nil
	}
	if used, err := inUse(); err != nil || used {
		return false, err
	}
	if err := h.pumpJournals(); err != nil {
		return false, err
	}
	return judgeDetach(h.checker, v.key, func() (bool, error) {
		used, err := inUse()
		return !used && !h.vols.wanted(v.key), err
	}, a.reported, time.Now())
}

// judgeDetach decides whether a volume the node did not report in use may be detached: not
// when the journal shows it staged, uncertainly staged or published (or a step of it in
// flight). When it is, and stillUnused (asked again: the agent may have just reported it and
// staged it) says the node still does not report it and no live pod wants it, the agent dropped
// it from volumesInUse too early: a violation of InvDetachStaged, reported once per episode
// (reported).
func judgeDetach(c *Checker, k VolKey, stillUnused func() (bool, error), reported map[VolKey]bool, now time.Time) (bool, error) {
	held, why := c.Staged(k)
	if !held {
		return true, nil
	}
	if unused, err := stillUnused(); err != nil || !unused {
		return false, err
	}
	if !reported[k] {
		reported[k] = true
		c.Violate(InvDetachStaged, now, "%s is not in node.status.volumesInUse while %s", k, why)
	}
	return false, nil
}

// detach deletes the VolumeAttachment and calls ControllerUnpublishVolume.
func (a *attacher) detach(ctx context.Context, v *poolVolume) error {
	h := a.h
	cctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	err := h.client.StorageV1().VolumeAttachments().Delete(cctx, attachmentName(v), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	_, err = h.plugins[roleAttach].controllerPublish(ctx, v.key.Handle, false)
	return err
}

// controllerPublish calls ControllerPublishVolume (publish) or ControllerUnpublishVolume for the
// plugin's node.
func (dp *driverPlugin) controllerPublish(ctx context.Context, handle string, publish bool) (map[string]string, error) {
	dp.mu.Lock()
	defer dp.mu.Unlock()
	conn, err := dp.Dial()
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	c := csi.NewControllerClient(conn)
	if !publish {
		_, err := c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: handle, NodeId: nodeName})
		return nil, err
	}
	resp, err := c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{
		VolumeId: handle, NodeId: nodeName,
		VolumeCapability: &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("ControllerPublishVolume %s: %w", handle, err)
	}
	return resp.GetPublishContext(), nil
}
