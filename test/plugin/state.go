package plugin

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
)

// stateDirName is the directory inside the state directory that holds one record per volume,
// <id>.json.
const stateDirName = "state"

// recordSuffix ends the name of every volume record.
const recordSuffix = ".json"

// volumesDirName is the directory inside the state directory that holds the volumes' backing storage.
const volumesDirName = "volumes"

// stateFormatVersion is written into each volume record; a record with another version is rejected.
const stateFormatVersion = 1

// AccessType says how a volume is exposed to its consumer.
type AccessType string

const (
	// AccessMount is a filesystem volume: a directory, bind-mounted.
	AccessMount AccessType = "mount"
	// AccessBlock is a block volume: a loop device over a sparse file, bind-mounted onto a file.
	AccessBlock AccessType = "block"
)

// Volume is the plugin's record of one volume, as stored in the state file.
type Volume struct {
	// ID is the CSI volume ID.
	ID string `json:"id"`
	// Name is the name CreateVolume was called with.
	Name string `json:"name"`
	// CapacityBytes is the size of the volume.
	CapacityBytes int64 `json:"capacityBytes"`
	// FilesystemBytes is the size of a filesystem volume's file system while ControllerExpandVolume
	// has grown the volume and NodeExpandVolume has not grown the file system yet; 0 means
	// CapacityBytes.
	FilesystemBytes int64 `json:"filesystemBytes,omitempty"`
	// AccessType is fixed at creation.
	AccessType AccessType `json:"accessType"`
	// Path is the backing directory (mount) or sparse image file (block).
	Path string `json:"path"`
	// Parameters are the CreateVolume parameters; they are returned as the volume context.
	Parameters map[string]string `json:"parameters,omitempty"`
	// Attachments maps a node ID to the ControllerPublishVolume that attached the volume there.
	Attachments map[string]Attachment `json:"attachments,omitempty"`
	// Staged is the NodeStageVolume in effect, nil when the volume is not staged.
	Staged *Staging `json:"staged,omitempty"`
	// Published maps a target path to the NodePublishVolume in effect there.
	Published map[string]Publication `json:"published,omitempty"`
	// Ephemeral marks a CSI inline volume, created by its first NodePublishVolume and deleted by
	// its last NodeUnpublishVolume.
	Ephemeral bool `json:"ephemeral,omitempty"`
}

// Attachment records one ControllerPublishVolume.
type Attachment struct {
	// ReadOnly is the readonly flag of the request.
	ReadOnly bool `json:"readOnly"`
}

// Staging records one NodeStageVolume.
type Staging struct {
	// Path is the staging_target_path.
	Path string `json:"path"`
	// AccessMode is the name of the CSI access mode, e.g. "SINGLE_NODE_WRITER".
	AccessMode string `json:"accessMode"`
	// MountFlags are the mount flags of the volume capability.
	MountFlags []string `json:"mountFlags,omitempty"`
	// MountGroup is the volume_mount_group of the volume capability.
	MountGroup string `json:"mountGroup,omitempty"`
	// Extra counts the records of the target beyond the first (FaultConfig.Strict: published again
	// over a target that was not a mount point); each NodeUnpublishVolume removes one.
	Extra int `json:"extra,omitempty"`
}

// Publication records one NodePublishVolume.
type Publication struct {
	// StagingPath is the staging_target_path the volume was published from; empty without staging.
	StagingPath string `json:"stagingPath,omitempty"`
	// ReadOnly is the readonly flag of the request.
	ReadOnly bool `json:"readOnly"`
	// AccessMode is the name of the CSI access mode.
	AccessMode string `json:"accessMode"`
	// MountFlags are the mount flags of the volume capability.
	MountFlags []string `json:"mountFlags,omitempty"`
	// MountGroup is the volume_mount_group of the volume capability.
	MountGroup string `json:"mountGroup,omitempty"`
	// Extra counts the records of the target beyond the first (FaultConfig.Strict: published again
	// over a target that was not a mount point); each NodeUnpublishVolume removes one.
	Extra int `json:"extra,omitempty"`
}

// clone returns a deep copy, so that callers never share maps with the store.
func (v *Volume) clone() Volume {
	c := *v
	c.Parameters = maps.Clone(v.Parameters)
	c.Attachments = maps.Clone(v.Attachments)
	c.Published = make(map[string]Publication, len(v.Published))
	for k, p := range v.Published {
		p.MountFlags = slices.Clone(p.MountFlags)
		c.Published[k] = p
	}
	if v.Staged != nil {
		s := *v.Staged
		s.MountFlags = slices.Clone(s.MountFlags)
		c.Staged = &s
	}
	return c
}

// volumeRecord is the on-disk format of one volume's record.
type volumeRecord struct {
	Version int    `json:"version"`
	Volume  Volume `json:"volume"`
}

// store is the plugin's volume table, mirrored to one record file per volume on every change,
// so that a call costs the write of its own volume's record, whatever the number of volumes,
// and calls on different volumes do not wait for each other's writes. Methods are safe for
// concurrent use. Errors other than those returned by an update function are failures to read
// or write a record.
type store struct {
	dir string

	// writes serializes the changes of one volume: its record always holds the volume as of
	// its last successful change, and the table shows a change only once it is written.
	writes keyMutex
	// mu guards volumes; it is never held while a record is written, except by create,
	// which must check the capacity of all volumes and add the new one at once.
	mu      sync.Mutex
	volumes map[string]*Volume
}

// openStore loads the volume records in stateDir, or starts empty when there are none.
func openStore(stateDir string) (*store, error) {
	s := &store{dir: filepath.Join(stateDir, stateDirName), volumes: map[string]*Volume{}}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, fmt.Errorf("create state directory: %w", err)
	}
	vols, err := loadRecords(s.dir)
	if err != nil {
		return nil, err
	}
	for i := range vols {
		v := vols[i]
		s.volumes[v.ID] = &v
	}
	return s, nil
}

// LoadState returns the volumes recorded in stateDir, sorted by ID. It returns no volumes and
// no error when the plugin never recorded any.
func LoadState(stateDir string) ([]Volume, error) {
	return loadRecords(filepath.Join(stateDir, stateDirName))
}

func loadRecords(dir string) ([]Volume, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read state directory: %w", err)
	}
	var vols []Volume
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !strings.HasSuffix(name, recordSuffix) {
			continue // a temporary file a killed write left behind
		}
		path := filepath.Join(dir, name)
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read volume record: %w", err)
		}
		var r volumeRecord
		if err := json.Unmarshal(data, &r); err != nil {
			return nil, fmt.Errorf("decode volume record %s: %w", path, err)
		}
		if r.Version != stateFormatVersion {
			return nil, fmt.Errorf("volume record %s has version %d, want %d", path, r.Version, stateFormatVersion)
		}
		if r.Volume.ID+recordSuffix != name {
			return nil, fmt.Errorf("volume record %s holds volume %q", path, r.Volume.ID)
		}
		vols = append(vols, r.Volume)
	}
	sort.Slice(vols, func(i, j int) bool { return vols[i].ID < vols[j].ID })
	return vols, nil
}

// get returns a copy of the volume with the given ID.
func (s *store) get(id string) (Volume, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.volumes[id]
	if !ok {
		return Volume{}, false
	}
	return v.clone(), true
}

// getByName returns a copy of the volume created with the given name.
func (s *store) getByName(name string) (Volume, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range s.volumes {
		if v.Name == name {
			return v.clone(), true
		}
	}
	return Volume{}, false
}

// list returns copies of all volumes, sorted by ID.
func (s *store) list() []Volume {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Volume, 0, len(s.volumes))
	for _, v := range s.volumes {
		out = append(out, v.clone())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// errNoCapacity is returned by create when the volume does not fit into the remaining capacity.
var errNoCapacity = errors.New("insufficient capacity")

// create adds a new volume and persists the table, provided the capacities of all volumes
// together stay within total.
func (s *store) create(v Volume, total int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if used := s.usedLocked(); used+v.CapacityBytes > total {
		return fmt.Errorf("%w: %d of %d bytes used, %d requested", errNoCapacity, used, total, v.CapacityBytes)
	}
	c := v.clone()
	if err := s.write(&c); err != nil {
		return err
	}
	s.volumes[v.ID] = &c
	return nil
}

// update applies fn to a copy of the volume and, if fn succeeds, stores and persists the copy.
// It returns fn's error unchanged, and found=false when there is no such volume.
func (s *store) update(id string, fn func(*Volume) error) (found bool, err error) {
	unlock := s.writes.lock(id)
	defer unlock()
	s.mu.Lock()
	old, ok := s.volumes[id]
	var c Volume
	if ok {
		c = old.clone()
	}
	s.mu.Unlock()
	if !ok {
		return false, nil
	}
	if err := fn(&c); err != nil {
		return true, err
	}
	if err := s.write(&c); err != nil {
		return true, err
	}
	s.mu.Lock()
	s.volumes[id] = &c
	s.mu.Unlock()
	return true, nil
}

// remove deletes a volume and persists the table. Removing an unknown volume is not an error.
func (s *store) remove(id string) error {
	unlock := s.writes.lock(id)
	defer unlock()
	s.mu.Lock()
	_, ok := s.volumes[id]
	s.mu.Unlock()
	if !ok {
		return nil
	}
	if err := removeFileDurably(s.recordPath(id)); err != nil {
		return fmt.Errorf("remove volume record: %w", err)
	}
	s.mu.Lock()
	delete(s.volumes, id)
	s.mu.Unlock()
	return nil
}

// usedCapacity is the sum of all volumes' capacities.
func (s *store) usedCapacity() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.usedLocked()
}

func (s *store) usedLocked() int64 {
	var used int64
	for _, v := range s.volumes {
		used += v.CapacityBytes
	}
	return used
}

// attachedTo counts the volumes attached to a node by ControllerPublishVolume.
func (s *store) attachedTo(nodeID string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, v := range s.volumes {
		if _, ok := v.Attachments[nodeID]; ok {
			n++
		}
	}
	return n
}

// recordPath is where the record of volume id is kept.
func (s *store) recordPath(id string) string {
	return filepath.Join(s.dir, id+recordSuffix)
}

// write records v durably.
func (s *store) write(v *Volume) error {
	if v.ID == "" || strings.ContainsAny(v.ID, "/\x00") || strings.HasPrefix(v.ID, ".") {
		return fmt.Errorf("volume ID %q cannot name a record file", v.ID)
	}
	data, err := json.MarshalIndent(volumeRecord{Version: stateFormatVersion, Volume: *v}, "", "  ")
	if err != nil {
		return fmt.Errorf("encode volume record: %w", err)
	}
	if err := writeFileAtomic(s.recordPath(v.ID), data, 0o600); err != nil {
		return fmt.Errorf("write volume record: %w", err)
	}
	return nil
}

// filesystemBytes is the size of the volume's file system: what the node has grown it to.
func (v *Volume) filesystemBytes() int64 {
	if v.FilesystemBytes > 0 {
		return v.FilesystemBytes
	}
	return v.CapacityBytes
}
