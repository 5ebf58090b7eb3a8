package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// ErrCorrupt is wrapped by the error a Read function returns for a record
// that exists but cannot be used: not a JSON object of strings, or missing a
// required key. A missing record is fs.ErrNotExist instead.
var ErrCorrupt = errors.New("corrupt volume record")

// Keys of the records. The first group is the kubelet's (pkg/volume/csi
// volDataKey), the second csi-volmgr's additions.
const (
	keySpecVolID           = "specVolID"
	keyVolumeHandle        = "volumeHandle"
	keyDriverName          = "driverName"
	keyNodeName            = "nodeName"
	keyAttachmentID        = "attachmentID"
	keyVolumeLifecycleMode = "volumeLifecycleMode"
	keySELinuxMountContext = "seLinuxMountContext"

	keyVolumeName  = "volumeName"
	keyPodUID      = "podUID"
	keyAccessType  = "accessType"
	keyTargetPath  = "targetPath"
	keyPVName      = "pvName"
	keyStagingPath = "stagingPath"
)

// PublishRecord is the vol_data.json of one pod's use of a volume, written
// before NodePublishVolume. With it alone a restarted agent can call
// NodeUnpublishVolume and find the volume's asw entry again.
type PublishRecord struct {
	// SpecVolID is the PV name, or the pod's volume name for inline volumes.
	SpecVolID string
	// VolumeHandle is the CSI volume_id.
	VolumeHandle string
	// DriverName is the CSI driver name.
	DriverName string
	// NodeName is the node the volume was published on.
	NodeName string
	// AttachmentID is the VolumeAttachment name of (handle, driver, node).
	AttachmentID string
	// VolumeLifecycleMode is Persistent or Ephemeral (inline).
	VolumeLifecycleMode storagev1.VolumeLifecycleMode
	// SELinuxMountContext is the SELinux context the volume was published
	// with (-o context=...), empty for none.
	SELinuxMountContext string

	// VolumeName is the volume's lifecycle name.
	VolumeName volume.Name
	// PodUID is the pod's UID.
	PodUID types.UID
	// AccessType is Filesystem or Block.
	AccessType volume.AccessType
	// TargetPath is the target_path passed to NodePublishVolume.
	TargetPath string
}

// StageRecord is the vol_data.json beside a volume's staging directory,
// written before NodeStageVolume and removed after NodeUnstageVolume
// succeeded. With it alone a restarted agent can call NodeUnstageVolume.
type StageRecord struct {
	// VolumeHandle is the CSI volume_id.
	VolumeHandle string
	// DriverName is the CSI driver name.
	DriverName string
	// SELinuxMountContext is the SELinux context the volume was staged
	// with, empty for none.
	SELinuxMountContext string

	// VolumeName is the volume's lifecycle name.
	VolumeName volume.Name
	// PVName is the PersistentVolume's name (needed for block staging paths).
	PVName string
	// AccessType is Filesystem or Block.
	AccessType volume.AccessType
	// StagingPath is the staging_target_path passed to NodeStageVolume.
	StagingPath string
}

// WritePublish writes r to path atomically, not durably (see
// ReplaceFile): a publish does not outlive a reboot (its mount is gone),
// and a killed agent finds the record in the page cache; an fsync would buy
// nothing but milliseconds on every pod start. The kubelet does not sync
// its vol_data.json either.
func WritePublish(path string, r PublishRecord) error {
	return writeRecord(path, ReplaceFile, map[string]string{
		keySpecVolID:           r.SpecVolID,
		keyVolumeHandle:        r.VolumeHandle,
		keyDriverName:          r.DriverName,
		keyNodeName:            r.NodeName,
		keyAttachmentID:        r.AttachmentID,
		keyVolumeLifecycleMode: string(r.VolumeLifecycleMode),
		keySELinuxMountContext: r.SELinuxMountContext,
		keyVolumeName:          string(r.VolumeName),
		keyPodUID:              string(r.PodUID),
		keyAccessType:          accessTypeString(r.AccessType),
		keyTargetPath:          r.TargetPath,
	})
}

// ReadPublish reads the record at path. Unknown keys are ignored; a record
// without volumeHandle, driverName or specVolID is ErrCorrupt, one of a
// newer format a *FormatError.
func ReadPublish(path string) (PublishRecord, error) {
	m, err := readRecord(path, keySpecVolID, keyVolumeHandle, keyDriverName)
	if err != nil {
		return PublishRecord{}, err
	}
	access, err := parseAccessType(path, m[keyAccessType])
	if err != nil {
		return PublishRecord{}, err
	}
	return PublishRecord{
		SpecVolID:           m[keySpecVolID],
		VolumeHandle:        m[keyVolumeHandle],
		DriverName:          m[keyDriverName],
		NodeName:            m[keyNodeName],
		AttachmentID:        m[keyAttachmentID],
		VolumeLifecycleMode: storagev1.VolumeLifecycleMode(m[keyVolumeLifecycleMode]),
		SELinuxMountContext: m[keySELinuxMountContext],
		VolumeName:          volume.Name(m[keyVolumeName]),
		PodUID:              types.UID(m[keyPodUID]),
		AccessType:          access,
		TargetPath:          m[keyTargetPath],
	}, nil
}

// WriteStage writes r to path atomically and durably (see WriteFile): a
// staged volume is unstaged after a restart, power loss included, only if
// its record is there.
func WriteStage(path string, r StageRecord) error {
	return writeRecord(path, WriteFile, map[string]string{
		keyVolumeHandle:        r.VolumeHandle,
		keyDriverName:          r.DriverName,
		keySELinuxMountContext: r.SELinuxMountContext,
		keyVolumeName:          string(r.VolumeName),
		keyPVName:              r.PVName,
		keyAccessType:          accessTypeString(r.AccessType),
		keyStagingPath:         r.StagingPath,
	})
}

// ReadStage reads the record at path. Unknown keys are ignored; a record
// without volumeHandle or driverName is ErrCorrupt, one of a newer format
// a *FormatError.
func ReadStage(path string) (StageRecord, error) {
	m, err := readRecord(path, keyVolumeHandle, keyDriverName)
	if err != nil {
		return StageRecord{}, err
	}
	access, err := parseAccessType(path, m[keyAccessType])
	if err != nil {
		return StageRecord{}, err
	}
	return StageRecord{
		VolumeHandle:        m[keyVolumeHandle],
		DriverName:          m[keyDriverName],
		SELinuxMountContext: m[keySELinuxMountContext],
		VolumeName:          volume.Name(m[keyVolumeName]),
		PVName:              m[keyPVName],
		AccessType:          access,
		StagingPath:         m[keyStagingPath],
	}, nil
}

// writeRecord encodes m as the kubelet does (a JSON object of strings,
// newline-terminated), leaving out empty values, with FormatKey, and
// writes it with write.
func writeRecord(path string, write func(string, []byte) error, m map[string]string) error {
	for k, v := range m {
		if v == "" {
			delete(m, k)
		}
	}
	m[FormatKey] = strconv.Itoa(FormatVersion)
	data, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("encoding %s: %w", path, err)
	}
	return write(path, append(data, '\n'))
}

// readRecord decodes the record at path, keeping the string values of the
// keys it knows and ignoring other keys whatever their type, and checks
// that the required keys are present. A record of a format newer than
// FormatVersion is a *FormatError.
func readRecord(path string, required ...string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading volume record: %w", err)
	}
	raw, err := decodeObject(path, data)
	if err != nil {
		return nil, err
	}
	// A newer format is refused before any key is read: its keys may not
	// mean what this agent takes them for.
	if _, err := formatOf(path, raw); err != nil {
		return nil, err
	}
	m := make(map[string]string, len(raw))
	for _, k := range knownKeys {
		v, ok := raw[k]
		if !ok {
			continue
		}
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return nil, fmt.Errorf("%w %s: key %q is not a string", ErrCorrupt, path, k)
		}
		m[k] = s
	}
	var missing []string
	for _, k := range required {
		if m[k] == "" {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w %s: missing %s", ErrCorrupt, path, strings.Join(missing, ", "))
	}
	return m, nil
}

// knownKeys are the keys readRecord keeps.
var knownKeys = []string{
	keySpecVolID, keyVolumeHandle, keyDriverName, keyNodeName, keyAttachmentID, keyVolumeLifecycleMode,
	keySELinuxMountContext, keyVolumeName, keyPodUID, keyAccessType, keyTargetPath, keyPVName, keyStagingPath,
}

// accessTypeString renders a for a record; unknown types are left out.
func accessTypeString(a volume.AccessType) string {
	switch a {
	case volume.Filesystem, volume.Block:
		return a.String()
	}
	return ""
}

// parseAccessType is the inverse of accessTypeString. A missing value (a
// record the kubelet wrote) yields 0, unknown: the caller knows from the
// record's directory which it is.
func parseAccessType(path, s string) (volume.AccessType, error) {
	switch s {
	case "":
		return 0, nil
	case volume.Filesystem.String():
		return volume.Filesystem, nil
	case volume.Block.String():
		return volume.Block, nil
	}
	return 0, fmt.Errorf("%w %s: unknown access type %q", ErrCorrupt, path, s)
}
