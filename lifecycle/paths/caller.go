package paths

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// frontDir holds the records of the steps a container orchestrator asks for
// through the front endpoint.
const frontDir = "front"

// CallerVolume is where csi-volmgr keeps the records of a volume that a
// container orchestrator (CO) stages and publishes through the front
// endpoint. The CO chooses staging_target_path and target_path itself, so
// only the records live under the root, in a tree of their own that the
// kubelet-layout scanners (StagedVolumes, PodVolumes) never visit:
//
//	<root>/front/<driver>/<hex sha256(handle)>/vol_data.json            staged record
//	<root>/front/<driver>/<hex sha256(handle)>/<podUID>/vol_data.json   publish record
//
// where podUID is the pseudo pod UID the front endpoint derives from the
// target path.
type CallerVolume struct {
	// Dir is <root>/front/<driver>/<hex sha256(handle)>.
	Dir string
	// StageRecord is the staged record, Dir/vol_data.json.
	StageRecord string
}

// CallerPublishing is where the publish record of one target path of a
// CallerVolume lives.
type CallerPublishing struct {
	// Dir is CallerVolume.Dir/<podUID>.
	Dir string
	// Record is the publish record, Dir/vol_data.json.
	Record string
}

// FrontDir returns <root>/front, the parent of every CallerVolume.
func (l Layout) FrontDir() string { return filepath.Join(l.root, frontDir) }

// CallerVolume returns where the records of volume handle of driver live
// when a CO stages or publishes it through the front endpoint.
func (l Layout) CallerVolume(driver, handle string) (CallerVolume, error) {
	if err := checkComponent("driver name", driver); err != nil {
		return CallerVolume{}, err
	}
	if handle == "" {
		return CallerVolume{}, fmt.Errorf("%w: empty volume handle", volume.ErrInvalidName)
	}
	dir, err := l.build(frontDir, driver, HandleHash(handle))
	if err != nil {
		return CallerVolume{}, err
	}
	return CallerVolume{Dir: dir, StageRecord: filepath.Join(dir, DataFileName)}, nil
}

// CallerPublishing returns where the publish record of pod's use of volume
// handle of driver lives.
func (l Layout) CallerPublishing(driver, handle string, pod types.UID) (CallerPublishing, error) {
	v, err := l.CallerVolume(driver, handle)
	if err != nil {
		return CallerPublishing{}, err
	}
	if err := checkComponent("pod UID", string(pod)); err != nil {
		return CallerPublishing{}, err
	}
	if string(pod) == DataFileName {
		return CallerPublishing{}, fmt.Errorf("%w: pod UID %q is reserved", volume.ErrInvalidName, pod)
	}
	dir := filepath.Join(v.Dir, string(pod))
	return CallerPublishing{Dir: dir, Record: filepath.Join(dir, DataFileName)}, nil
}

// CallerRecord is one record file found under FrontDir.
type CallerRecord struct {
	// Driver is the driver directory's name and HandleHash the volume
	// directory's.
	Driver, HandleHash string
	// Pod is the publish record's pseudo pod UID; empty for a staged record.
	Pod types.UID
	// Dir is the directory holding Record.
	Dir, Record string
}

// CallerRecords lists every record under FrontDir that exists on disk:
// for each volume directory its staged record (if any), then its publish
// records by pod UID; sorted by driver and hash. Directories whose names do
// not parse are left out and reported in the returned error (wrapping
// volume.ErrInvalidName), with directories that could not be read; the
// records that did parse are returned either way. A missing FrontDir
// yields nothing.
func (l Layout) CallerRecords() ([]CallerRecord, error) {
	root, err := l.build(frontDir)
	if err != nil {
		return nil, err
	}
	drivers, errs := readDirNames(root)
	var out []CallerRecord
	for _, driver := range drivers {
		if err := checkComponent("driver name", driver); err != nil {
			errs = append(errs, err)
			continue
		}
		hashes, readErrs := readDirNames(filepath.Join(root, driver))
		errs = append(errs, readErrs...)
		for _, hash := range hashes {
			if !isHandleHash(hash) {
				errs = append(errs, fmt.Errorf("%w: %s is not a volume handle hash", volume.ErrInvalidName, quote(hash)))
				continue
			}
			dir := filepath.Join(root, driver, hash)
			if rec := filepath.Join(dir, DataFileName); isFile(rec) {
				out = append(out, CallerRecord{Driver: driver, HandleHash: hash, Dir: dir, Record: rec})
			}
			pods, readErrs := readDirNames(dir)
			errs = append(errs, readErrs...)
			for _, pod := range pods {
				podDir := filepath.Join(dir, pod)
				if rec := filepath.Join(podDir, DataFileName); isFile(rec) {
					out = append(out, CallerRecord{Driver: driver, HandleHash: hash, Pod: types.UID(pod), Dir: podDir, Record: rec})
				}
			}
		}
	}
	return out, errors.Join(errs...)
}

// isFile reports whether p is a regular file.
func isFile(p string) bool {
	fi, err := os.Lstat(p)
	return err == nil && fi.Mode().IsRegular()
}
