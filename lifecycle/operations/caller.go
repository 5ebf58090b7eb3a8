package operations

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/proto"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// Requests of a container orchestrator.
//
// The front endpoint (front/) serves CSI to a container orchestrator
// (CO) in front of a registered driver. The methods below run the CO's Node
// requests through the same steps as the reconciler's: the same locks, the
// same state transitions (transitions.go), the same asw records and the
// same on-disk records written before the driver is called, the same
// Observer. What differs is where the paths come from: the CO chooses
// staging_target_path and target_path, and its request goes to the driver
// as it came (secrets, publish_context, volume_context, capability). The
// records of such steps live under <root>/front (paths.CallerVolume) and
// their asw entries are marked External, which keeps the reconciler from
// tearing them down: they are the CO's.
//
// The volume of a request is volume.PersistentName(driver, volume_id), the
// Name a PersistentVolume with that handle has, so a CO's step and the
// reconciler's steps on the same volume are serialized by the same lock.
// A publish is keyed by a pod UID the caller derives from the target path.
//
// The CSI idempotency rules hold even when the driver's do not: a request
// identical (secrets aside) to the last one that succeeded for a stage or
// publish still in place returns nil without calling the driver, and an
// unstage or unpublish of something not staged or published by a CO at
// that path returns nil without calling the driver.

// StageRequest stages a volume of driver as a CO asked (NodeStageVolume).
// It fails with an error wrapping volume.ErrInUse when the volume is staged
// by the reconciler, or by a CO at another staging path.
func (o *Operations) StageRequest(ctx context.Context, driver string, req *csi.NodeStageVolumeRequest) (err error) {
	name := volume.PersistentName(driver, req.GetVolumeId())
	unlock, err := o.locks.lockVolume(ctx, name, true)
	if err != nil {
		return err
	}
	defer unlock()
	start := time.Now()
	defer func() { o.observe(driver, volume.StepStage, accessOf(req.GetVolumeCapability()), false, start, err) }()
	s := o.beginStage(ctx, name, requestID(driver, req.GetVolumeId(), req.GetVolumeCapability()), true)

	path, digest := req.GetStagingTargetPath(), requestDigest(req)
	if s.known && s.prev.Stage != volume.NotStaged {
		switch {
		case !s.prev.External:
			return fmt.Errorf("%w: %s is staged at %s by this node's reconciler", volume.ErrInUse, name, s.prev.StagingPath)
		case s.prev.StagingPath != path:
			return fmt.Errorf("%w: %s is already staged at %s", volume.ErrInUse, name, s.prev.StagingPath)
		case s.prev.Stage == volume.Staged && o.digests.stage(name) == digest:
			s.logger.V(4).Info("Volume is already staged as asked", "stagingTargetPath", path)
			return nil
		}
	}
	client, err := o.driver(driver)
	if err != nil {
		return s.fail(err)
	}
	site, err := o.callerStaging(s.id, path)
	if err != nil {
		return s.fail(err)
	}
	err = s.run(ctx, stagePlan{
		client: client,
		site:   site,
		record: checkpoint.StageRecord{
			VolumeHandle: s.id.Handle,
			DriverName:   driver,
			VolumeName:   name,
			PVName:       s.id.PVName,
			AccessType:   s.id.AccessType,
			StagingPath:  path,
		},
		req: req,
	})
	o.digests.setStage(name, digest, err == nil)
	return err
}

// UnstageRequest unstages a volume of driver as a CO asked
// (NodeUnstageVolume): Unstage's rule, checks and outcomes at the caller's
// staging path. A volume not staged by a CO at that path is left alone.
func (o *Operations) UnstageRequest(ctx context.Context, driver string, req *csi.NodeUnstageVolumeRequest) error {
	return o.unstage(ctx, volume.PersistentName(driver, req.GetVolumeId()), req.GetStagingTargetPath())
}

// PublishRequest publishes a volume of driver for pseudo pod pod as a CO
// asked (NodePublishVolume). It fails with an error wrapping
// volume.ErrInUse when the key is the reconciler's.
func (o *Operations) PublishRequest(ctx context.Context, driver string, pod types.UID, req *csi.NodePublishVolumeRequest) (err error) {
	key := volume.PodKey{Volume: volume.PersistentName(driver, req.GetVolumeId()), Pod: pod}
	unlock, err := o.locks.lockPod(ctx, key, false)
	if err != nil {
		return err
	}
	defer unlock()
	start := time.Now()
	defer func() { o.observe(driver, volume.StepPublish, accessOf(req.GetVolumeCapability()), false, start, err) }()
	s := o.beginPublish(ctx, key, requestID(driver, req.GetVolumeId(), req.GetVolumeCapability()), true)

	target, digest := req.GetTargetPath(), requestDigest(req)
	if s.known {
		switch {
		case !s.prev.External || (s.prev.TargetPath != "" && s.prev.TargetPath != target):
			return fmt.Errorf("%w: %s is published at %s by another caller", volume.ErrInUse, key, s.prev.TargetPath)
		case s.prev.State == volume.Published && o.digests.publish(key) == digest:
			s.logger.V(4).Info("Volume is already published as asked", "targetPath", target)
			return nil
		}
	}
	client, err := o.driver(driver)
	if err != nil {
		return s.fail(err)
	}
	site, err := o.callerPublishing(s.id, key, target)
	if err != nil {
		return s.fail(err)
	}
	err = s.run(ctx, publishPlan{
		client: client,
		site:   site,
		record: checkpoint.PublishRecord{
			SpecVolID:           s.id.Handle,
			VolumeHandle:        s.id.Handle,
			DriverName:          driver,
			NodeName:            o.nodeName,
			VolumeLifecycleMode: storagev1.VolumeLifecyclePersistent,
			VolumeName:          key.Volume,
			PodUID:              pod,
			AccessType:          s.id.AccessType,
			TargetPath:          target,
		},
		req: req,
	})
	o.digests.setPublish(key, digest, err == nil)
	return err
}

// UnpublishRequest unpublishes a volume of driver for pseudo pod pod as a
// CO asked (NodeUnpublishVolume): Unpublish's calls and outcomes at the
// caller's target. A target not published by a CO is left alone.
func (o *Operations) UnpublishRequest(ctx context.Context, driver string, pod types.UID, req *csi.NodeUnpublishVolumeRequest) error {
	key := volume.PodKey{Volume: volume.PersistentName(driver, req.GetVolumeId()), Pod: pod}
	return o.unpublish(ctx, key, req.GetTargetPath())
}

// VolumeStats calls NodeGetVolumeStats for a volume of driver that this
// node has staged or published at req's volume_path, whoever asked for it;
// any other volume or path is an error wrapping volume.ErrNotFound. It
// holds the volume's lock shared, so it never runs during a stage or
// unstage of the volume.
func (o *Operations) VolumeStats(ctx context.Context, driver string, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	name := volume.PersistentName(driver, req.GetVolumeId())
	unlock, err := o.locks.lockVolume(ctx, name, false)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := o.knowsPath(name, req.GetVolumePath()); err != nil {
		return nil, err
	}
	client, err := o.driver(driver)
	if err != nil {
		return nil, err
	}
	return client.NodeGetVolumeStats(ctx, req)
}

// ExpandVolume calls NodeExpandVolume for a volume of driver that this
// node has staged or published at req's volume_path (else an error wrapping
// volume.ErrNotFound), holding the volume's lock exclusively as a stage
// does, and reports the step to the Observer as volume.StepExpand.
func (o *Operations) ExpandVolume(ctx context.Context, driver string, req *csi.NodeExpandVolumeRequest) (resp *csi.NodeExpandVolumeResponse, err error) {
	name := volume.PersistentName(driver, req.GetVolumeId())
	unlock, err := o.locks.lockVolume(ctx, name, true)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := o.knowsPath(name, req.GetVolumePath()); err != nil {
		return nil, err
	}
	start := time.Now()
	defer func() { o.observe(driver, volume.StepExpand, accessOf(req.GetVolumeCapability()), false, start, err) }()
	client, err := o.driver(driver)
	if err != nil {
		return nil, err
	}
	resp, err = client.NodeExpandVolume(ctx, req)
	if err != nil {
		klog.FromContext(ctx).V(2).Info("NodeExpandVolume failed", "volume", name, "driver", driver, "err", err)
		return nil, err
	}
	return resp, nil
}

// NodeCapabilities returns the node capabilities of driver, or an error
// wrapping volume.ErrDriverNotRegistered.
func (o *Operations) NodeCapabilities(ctx context.Context, driver string) (csiclient.NodeCapabilities, error) {
	client, err := o.driver(driver)
	if err != nil {
		return csiclient.NodeCapabilities{}, err
	}
	return client.NodeCapabilities(ctx)
}

// NodeInfo returns driver's NodeGetInfo answer, or an error wrapping
// volume.ErrDriverNotRegistered.
func (o *Operations) NodeInfo(ctx context.Context, driver string) (*csi.NodeGetInfoResponse, error) {
	client, err := o.driver(driver)
	if err != nil {
		return nil, err
	}
	return client.NodeGetInfo(ctx)
}

// knowsPath returns nil when volume name is staged at path or published at
// path for some pod (present or uncertain), and an error wrapping
// volume.ErrNotFound otherwise.
func (o *Operations) knowsPath(name volume.Name, path string) error {
	v, ok := o.state.Volume(name)
	if !ok {
		return fmt.Errorf("%w: %s", volume.ErrNotFound, name)
	}
	if v.Stage != volume.NotStaged && v.StagingPath == path {
		return nil
	}
	for _, uid := range o.state.Publishers(name) {
		if p, ok := o.state.Pod(volume.PodKey{Volume: name, Pod: uid}); ok && p.TargetPath == path {
			return nil
		}
	}
	return fmt.Errorf("%w: %s is neither staged nor published at %q", volume.ErrNotFound, name, path)
}

// requestID is what the asw records about the volume of a CO's request.
func requestID(driver, handle string, c *csi.VolumeCapability) volume.ID {
	return volume.ID{Driver: driver, Handle: handle, AccessType: accessOf(c)}
}

// accessOf is the access type of a CO's volume capability.
func accessOf(c *csi.VolumeCapability) volume.AccessType {
	if c.GetBlock() != nil {
		return volume.Block
	}
	return volume.Filesystem
}

// requestDigest is the hex SHA-256 of req's deterministic encoding without
// its secrets: two requests with the same digest ask for the same thing.
func requestDigest(req proto.Message) string {
	c := proto.Clone(req)
	switch r := c.(type) {
	case *csi.NodeStageVolumeRequest:
		r.Secrets = nil
	case *csi.NodePublishVolumeRequest:
		r.Secrets = nil
	}
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	if err != nil {
		// Unreachable for these messages; no digest never matches.
		return ""
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// digests remembers the digest of the last request that succeeded for each
// stage and publish a CO asked for and that is still in place. An entry is
// read and written under its step's lock (volume or pod); mu guards the
// maps themselves.
type digests struct {
	mu        sync.Mutex
	stages    map[volume.Name]string
	publishes map[volume.PodKey]string
}

func newDigests() *digests {
	return &digests{stages: map[volume.Name]string{}, publishes: map[volume.PodKey]string{}}
}

func (d *digests) stage(name volume.Name) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stages[name]
}

func (d *digests) publish(key volume.PodKey) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.publishes[key]
}

// setStage remembers digest for name after a success, forgets it otherwise.
func (d *digests) setStage(name volume.Name, digest string, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if ok && digest != "" {
		d.stages[name] = digest
	} else {
		delete(d.stages, name)
	}
}

// setPublish remembers digest for key after a success, forgets it otherwise.
func (d *digests) setPublish(key volume.PodKey, digest string, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if ok && digest != "" {
		d.publishes[key] = digest
	} else {
		delete(d.publishes, key)
	}
}

// forgetVolume drops the digests of name and of its pods.
func (d *digests) forgetVolume(name volume.Name) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.stages, name)
	for key := range d.publishes {
		if key.Volume == name {
			delete(d.publishes, key)
		}
	}
}

// forgetPod drops the digest of key.
func (d *digests) forgetPod(key volume.PodKey) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.publishes, key)
}

// forgetVolume forgets a volume in the actual state and its digests.
func (o *Operations) forgetVolume(name volume.Name) {
	o.state.ForgetVolume(name)
	o.digests.forgetVolume(name)
}

// forgetPod forgets a pod's entry in the actual state and its digest.
func (o *Operations) forgetPod(key volume.PodKey) {
	o.state.ForgetPod(key)
	o.digests.forgetPod(key)
}
