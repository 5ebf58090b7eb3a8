package operations

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/selinux"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// Keys the kubelet adds to NodePublishVolume's volume_context (reference
// §1.4, pkg/volume/csi getPodInfoAttrs and podServiceAccountTokenAttrs).
const (
	PodNameKey              = "csi.storage.k8s.io/pod.name"
	PodNamespaceKey         = "csi.storage.k8s.io/pod.namespace"
	PodUIDKey               = "csi.storage.k8s.io/pod.uid"
	ServiceAccountNameKey   = "csi.storage.k8s.io/serviceAccount.name"
	EphemeralKey            = "csi.storage.k8s.io/ephemeral"
	ServiceAccountTokensKey = "csi.storage.k8s.io/serviceAccount.tokens"
)

// accessMode maps the first of a PV's access modes to a CSI access mode as
// the kubelet does (csi_attacher.go MountDevice, csi_client.go): only
// AccessModes[0] counts, none means ReadWriteOnce, and a driver with SINGLE_NODE_MULTI_WRITER gets the
// single-node modes that tell ReadWriteOnce from ReadWriteOncePod.
func accessMode(modes []corev1.PersistentVolumeAccessMode, singleNodeMultiWriter bool) csi.VolumeCapability_AccessMode_Mode {
	mode := corev1.ReadWriteOnce
	if len(modes) > 0 {
		mode = modes[0]
	}
	switch mode {
	case corev1.ReadWriteOnce:
		if singleNodeMultiWriter {
			return csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER
		}
		return csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	case corev1.ReadOnlyMany:
		return csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
	case corev1.ReadWriteMany:
		return csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
	case corev1.ReadWriteOncePod:
		if singleNodeMultiWriter {
			return csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
		}
		return csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	}
	return csi.VolumeCapability_AccessMode_UNKNOWN
}

// isReadWriteOncePod says whether ReadWriteOncePod is the volume's only
// access mode (the kubelet's util.IsRWOP).
func isReadWriteOncePod(modes []corev1.PersistentVolumeAccessMode) bool {
	return len(modes) == 1 && modes[0] == corev1.ReadWriteOncePod
}

// capability builds volume_capability for src. Block volumes get
// access_type block; filesystem volumes get fs_type, the PV's mount options
// (and context= with the volume's SELinux context) and, when the driver has
// VOLUME_MOUNT_GROUP, volume_mount_group = fsGroup.
// Inline volumes are ReadWriteOnce without mount options, as in the kubelet.
func capability(src volume.Source, caps csiclient.NodeCapabilities, fsGroup *int64) *csi.VolumeCapability {
	modes, mountOptions := src.AccessModes, src.MountOptions
	if src.Inline {
		modes, mountOptions = nil, nil
	}
	c := &csi.VolumeCapability{
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: accessMode(modes, caps.SingleNodeMultiWriter())},
	}
	if src.AccessType == volume.Block {
		c.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
		return c
	}
	m := &csi.VolumeCapability_MountVolume{FsType: src.FSType, MountFlags: slices.Clone(mountOptions)}
	if src.SELinuxContext != "" && !src.Inline {
		// The kubelet's AddSELinuxMountOption, at stage and publish.
		m.MountFlags = append(m.MountFlags, selinux.MountOption(src.SELinuxContext))
	}
	if fsGroup != nil && caps.VolumeMountGroup() {
		m.VolumeMountGroup = strconv.FormatInt(*fsGroup, 10)
	}
	c.AccessType = &csi.VolumeCapability_Mount{Mount: m}
	return c
}

// secret reads the Secret ref names. Its values never appear in logs or
// errors.
func (o *Operations) secret(ctx context.Context, ref *volume.SecretRef) (map[string]string, error) {
	if ref == nil {
		return nil, nil
	}
	if o.secrets == nil {
		return nil, fmt.Errorf("reading Secret %s/%s: no Secret source is configured", ref.Namespace, ref.Name)
	}
	s, err := o.secrets.GetSecret(ctx, ref.Namespace, ref.Name)
	if err != nil {
		return nil, fmt.Errorf("reading Secret %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	return s, nil
}

// publishContexts builds NodePublishVolume's volume_context and secrets:
// volumeAttributes, then the pod-info keys when the driver's CSIDriver has
// podInfoOnMount, then the service account tokens when it has
// tokenRequests (in secrets instead with serviceAccountTokenInSecrets).
func (o *Operations) publishContexts(ctx context.Context, src volume.Source, pv volume.PodVolume, pol volume.Policy, secrets map[string]string) (volCtx, outSecrets map[string]string, err error) {
	volCtx = maps.Clone(src.Attributes)
	if pol.PodInfoOnMount {
		if volCtx == nil {
			volCtx = map[string]string{}
		}
		volCtx[PodNameKey] = pv.Pod.Name
		volCtx[PodNamespaceKey] = pv.Pod.Namespace
		volCtx[PodUIDKey] = string(pv.Pod.UID)
		volCtx[ServiceAccountNameKey] = pv.Pod.ServiceAccount
		volCtx[EphemeralKey] = strconv.FormatBool(src.Inline)
	}
	if len(pol.TokenRequests) == 0 {
		return volCtx, secrets, nil
	}
	if o.tokens == nil {
		return nil, nil, fmt.Errorf("%w: driver %q asks for service account tokens (CSIDriver tokenRequests) and no token issuer is configured",
			volume.ErrInvalidSpec, src.Driver)
	}
	tokens := make(map[string]authenticationv1.TokenRequestStatus, len(pol.TokenRequests))
	for _, tr := range pol.TokenRequests {
		st, err := o.tokens.ServiceAccountToken(ctx, pv.Pod, tr)
		if err != nil {
			return nil, nil, fmt.Errorf("requesting a service account token for audience %q: %w", tr.Audience, err)
		}
		tokens[tr.Audience] = st
	}
	data, err := json.Marshal(tokens)
	if err != nil {
		return nil, nil, fmt.Errorf("encoding service account tokens: %w", err)
	}
	target := &volCtx
	if pol.ServiceAccountTokenInSecrets {
		secrets = maps.Clone(secrets)
		target = &secrets
	}
	if *target == nil {
		*target = map[string]string{}
	}
	(*target)[ServiceAccountTokensKey] = string(data)
	return volCtx, secrets, nil
}
