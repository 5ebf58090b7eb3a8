package localattach

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// recordsDir is where attachment records live below the root directory.
// The kubelet has no such directory: in a cluster the VolumeAttachment
// objects are the record.
const recordsDir = "standalone/attachments"

// record is what the Attacher keeps on disk of a volume it may have
// attached with ControllerPublishVolume: enough to call
// ControllerUnpublishVolume after a restart. It holds no secret data, only
// the reference to the Secret. Format is its format version
// (checkpoint.FormatVersion, the same versioning as the volume records):
// empty in a record written before records were versioned, which list
// migrates in place; a newer one is refused.
type record struct {
	Format   string            `json:"csiVolmgrFormat,omitempty"`
	Volume   volume.Name       `json:"volume"`
	Driver   string            `json:"driver"`
	Handle   string            `json:"volumeHandle"`
	NodeID   string            `json:"nodeID"`
	PVName   string            `json:"pvName,omitempty"`
	ReadOnly bool              `json:"readOnly,omitempty"`
	Secret   *volume.SecretRef `json:"controllerPublishSecretRef,omitempty"`
}

// recordStore keeps one file per attachment, named after the
// VolumeAttachment name (hex, so always a valid file name), written
// atomically and durably.
type recordStore struct{ dir string }

func newRecordStore(root string) (*recordStore, error) {
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("localattach: root directory %q is not an absolute path", root)
	}
	return &recordStore{dir: filepath.Join(root, recordsDir)}, nil
}

func (s *recordStore) path(vaName string) string { return filepath.Join(s.dir, vaName+".json") }

func (s *recordStore) write(vaName string, r record) error {
	r.Format = strconv.Itoa(checkpoint.FormatVersion)
	data, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encoding attachment record: %w", err)
	}
	if err := checkpoint.WriteFile(s.path(vaName), data); err != nil {
		return fmt.Errorf("writing attachment record: %w", err)
	}
	return nil
}

func (s *recordStore) remove(vaName string) error {
	if err := checkpoint.Remove(s.path(vaName)); err != nil {
		return fmt.Errorf("removing attachment record: %w", err)
	}
	return nil
}

func (s *recordStore) read(vaName string) (record, error) {
	data, err := os.ReadFile(s.path(vaName))
	if err != nil {
		return record{}, fmt.Errorf("reading attachment record: %w", err)
	}
	var r record
	if err := json.Unmarshal(data, &r); err != nil {
		return record{}, fmt.Errorf("parsing attachment record %s: %w", s.path(vaName), err)
	}
	// A newer format is refused before its fields are trusted.
	if _, err := checkpoint.ParseFormat(s.path(vaName), r.Format, r.Format != ""); err != nil {
		return record{}, err
	}
	if r.Volume == "" || r.Driver == "" || r.Handle == "" {
		return record{}, fmt.Errorf("attachment record %s lacks the volume, driver or handle", s.path(vaName))
	}
	return r, nil
}

// list returns every record by VolumeAttachment name, or, when one has a
// newer format, a *checkpoint.FormatError and nothing. It changes nothing
// on disk: the records written before records were versioned (no
// csiVolmgrFormat) are migrated by migrate, once the Manager knows that no
// other record of the node is of a newer format.
func (s *recordStore) list() (map[string]record, error) {
	entries, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing attachment records: %w", err)
	}
	out := map[string]record{}
	for _, e := range entries {
		vaName, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || strings.HasPrefix(e.Name(), ".") || e.IsDir() {
			continue
		}
		r, err := s.read(vaName)
		if err != nil {
			return nil, err
		}
		out[vaName] = r
	}
	return out, nil
}

// migrate rewrites a record of an older format in the current one,
// atomically and durably.
func (s *recordStore) migrate(vaName string, r record) error {
	if err := s.write(vaName, r); err != nil {
		return fmt.Errorf("migrating attachment record %s to format version %d: %w", s.path(vaName), checkpoint.FormatVersion, err)
	}
	return nil
}
