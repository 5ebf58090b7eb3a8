package paths

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	utilstrings "k8s.io/utils/strings"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// Names of the fixed directories and files of the layout.
const (
	// DataFileName is the name of every record file, as the kubelet's.
	DataFileName = "vol_data.json"

	pluginsDir       = "plugins"
	pluginNamespace  = "kubernetes.io"
	csiDir           = "csi"
	podsDir          = "pods"
	volumesDir       = "volumes"
	volumeDevicesDir = "volumeDevices"
	// escapedPlugin is EscapeQualifiedName("kubernetes.io/csi").
	escapedPlugin = "kubernetes.io~csi"
	globalMount   = "globalmount"
	mountDir      = "mount"
	stagingDir    = "staging"
	publishDir    = "publish"
	// devDir and dataDir are below volumeDevices/<name>: the global map
	// path and the block publish records.
	devDir  = "dev"
	dataDir = "data"

	// maxComponent is the longest file name Linux accepts (NAME_MAX).
	maxComponent = 255
	// maxShown bounds how much of a rejected name an error message quotes.
	maxShown = 64
)

// Layout builds the paths under one root directory. The zero value is not
// usable; make one with New. A Layout is a value and safe for concurrent use.
type Layout struct {
	root string
}

// New returns the layout under root, which must be an absolute path. It
// touches nothing on disk.
func New(root string) (Layout, error) {
	if root == "" || !filepath.IsAbs(root) || strings.ContainsRune(root, 0) {
		return Layout{}, fmt.Errorf("%w: root directory %q is not an absolute path", volume.ErrInvalidName, root)
	}
	return Layout{root: filepath.Clean(root)}, nil
}

// Root returns the root directory.
func (l Layout) Root() string { return l.root }

// Staging is where one volume is staged and where its staged record lives.
type Staging struct {
	// Dir is <root>/plugins/kubernetes.io/csi/<driver>/<hex sha256(handle)>;
	// it holds Record and, for filesystem volumes, Path.
	Dir string
	// Record is the staged record, Dir/vol_data.json.
	Record string
	// Path is the staging_target_path: Dir/globalmount for filesystem
	// volumes, <root>/plugins/kubernetes.io/csi/volumeDevices/staging/<pvName>
	// for block volumes.
	Path string
	// MapDir is, for block volumes, the kubelet's global map path
	// <root>/plugins/kubernetes.io/csi/volumeDevices/<escaped pvName>/dev,
	// which holds one bind mount of the device per pod (Publishing.MapFile);
	// the volume may be unstaged only once it holds none. Empty for
	// filesystem volumes.
	MapDir string
}

// Staging returns where the volume id is staged. It uses id.Driver,
// id.Handle, id.AccessType and, for block volumes, id.PVName.
func (l Layout) Staging(id volume.ID) (Staging, error) {
	if err := checkDriver(id.Driver); err != nil {
		return Staging{}, err
	}
	if id.Handle == "" {
		return Staging{}, fmt.Errorf("%w: empty volume handle", volume.ErrInvalidName)
	}
	dir, err := l.build(pluginsDir, pluginNamespace, csiDir, id.Driver, HandleHash(id.Handle))
	if err != nil {
		return Staging{}, err
	}
	s := Staging{Dir: dir, Record: filepath.Join(dir, DataFileName)}
	switch id.AccessType {
	case volume.Filesystem:
		s.Path = filepath.Join(dir, globalMount)
	case volume.Block:
		name, err := escapeName("PersistentVolume name", id.PVName)
		if err != nil {
			return Staging{}, err
		}
		if s.Path, err = l.build(pluginsDir, pluginNamespace, csiDir, volumeDevicesDir, stagingDir, name); err != nil {
			return Staging{}, err
		}
		if s.MapDir, err = l.build(pluginsDir, pluginNamespace, csiDir, volumeDevicesDir, name, devDir); err != nil {
			return Staging{}, err
		}
	default:
		return Staging{}, fmt.Errorf("%w: unknown access type %d", volume.ErrInvalidName, id.AccessType)
	}
	return s, nil
}

// Publishing is where one pod's use of a volume is published and recorded.
//
// A block volume is in the kubelet's layout (pkg/volume/csi/csi_block.go):
// the driver publishes the device at Target, the global map MapFile is a
// bind mount of it (held open by a loop device, as the kubelet's
// MapBlockVolume does), and DeviceLink, the pod's device, is a symbolic
// link to Target. Since DeviceLink is where the kubelet keeps the pod's
// device, the publish record of a block volume is kept below the volume's
// volumeDevices directory instead, one per pod.
type Publishing struct {
	// Dir is <root>/pods/<podUID>/volumes/kubernetes.io~csi/<escaped name>
	// for filesystem volumes and
	// <root>/plugins/kubernetes.io/csi/volumeDevices/<escaped name>/data/<podUID>
	// for block volumes; it holds Record (and, for filesystem volumes,
	// Target).
	Dir string
	// Record is the publish record, Dir/vol_data.json.
	Record string
	// Target is the target_path: Dir/mount for filesystem volumes,
	// <root>/plugins/kubernetes.io/csi/volumeDevices/publish/<escaped name>/<podUID>
	// for block volumes. The driver creates it; its parent exists before
	// NodePublishVolume is called.
	Target string
	// DeviceLink is, for block volumes, the pod's device:
	// <root>/pods/<podUID>/volumeDevices/kubernetes.io~csi/<escaped name>,
	// a symbolic link to Target (the kubelet's pod device map path). Empty
	// for filesystem volumes.
	DeviceLink string
	// MapFile is, for block volumes, the pod's entry in the global map
	// path: Staging.MapDir/<podUID>, a bind mount of Target. Empty for
	// filesystem volumes.
	MapFile string
}

// Publishing returns where pod's use of a volume is published. publishName
// is volume.PodVolume.PublishName: the PV name, or the pod's volume name for
// inline volumes.
func (l Layout) Publishing(pod types.UID, publishName string, access volume.AccessType) (Publishing, error) {
	uid := string(pod)
	if err := checkComponent("pod UID", uid); err != nil {
		return Publishing{}, err
	}
	name, err := escapeName("volume name", publishName)
	if err != nil {
		return Publishing{}, err
	}
	var p Publishing
	switch access {
	case volume.Filesystem:
		if p.Dir, err = l.build(podsDir, uid, volumesDir, escapedPlugin, name); err != nil {
			return Publishing{}, err
		}
		p.Target = filepath.Join(p.Dir, mountDir)
	case volume.Block:
		if p.Dir, err = l.build(pluginsDir, pluginNamespace, csiDir, volumeDevicesDir, name, dataDir, uid); err != nil {
			return Publishing{}, err
		}
		if p.Target, err = l.build(pluginsDir, pluginNamespace, csiDir, volumeDevicesDir, publishDir, name, uid); err != nil {
			return Publishing{}, err
		}
		if p.DeviceLink, err = l.build(podsDir, uid, volumeDevicesDir, escapedPlugin, name); err != nil {
			return Publishing{}, err
		}
		if p.MapFile, err = l.build(pluginsDir, pluginNamespace, csiDir, volumeDevicesDir, name, devDir, uid); err != nil {
			return Publishing{}, err
		}
	default:
		return Publishing{}, fmt.Errorf("%w: unknown access type %d", volume.ErrInvalidName, access)
	}
	p.Record = filepath.Join(p.Dir, DataFileName)
	return p, nil
}

// PodsDir returns <root>/pods, the parent of every pod's directory.
func (l Layout) PodsDir() string { return filepath.Join(l.root, podsDir) }

// PluginDir returns <root>/plugins/kubernetes.io/csi, the parent of every
// staged-volume directory and of the block layout.
func (l Layout) PluginDir() string { return filepath.Join(l.root, pluginsDir, pluginNamespace, csiDir) }

// HandleHash returns hex(sha256(handle)), the name of a volume's staging
// directory (the kubelet's makeDeviceMountPath).
func HandleHash(handle string) string {
	sum := sha256.Sum256([]byte(handle))
	return hex.EncodeToString(sum[:])
}

// build joins root and elems. It is the only function that makes a path:
// every element must be a single safe path component (see checkComponent),
// and the result must lie below root.
func (l Layout) build(elems ...string) (string, error) {
	if l.root == "" {
		return "", fmt.Errorf("%w: layout has no root directory", volume.ErrInvalidName)
	}
	for _, e := range elems {
		if err := checkComponent("path element", e); err != nil {
			return "", err
		}
	}
	p := filepath.Join(append([]string{l.root}, elems...)...)
	if !l.contains(p) {
		return "", fmt.Errorf("%w: %q is not below %s", volume.ErrInvalidName, p, l.root)
	}
	return p, nil
}

// contains reports whether p lies strictly below the root.
func (l Layout) contains(p string) bool {
	prefix := l.root
	if prefix != string(filepath.Separator) {
		prefix += string(filepath.Separator)
	}
	return strings.HasPrefix(p, prefix) && len(p) > len(prefix)
}

// checkComponent rejects anything that is not exactly one path component:
// empty, ".", "..", containing "/" or NUL, or longer than NAME_MAX.
func checkComponent(kind, s string) error {
	var reason string
	switch {
	case s == "":
		reason = "is empty"
	case s == "." || s == "..":
		reason = "is a relative directory reference"
	case strings.ContainsRune(s, 0):
		reason = "contains a NUL byte"
	case strings.ContainsRune(s, '/'):
		reason = "contains a slash"
	case len(s) > maxComponent:
		reason = fmt.Sprintf("is %d bytes long, the limit is %d", len(s), maxComponent)
	default:
		return nil
	}
	return fmt.Errorf("%w: %s %s %s", volume.ErrInvalidName, kind, quote(s), reason)
}

// CheckPublishName tells whether publishName (volume.PodVolume.PublishName)
// can name a pod's volume directory: nil if Publishing accepts it, else
// an error wrapping volume.ErrInvalidName that says why.
func CheckPublishName(publishName string) error {
	_, err := escapeName("volume name", publishName)
	return err
}

// escapeName validates a PV or pod volume name and returns its on-disk
// form, EscapeQualifiedName(name). Absolute names, names with NUL and names
// with "~" (which would be read back as "/") are rejected before escaping;
// the escaped form must be one path component.
func escapeName(kind, name string) (string, error) {
	switch {
	case strings.HasPrefix(name, "/"):
		return "", fmt.Errorf("%w: %s %s is absolute", volume.ErrInvalidName, kind, quote(name))
	case strings.ContainsRune(name, 0):
		return "", fmt.Errorf("%w: %s %s contains a NUL byte", volume.ErrInvalidName, kind, quote(name))
	case strings.ContainsRune(name, '~'):
		return "", fmt.Errorf("%w: %s %s contains a tilde", volume.ErrInvalidName, kind, quote(name))
	}
	escaped := utilstrings.EscapeQualifiedName(name)
	if err := checkComponent(kind, escaped); err != nil {
		return "", err
	}
	return escaped, nil
}

// checkDriver validates a driver name as a path component. "volumeDevices"
// is taken by the block layout.
func checkDriver(driver string) error {
	if err := checkComponent("driver name", driver); err != nil {
		return err
	}
	if driver == volumeDevicesDir {
		return fmt.Errorf("%w: driver name %q is reserved", volume.ErrInvalidName, driver)
	}
	return nil
}

// quote renders a rejected name for an error message, shortened.
func quote(s string) string {
	if len(s) > maxShown {
		return fmt.Sprintf("%q... (%d bytes)", s[:maxShown], len(s))
	}
	return fmt.Sprintf("%q", s)
}
