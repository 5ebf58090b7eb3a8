package localattach

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/accessmodes"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/keymutex"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// Config configures an Attacher. Every field but Volumes, Secrets and the
// retry delays is required.
type Config struct {
	// RootDir is the agent's root directory; attachment records are kept in
	// <RootDir>/standalone/attachments.
	RootDir string
	// NodeName names this node in the VolumeAttachment names the lifecycle
	// looks up (volume.AttachmentName).
	NodeName string
	// Drivers finds registered drivers and their node IDs.
	Drivers Drivers
	// Policies says which drivers need attach.
	Policies Policies
	// Volumes finds PersistentVolumes, for readOnly and
	// controllerPublishSecretRef; nil uses neither.
	Volumes Volumes
	// Secrets reads controllerPublishSecretRef; nil fails volumes that name
	// one.
	Secrets Secrets
	// InUse says whether the lifecycle still wants a volume or holds it
	// (desired or actual state): such a volume is never detached.
	InUse func(name volume.Name) bool
	// Wanted says whether a pod wants a volume (the desired state): an
	// attach starts only for a wanted volume, so that a volume being torn
	// down is never attached again behind its teardown.
	Wanted func(name volume.Name) bool
	// Synced is closed once the desired state has seen every pod; recorded
	// attachments found at start are detached only after it.
	Synced <-chan struct{}
	// RetryBaseDelay and RetryMaxDelay bound the backoff of failed
	// detaches; 0 means 500ms and 2m2s, the kubelet's.
	RetryBaseDelay, RetryMaxDelay time.Duration
}

func (c *Config) validate() error {
	var missing []string
	for name, isNil := range map[string]bool{
		"RootDir": c.RootDir == "", "NodeName": c.NodeName == "", "Drivers": c.Drivers == nil,
		"Policies": c.Policies == nil, "InUse": c.InUse == nil, "Wanted": c.Wanted == nil, "Synced": c.Synced == nil,
	} {
		if isNil {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("localattach: missing %v", missing)
	}
	if c.RetryBaseDelay == 0 {
		c.RetryBaseDelay = 500 * time.Millisecond
	}
	if c.RetryMaxDelay == 0 {
		c.RetryMaxDelay = 2*time.Minute + 2*time.Second
	}
	return nil
}

// Attacher attaches and detaches the node's volumes itself; see the package
// documentation. It is safe for concurrent use.
type Attacher struct {
	cfg     Config
	records *recordStore
	// locks serializes attach and detach per VolumeAttachment name.
	locks keymutex.KeyMutex
	// detaches holds the volumes to detach.
	detaches workqueue.TypedRateLimitingInterface[volume.Name]

	// mu protects states and byVolume.
	mu sync.Mutex
	// states are the attachments by VolumeAttachment name.
	states map[string]*state
	// byVolume maps a volume to its VolumeAttachment name.
	byVolume map[volume.Name]string
	// older are the records New loaded in an older format, for
	// MigrateRecords.
	older []olderRecord
}

// state is what the Attacher knows of one attachment.
type state struct {
	volume volume.Name
	driver string
	pvName string
	// attached with publishContext, or the last attach error.
	attached       bool
	publishContext map[string]string
	err            error
	errTime        time.Time
	// recorded: ControllerPublishVolume was (maybe) called, so a record
	// exists and ControllerUnpublishVolume is due when it is released.
	recorded bool
}

// New returns an Attacher and loads the attachments recorded by an earlier
// run: they are detached once Run finds them unused.
func New(cfg Config) (*Attacher, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	records, err := newRecordStore(cfg.RootDir)
	if err != nil {
		return nil, err
	}
	a := &Attacher{
		cfg:     cfg,
		records: records,
		locks:   keymutex.NewHashed(0),
		detaches: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[volume.Name](cfg.RetryBaseDelay, cfg.RetryMaxDelay),
			workqueue.TypedRateLimitingQueueConfig[volume.Name]{Name: "csi_volmgr_local_detach"}),
		states:   map[string]*state{},
		byVolume: map[volume.Name]string{},
	}
	loaded, err := records.list()
	if err != nil {
		return nil, err
	}
	for vaName, r := range loaded {
		a.states[vaName] = &state{volume: r.Volume, driver: r.Driver, pvName: r.PVName, recorded: true}
		a.byVolume[r.Volume] = vaName
		if r.Format == "" {
			a.older = append(a.older, olderRecord{vaName: vaName, rec: r})
		}
	}
	return a, nil
}

// olderRecord is an attachment record New loaded in a format older than
// the current one.
type olderRecord struct {
	vaName string
	rec    record
}

// MigrateRecords rewrites the attachment records New loaded in an older
// format in the current one and returns how many it rewrote. The Manager
// calls it once, before Run, after the node's volume records were read
// with none of a newer format: until then an agent that will refuse to
// start has changed nothing on disk. A record that cannot be rewritten is
// logged and stays readable as it is; the next start tries again.
func (a *Attacher) MigrateRecords(ctx context.Context) int {
	migrated := 0
	for _, o := range a.older {
		if err := a.records.migrate(o.vaName, o.rec); err != nil {
			klog.FromContext(ctx).Error(err, "Cannot migrate an attachment record to the current format; it stays readable as it is")
			continue
		}
		migrated++
	}
	a.older = nil
	return migrated
}

// Get returns the VolumeAttachment the Attacher stands in for, as
// lifecycle/operations' Attachments interface wants it: status.attached
// with the publish_context once attached, status.attachError after a failed
// attach, the API's NotFound when the volume was never attached here.
func (a *Attacher) Get(name string) (*storagev1.VolumeAttachment, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	st, ok := a.states[name]
	if !ok {
		return nil, apierrors.NewNotFound(storagev1.Resource("volumeattachments"), name)
	}
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: st.driver,
			NodeName: a.cfg.NodeName,
			Source:   storagev1.VolumeAttachmentSource{PersistentVolumeName: &st.pvName},
		},
		Status: storagev1.VolumeAttachmentStatus{Attached: st.attached, AttachmentMetadata: maps.Clone(st.publishContext)},
	}
	if st.err != nil {
		va.Status.AttachError = &storagev1.VolumeError{Time: metav1.NewTime(st.errTime), Message: st.err.Error()}
	}
	return va, nil
}

// Attach attaches volume name (src) to this node if its driver's policy
// requires attach: with ControllerPublishVolume when the driver has the
// controller capability PUBLISH_UNPUBLISH_VOLUME (recorded durably before
// the call), otherwise by declaring it attached without a call, as the
// external-attacher does for such drivers. The outcome is what Get reports;
// the error is returned too. Inline volumes and drivers with
// attachRequired=false are left alone.
func (a *Attacher) Attach(ctx context.Context, name volume.Name, src volume.Source) error {
	if src.Inline || !a.cfg.Policies.Get(src.Driver).AttachRequired {
		return nil
	}
	vaName := volume.AttachmentName(src.Handle, src.Driver, a.cfg.NodeName)
	a.locks.LockKey(vaName)
	defer func() { _ = a.locks.UnlockKey(vaName) }()
	logger := klog.FromContext(ctx).WithValues("volume", name, "driver", src.Driver)

	publishContext, recorded, err := a.controllerPublish(ctx, name, src, vaName)
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.states[vaName]
	if st == nil {
		st = &state{}
		a.states[vaName] = st
	}
	st.volume, st.driver, st.pvName = name, src.Driver, src.PVName
	st.recorded = st.recorded || recorded
	st.attached, st.publishContext, st.err = err == nil, publishContext, err
	if err != nil {
		st.errTime = time.Now()
		logger.V(2).Info("Attach failed", "err", err)
	} else {
		logger.V(4).Info("Volume attached", "viaControllerPublish", recorded)
	}
	a.byVolume[name] = vaName
	return err
}

// controllerPublish calls ControllerPublishVolume when the driver supports
// it; recorded says whether a record was written (and so a detach is due).
func (a *Attacher) controllerPublish(ctx context.Context, name volume.Name, src volume.Source, vaName string) (map[string]string, bool, error) {
	client, nodeID, err := a.driver(src.Driver)
	if err != nil {
		return nil, false, err
	}
	caps, err := client.ControllerCapabilities(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("getting the controller capabilities: %w", err)
	}
	if !caps.PublishUnpublish() {
		return nil, false, nil
	}
	rec := record{Volume: name, Driver: src.Driver, Handle: src.Handle, NodeID: nodeID, PVName: src.PVName}
	if a.cfg.Volumes != nil && src.PVName != "" {
		if pv, err := a.cfg.Volumes.PV(src.PVName); err == nil && pv.Spec.CSI != nil {
			rec.ReadOnly = pv.Spec.CSI.ReadOnly
			if ref := pv.Spec.CSI.ControllerPublishSecretRef; ref != nil {
				rec.Secret = &volume.SecretRef{Namespace: ref.Namespace, Name: ref.Name}
			}
		}
	}
	secrets, err := a.secrets(ctx, rec.Secret)
	if err != nil {
		return nil, false, err
	}
	mode, err := accessmodes.ToCSIAccessMode(src.AccessModes, caps.SingleNodeMultiWriter())
	if err != nil {
		return nil, false, fmt.Errorf("%w: %w", volume.ErrInvalidSpec, err)
	}
	// The record goes first: if the agent dies during the call, the volume
	// may be attached, and the next run must know to detach it.
	a.mu.Lock()
	recordedBefore := a.states[vaName] != nil && a.states[vaName].recorded
	a.mu.Unlock()
	if err := a.records.write(vaName, rec); err != nil {
		return nil, false, err
	}
	// The reconciler decided to attach while a pod wanted the volume; the
	// pod may be gone by now and the volume's teardown under way. Decide
	// again right before the call: an attach never starts behind a
	// teardown, and one that did start is followed by the teardown's
	// detach (the lock above orders it before that detach).
	if !a.cfg.Wanted(name) {
		if !recordedBefore {
			if err := a.records.remove(vaName); err != nil {
				return nil, true, err
			}
		}
		return nil, recordedBefore, fmt.Errorf("%w: no pod wants %s any more, so it is not attached", volume.ErrNotAttached, name)
	}
	resp, err := client.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{
		VolumeId:         src.Handle,
		NodeId:           nodeID,
		VolumeCapability: capability(src, mode),
		Readonly:         rec.ReadOnly,
		Secrets:          secrets,
		VolumeContext:    maps.Clone(src.Attributes),
	})
	if err != nil {
		return nil, true, err
	}
	return resp.GetPublishContext(), true, nil
}

// driver returns a registered driver's connection and node ID, or an error
// wrapping volume.ErrDriverNotRegistered.
func (a *Attacher) driver(name string) (*csiclient.Client, string, error) {
	client, ok := a.cfg.Drivers.Client(name)
	nodeID, registered := a.cfg.Drivers.NodeID(name)
	if !ok || !registered || client == nil {
		return nil, "", fmt.Errorf("%w: %q", volume.ErrDriverNotRegistered, name)
	}
	return client, nodeID, nil
}

// capability is the volume_capability of ControllerPublishVolume, built from
// the PersistentVolume as the external-attacher builds it.
func capability(src volume.Source, mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	c := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode}}
	if src.AccessType == volume.Block {
		c.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
		return c
	}
	c.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{
		FsType: src.FSType, MountFlags: src.MountOptions,
	}}
	return c
}

func (a *Attacher) secrets(ctx context.Context, ref *volume.SecretRef) (map[string]string, error) {
	if ref == nil {
		return nil, nil
	}
	if a.cfg.Secrets == nil {
		return nil, fmt.Errorf("reading Secret %s/%s: no Secret source is configured", ref.Namespace, ref.Name)
	}
	s, err := a.cfg.Secrets.GetSecret(ctx, ref.Namespace, ref.Name)
	if err != nil {
		return nil, fmt.Errorf("reading controllerPublishSecretRef %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	return s, nil
}
