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
	"sync"
)

// stateFileName is the name of the state file inside the state directory.
const stateFileName = "state.json"

// volumesDirName is the directory inside the state directory that holds the volumes' backing storage.
const volumesDirName = "volumes"

// stateFormatVersion is written into the state file; a file with another version is rejected.
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

// stateFile is the on-disk format of the state file.
type stateFile struct {
	Version int      `json:"version"`
	Volumes []Volume `json:"volumes"`
}

// store is the plugin's volume table, mirrored to the state file on every change.
// Methods are safe for concurrent use. Errors other than those returned by an update
// function are failures to read or write the state file.
type store struct {
	path string

	// mu guards volumes and serializes writes of the state file, so the file always
	// holds the table as of the last successful change.
	mu      sync.Mutex
	volumes map[string]*Volume
}

// openStore loads the state file in stateDir, or starts empty when there is none.
func openStore(stateDir string) (*store, error) {
	s := &store{path: filepath.Join(stateDir, stateFileName), volumes: map[string]*Volume{}}
	vols, err := loadStateFile(s.path)
	if err != nil {
		return nil, err
	}
	for i := range vols {
		v := vols[i]
		s.volumes[v.ID] = &v
	}
	return s, nil
}

// LoadState returns the volumes recorded in the state file of stateDir, sorted by ID.
// It returns no volumes and no error when the plugin never wrote a state file.
func LoadState(stateDir string) ([]Volume, error) {
	return loadStateFile(filepath.Join(stateDir, stateFileName))
}

func loadStateFile(path string) ([]Volume, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read state file: %w", err)
	}
	var f stateFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("decode state file %s: %w", path, err)
	}
	if f.Version != stateFormatVersion {
		return nil, fmt.Errorf("state file %s has version %d, want %d", path, f.Version, stateFormatVersion)
	}
	return f.Volumes, nil
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
	s.volumes[v.ID] = &c
	if err := s.persistLocked(); err != nil {
		delete(s.volumes, v.ID)
		return err
	}
	return nil
}

// update applies fn to a copy of the volume and, if fn succeeds, stores and persists the copy.
// It returns fn's error unchanged, and found=false when there is no such volume.
func (s *store) update(id string, fn func(*Volume) error) (found bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.volumes[id]
	if !ok {
		return false, nil
	}
	c := old.clone()
	if err := fn(&c); err != nil {
		return true, err
	}
	s.volumes[id] = &c
	if err := s.persistLocked(); err != nil {
		s.volumes[id] = old
		return true, err
	}
	return true, nil
}

// remove deletes a volume and persists the table. Removing an unknown volume is not an error.
func (s *store) remove(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.volumes[id]
	if !ok {
		return nil
	}
	delete(s.volumes, id)
	if err := s.persistLocked(); err != nil {
		s.volumes[id] = old
		return err
	}
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

func (s *store) persistLocked() error {
	f := stateFile{Version: stateFormatVersion, Volumes: make([]Volume, 0, len(s.volumes))}
	for _, v := range s.volumes {
		f.Volumes = append(f.Volumes, *v)
	}
	sort.Slice(f.Volumes, func(i, j int) bool { return f.Volumes[i].ID < f.Volumes[j].ID })
	data, err := json.MarshalIndent(&f, "", "  ")
	if err != nil {
		return fmt.Errorf("encode state: %w", err)
	}
	if err := writeFileAtomic(s.path, data, 0o600); err != nil {
		return fmt.Errorf("write state file: %w", err)
	}
	return nil
}
