package paths

import (
	"cmp"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	utilstrings "k8s.io/utils/strings"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// PodVolume is one pod volume directory, parsed back into the parts that
// build it.
type PodVolume struct {
	// Pod is the pod's UID.
	Pod types.UID
	// PublishName is the unescaped directory name (see the package doc).
	PublishName string
	// AccessType is Filesystem for pods/<uid>/volumes and Block for
	// pods/<uid>/volumeDevices.
	AccessType volume.AccessType
	// Publishing holds the paths, rebuilt from the parts.
	Publishing
}

// StagedVolume is one staged-volume directory
// <root>/plugins/kubernetes.io/csi/<driver>/<hash>, parsed. The handle is
// known only from the record inside it.
type StagedVolume struct {
	// Driver is the CSI driver name.
	Driver string
	// HandleHash is hex(sha256(handle)).
	HandleHash string
	// Dir is the directory and Record the staged record file in it.
	Dir, Record string
}

// ParsePublishingDir parses a Publishing.Dir back into its parts. It fails
// with an error wrapping volume.ErrInvalidName for any path Publishing
// would not build.
func (l Layout) ParsePublishingDir(dir string) (PodVolume, error) {
	parts, err := l.split(dir)
	if err != nil {
		return PodVolume{}, err
	}
	switch {
	// pods/<uid>/volumes/kubernetes.io~csi/<name>
	case len(parts) == 5 && parts[0] == podsDir && parts[2] == volumesDir && parts[3] == escapedPlugin:
		return l.rebuild(types.UID(parts[1]), parts[4], volume.Filesystem, dir, func(p Publishing) string { return p.Dir })
	// plugins/kubernetes.io/csi/volumeDevices/<name>/data/<uid>
	case len(parts) == 7 && parts[0] == pluginsDir && parts[1] == pluginNamespace && parts[2] == csiDir &&
		parts[3] == volumeDevicesDir && parts[5] == dataDir:
		return l.rebuild(types.UID(parts[6]), parts[4], volume.Block, dir, func(p Publishing) string { return p.Dir })
	}
	return PodVolume{}, fmt.Errorf("%w: %s is not a pod volume directory", volume.ErrInvalidName, quote(dir))
}

// ParseTarget parses a target_path that Publishing built (Publishing.Target)
// back into its parts.
func (l Layout) ParseTarget(target string) (PodVolume, error) {
	parts, err := l.split(target)
	if err != nil {
		return PodVolume{}, err
	}
	switch {
	// pods/<uid>/volumes/kubernetes.io~csi/<name>/mount
	case len(parts) == 6 && parts[0] == podsDir && parts[2] == volumesDir && parts[3] == escapedPlugin && parts[5] == mountDir:
		return l.rebuild(types.UID(parts[1]), parts[4], volume.Filesystem, target, func(p Publishing) string { return p.Target })
	// plugins/kubernetes.io/csi/volumeDevices/publish/<name>/<uid>
	case len(parts) == 7 && parts[0] == pluginsDir && parts[1] == pluginNamespace && parts[2] == csiDir &&
		parts[3] == volumeDevicesDir && parts[4] == publishDir:
		return l.rebuild(types.UID(parts[6]), parts[5], volume.Block, target, func(p Publishing) string { return p.Target })
	}
	return PodVolume{}, fmt.Errorf("%w: %s is not a target path", volume.ErrInvalidName, quote(target))
}

// rebuild builds the Publishing of the parsed parts and checks that it
// reproduces the parsed path, so parsing accepts exactly what building makes.
func (l Layout) rebuild(pod types.UID, escaped string, access volume.AccessType, path string, pick func(Publishing) string) (PodVolume, error) {
	name := utilstrings.UnescapeQualifiedName(escaped)
	p, err := l.Publishing(pod, name, access)
	if err != nil {
		return PodVolume{}, err
	}
	if pick(p) != filepath.Clean(path) {
		return PodVolume{}, fmt.Errorf("%w: %s is not in canonical form", volume.ErrInvalidName, quote(path))
	}
	return PodVolume{Pod: pod, PublishName: name, AccessType: access, Publishing: p}, nil
}

// ParseStagedDir parses a Staging.Dir back into driver and handle hash.
func (l Layout) ParseStagedDir(dir string) (StagedVolume, error) {
	parts, err := l.split(dir)
	if err != nil {
		return StagedVolume{}, err
	}
	if len(parts) != 5 || parts[0] != pluginsDir || parts[1] != pluginNamespace || parts[2] != csiDir {
		return StagedVolume{}, fmt.Errorf("%w: %s is not a staged-volume directory", volume.ErrInvalidName, quote(dir))
	}
	return l.staged(parts[3], parts[4])
}

func (l Layout) staged(driver, hash string) (StagedVolume, error) {
	if err := checkDriver(driver); err != nil {
		return StagedVolume{}, err
	}
	if !isHandleHash(hash) {
		return StagedVolume{}, fmt.Errorf("%w: %s is not a volume handle hash", volume.ErrInvalidName, quote(hash))
	}
	dir, err := l.build(pluginsDir, pluginNamespace, csiDir, driver, hash)
	if err != nil {
		return StagedVolume{}, err
	}
	return StagedVolume{Driver: driver, HandleHash: hash, Dir: dir, Record: filepath.Join(dir, DataFileName)}, nil
}

// isHandleHash reports whether s is 64 lowercase hex digits.
func isHandleHash(s string) bool {
	if len(s) != 2*32 || strings.ToLower(s) != s {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// split returns the components of p relative to the root; p must lie below
// the root.
func (l Layout) split(p string) ([]string, error) {
	if strings.ContainsRune(p, 0) {
		return nil, fmt.Errorf("%w: %s contains a NUL byte", volume.ErrInvalidName, quote(p))
	}
	clean := filepath.Clean(p)
	if !filepath.IsAbs(clean) || !l.contains(clean) {
		return nil, fmt.Errorf("%w: %s is not below %s", volume.ErrInvalidName, quote(p), l.root)
	}
	rel := strings.TrimPrefix(strings.TrimPrefix(clean, l.root), string(filepath.Separator))
	return strings.Split(rel, string(filepath.Separator)), nil
}

// PodVolumes lists every pod volume directory (Publishing.Dir): the
// filesystem ones under <root>/pods/*/volumes/kubernetes.io~csi and the
// block ones under <root>/plugins/kubernetes.io/csi/volumeDevices/*/data,
// sorted by pod, name and access type. Entries whose names do not parse
// are left out and reported in the returned error (wrapping
// volume.ErrInvalidName), together with directories that could not be
// read; the entries that did parse are returned either way. A missing
// directory yields nothing.
func (l Layout) PodVolumes() ([]PodVolume, error) {
	podsRoot, err := l.build(podsDir)
	if err != nil {
		return nil, err
	}
	devicesRoot, err := l.build(pluginsDir, pluginNamespace, csiDir, volumeDevicesDir)
	if err != nil {
		return nil, err
	}
	var out []PodVolume
	var errs []error
	add := func(dir string) {
		pv, err := l.ParsePublishingDir(dir)
		if err != nil {
			errs = append(errs, err)
			return
		}
		out = append(out, pv)
	}
	list := func(dir string) []string {
		names, readErrs := readDirNames(dir)
		errs = append(errs, readErrs...)
		return names
	}
	for _, pod := range list(podsRoot) {
		pluginDir := filepath.Join(podsRoot, pod, volumesDir, escapedPlugin)
		for _, name := range list(pluginDir) {
			add(filepath.Join(pluginDir, name))
		}
	}
	for _, name := range list(devicesRoot) {
		data := filepath.Join(devicesRoot, name, dataDir)
		if name == stagingDir || name == publishDir {
			// The kubelet's staging and publish directories; a volume of
			// that name has a data directory (its own path is the same).
			if _, err := os.Stat(data); err != nil {
				continue
			}
		}
		for _, pod := range list(data) {
			add(filepath.Join(data, pod))
		}
	}
	slices.SortFunc(out, func(a, b PodVolume) int {
		return cmp.Or(cmp.Compare(a.Pod, b.Pod), cmp.Compare(a.PublishName, b.PublishName), cmp.Compare(a.AccessType, b.AccessType))
	})
	return out, errors.Join(errs...)
}

// StagedVolumes lists every staged-volume directory
// <root>/plugins/kubernetes.io/csi/<driver>/<hash>, sorted by driver and
// hash, skipping the block layout's volumeDevices directory. Errors are
// reported as for PodVolumes.
func (l Layout) StagedVolumes() ([]StagedVolume, error) {
	pluginRoot, err := l.build(pluginsDir, pluginNamespace, csiDir)
	if err != nil {
		return nil, err
	}
	drivers, errs := readDirNames(pluginRoot)
	var out []StagedVolume
	for _, driver := range drivers {
		if driver == volumeDevicesDir {
			continue
		}
		hashes, readErrs := readDirNames(filepath.Join(pluginRoot, driver))
		errs = append(errs, readErrs...)
		for _, hash := range hashes {
			sv, err := l.staged(driver, hash)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			out = append(out, sv)
		}
	}
	return out, errors.Join(errs...)
}

// readDirNames returns the sorted names of the directories in dir. A
// missing dir has no entries; other failures are returned as errors.
func readDirNames(dir string) ([]string, []error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, []error{fmt.Errorf("reading %s: %w", dir, err)}
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	return names, nil
}
