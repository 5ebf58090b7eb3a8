package check

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/operations"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// nodeName is the node the check's volume manager stands for.
const nodeName = "csi-volmgr-check"

// secretNamespace and secretName name the Secret of Config.Secrets in the
// volumes' secret references.
const (
	secretNamespace = "csi-volmgr-check"
	secretName      = "check-secrets"
)

// staticSecrets is the Secret source of the check's volume managers: the one
// Secret of Config.Secrets.
type staticSecrets map[string]string

func (s staticSecrets) GetSecret(_ context.Context, namespace, name string) (map[string]string, error) {
	if namespace != secretNamespace || name != secretName || s == nil {
		return nil, apierrors.NewNotFound(corev1.Resource("secrets"), namespace+"/"+name)
	}
	return maps.Clone(s), nil
}

// run is one scenario's run: its root and what it made.
type run struct {
	*env
	name string
	root string

	mu       sync.Mutex
	vols     []*vol
	managers []*manager
}

// vol is a volume of the scenario.
type vol struct {
	src  volume.Source
	name volume.Name
	// created and attached say what the check must undo.
	created, attached bool
	publishContext    map[string]string
	// readOnly makes every pod's publish read-only (Config.ReadOnly).
	readOnly bool
}

// manager is one volume manager: an actual state and operations over the
// scenario's root, as the agent has them.
type manager struct {
	world *asw.World
	ops   *operations.Operations
}

// attachments is the VolumeAttachment cache the operations read: what the
// check's own ControllerPublishVolume calls returned.
type attachments struct {
	r *run
}

func (a attachments) Get(name string) (*storagev1.VolumeAttachment, error) {
	a.r.mu.Lock()
	defer a.r.mu.Unlock()
	for _, v := range a.r.vols {
		if volume.AttachmentName(v.src.Handle, v.src.Driver, nodeName) == name && v.attached {
			return attachment(name, v.src, v.publishContext), nil
		}
	}
	return nil, apierrors.NewNotFound(storagev1.Resource("volumeattachments"), name)
}

// attachment is the VolumeAttachment of src on the check's node, attached
// with publishContext, as the external-attacher leaves it.
func attachment(name string, src volume.Source, publishContext map[string]string) *storagev1.VolumeAttachment {
	pv := src.PVName
	return &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: src.Driver, NodeName: nodeName,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}},
		Status: storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: publishContext}}
}

type policies struct{ p volume.Policy }

func (p policies) Get(string) volume.Policy { return p.p }

// policy is the driver's policy as the check reads it: a CSIDriver with
// attachRequired when the controller attaches, the defaults otherwise.
func (e *env) policy() volume.Policy {
	p := volume.DefaultPolicy()
	p.AttachRequired = e.hasController && e.ctrlCaps.PublishUnpublish()
	p.FSGroupPolicy = storagev1.FileFSGroupPolicy
	if e.cfg.Ephemeral {
		p.AttachRequired = false
		p.PodInfoOnMount = true
		p.VolumeLifecycleModes = []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecycleEphemeral}
	}
	return p
}

// newManager starts a volume manager over the scenario's root: after a
// crash, a new one with an empty actual state.
func (r *run) newManager() (*manager, error) {
	w := asw.New(asw.Options{})
	ops, err := operations.New(operations.Config{
		RootDir:     r.root,
		NodeName:    nodeName,
		Drivers:     operations.DriversFunc(func(string) (operations.DriverClient, bool) { return r.rec, true }),
		Policies:    policies{r.policy()},
		Attachments: attachments{r},
		Secrets:     staticSecrets(r.cfg.Secrets),
		State:       w,
	})
	if err != nil {
		return nil, err
	}
	m := &manager{world: w, ops: ops}
	r.mu.Lock()
	r.managers = append(r.managers, m)
	r.mu.Unlock()
	return m, nil
}

// newVolume creates (or, without a controller, takes --volume-handle) a
// volume and attaches it when the driver attaches.
func (r *run) newVolume(ctx context.Context, access volume.AccessType) (*vol, error) {
	mode := csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	if r.nodeCaps.SingleNodeMultiWriter() {
		mode = csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER
	}
	c := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode}}
	if access == volume.Block {
		c.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
	} else {
		c.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}
	}
	if r.cfg.Ephemeral {
		return r.inlineVolume(access), nil
	}
	v := &vol{}
	pvName := fmt.Sprintf("check-%s-%s", r.name, randomHex(4))
	handle, attrs, size := r.cfg.VolumeHandle, r.cfg.VolumeContext, r.cfg.VolumeSize
	if r.canCreate() {
		start := time.Now()
		resp, err := r.ctrl.Controller().CreateVolume(ctx, &csi.CreateVolumeRequest{
			Name: pvName, VolumeCapabilities: []*csi.VolumeCapability{c}, Parameters: r.cfg.Params,
			CapacityRange:             &csi.CapacityRange{RequiredBytes: r.cfg.VolumeSize},
			AccessibilityRequirements: r.accessibility(),
		})
		r.rec.controller("CreateVolume", start, err)
		if access == volume.Block && status.Code(err) == codes.InvalidArgument {
			// The driver's answer to a capability it does not offer
			// (csi-sanity's): no kubelet ever publishes a block volume of it.
			return nil, &skip{reason: "the driver refuses block volumes: CreateVolume answered " + describe(err)}
		}
		if err != nil {
			return nil, fail("CreateVolume", "a new volume", err)
		}
		v.created = true
		handle, attrs = resp.GetVolume().GetVolumeId(), resp.GetVolume().GetVolumeContext()
		if resp.GetVolume().GetCapacityBytes() > 0 {
			size = resp.GetVolume().GetCapacityBytes()
		}
	}
	v.src = volume.Source{
		ID:            volume.ID{Driver: r.driver, Handle: handle, PVName: pvName, AccessType: access},
		AccessModes:   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		Attributes:    attrs,
		CapacityBytes: size,
	}
	if len(r.cfg.Secrets) > 0 {
		ref := &volume.SecretRef{Namespace: secretNamespace, Name: secretName}
		v.src.StageSecret, v.src.PublishSecret, v.src.ExpandSecret = ref, ref, ref
	}
	v.name = volume.PersistentName(r.driver, handle)
	r.mu.Lock()
	r.vols = append(r.vols, v)
	r.mu.Unlock()
	if r.policy().AttachRequired {
		start := time.Now()
		resp, err := r.ctrl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{
			VolumeId: handle, NodeId: r.nodeID, VolumeCapability: c, VolumeContext: attrs,
		})
		r.rec.controller("ControllerPublishVolume", start, err)
		if err != nil {
			return nil, fail("ControllerPublishVolume", "the volume attached to the node "+r.nodeID, err)
		}
		r.mu.Lock()
		v.attached, v.publishContext = true, resp.GetPublishContext()
		r.mu.Unlock()
	}
	return v, nil
}

// inlineVolume is pod-0's CSI inline volume, as the populator resolves one:
// nothing to create or attach.
func (r *run) inlineVolume(access volume.AccessType) *vol {
	uid := podUID(0)
	v := &vol{
		src: volume.Source{
			ID:          volume.ID{Driver: r.driver, Handle: volume.InlineHandle(uid, specName), AccessType: access},
			Inline:      true,
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Attributes:  maps.Clone(r.cfg.VolumeContext),
		},
		name:     volume.InlineName(uid, specName),
		readOnly: r.cfg.ReadOnly,
	}
	r.mu.Lock()
	r.vols = append(r.vols, v)
	r.mu.Unlock()
	return v
}

// specName is the name of the check's volume in its pods' specs.
const specName = "data"

// podUID is the UID of the check's i-th pod.
func podUID(i int) types.UID {
	return types.UID(fmt.Sprintf("c4ec0000-0000-4000-8000-%012d", i))
}

// pod returns the key and use of the i-th pod of v.
func pod(v *vol, i int) (volume.PodKey, volume.PodVolume) {
	uid := podUID(i)
	return volume.PodKey{Volume: v.name, Pod: uid},
		volume.PodVolume{Pod: volume.PodInfo{UID: uid, Namespace: "csi-volmgr-check", Name: fmt.Sprintf("pod-%d", i), ServiceAccount: "default"},
			SpecName: specName, ReadOnly: v.readOnly}
}

// stage runs WaitForAttach and Stage, as the reconciler's volume worker.
func (m *manager) stage(ctx context.Context, v *vol, fsGroup *int64) error {
	if err := m.ops.WaitForAttach(ctx, v.name, v.src); err != nil {
		return err
	}
	return m.ops.Stage(ctx, v.name, v.src, fsGroup)
}

// target returns where a pod sees the volume: the target path of its
// filesystem volume, the device of its block volume.
func (m *manager) target(key volume.PodKey) (string, error) {
	p, ok := m.world.Pod(key)
	if !ok || p.State != volume.Published {
		return "", fmt.Errorf("%s is not published for pod %s", key.Volume, key.Pod)
	}
	if p.Presentation.DevicePath != "" {
		return p.Presentation.DevicePath, nil
	}
	return p.TargetPath, nil
}

// stagingPath returns the volume's staging path.
func (m *manager) stagingPath(v *vol) string {
	if v.src.Inline {
		return "" // never staged
	}
	st, err := m.ops.Layout().Staging(v.src.ID)
	if err != nil {
		return ""
	}
	return st.Path
}

// teardown unpublishes every pod of the managers' actual states and
// unstages every volume, as the reconciler does when the pods are gone.
func (r *run) teardown(ctx context.Context) []string {
	var problems []string
	r.mu.Lock()
	managers := slices.Clone(r.managers)
	r.mu.Unlock()
	slices.Reverse(managers)
	for _, m := range managers {
		for _, vs := range m.world.Snapshot() {
			for _, p := range vs.Pods {
				if err := m.ops.Unpublish(ctx, p.Key); err != nil {
					problems = append(problems, fmt.Sprintf("unpublishing %s for pod %s: %s", vs.Name, p.Key.Pod, describe(err)))
				}
			}
			if err := m.ops.Unstage(ctx, vs.Name); err != nil {
				problems = append(problems, fmt.Sprintf("unstaging %s: %s", vs.Name, describe(err)))
			}
		}
	}
	return problems
}

// cleanup tears down what the scenario made and returns what it found
// left over: the volumes, their attachments, mounts and directories below
// the scenario's root.
func (r *run) cleanup(ctx context.Context) []string {
	problems := r.teardown(ctx)
	// After a crash scenario, what the dead manager left is only on disk.
	if m, err := r.newManager(); err == nil {
		if err := reconstructInto(ctx, m); err == nil {
			problems = append(problems, r.teardown(ctx)...)
		}
	}
	problems = append(problems, sweep(ctx, r.root)...)
	r.mu.Lock()
	vols := slices.Clone(r.vols)
	r.mu.Unlock()
	for _, v := range vols {
		if v.attached {
			start := time.Now()
			err := r.ctrl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: v.src.Handle, NodeId: r.nodeID})
			r.rec.controller("ControllerUnpublishVolume", start, err)
			if err != nil {
				problems = append(problems, fmt.Sprintf("ControllerUnpublishVolume of %s: %s", v.src.Handle, describe(err)))
			}
		}
		if v.created {
			start := time.Now()
			_, err := r.ctrl.Controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.src.Handle})
			r.rec.controller("DeleteVolume", start, err)
			if err != nil {
				problems = append(problems, fmt.Sprintf("DeleteVolume of %s: %s", v.src.Handle, describe(err)))
			}
		}
	}
	if err := removeRoot(r.root); err != nil {
		problems = append(problems, err.Error())
	}
	return problems
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
