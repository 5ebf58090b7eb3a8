package operations

import (
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"time"

	"k8s.io/mount-utils"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/paths"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// ErrInvalidConfig is wrapped by the error New returns for an unusable
// Config.
var ErrInvalidConfig = errors.New("invalid operations config")

// Config is what Operations need. Drivers, Policies, Attachments and State
// are required.
type Config struct {
	// RootDir is the agent's root directory (absolute); see lifecycle/paths.
	RootDir string
	// NodeName is this node's name, for VolumeAttachment names and records.
	NodeName string
	// Drivers finds registered drivers' clients.
	Drivers Drivers
	// Policies gives each driver's CSIDriver policy.
	Policies Policies
	// Attachments reads VolumeAttachments for drivers that need attach.
	Attachments Attachments
	// State is the actual state of world (*asw.World).
	State ActualState
	// Secrets reads stage and publish Secrets; nil fails every volume that
	// names one.
	Secrets Secrets
	// Tokens issues service account tokens; nil fails publishes for drivers
	// whose CSIDriver has tokenRequests.
	Tokens Tokens
	// Mounts inspects the mount table; nil means mount.New("").
	Mounts Mounts
	// Observer receives every step's duration and outcome; nil records
	// nothing.
	Observer Observer
	// Ownership receives what the fsGroup ownership changes do; nil
	// records nothing.
	Ownership OwnershipObserver
	// OnProgress, if set, is called whenever the progress of a long setup
	// step on a pod's volume (asw.Pod.Progress) was recorded, e.g. to
	// refresh the pod's condition. It must not block.
	OnProgress func(key volume.PodKey)
	// ProgressInterval is how often that progress is recorded; 0 means 5s.
	ProgressInterval time.Duration
	// Gate, when set, refuses the lifecycle's steps (Stage, Publish,
	// Unpublish, Unstage, Expand) while the agent does not own its Node,
	// with an error wrapping nodeowner.ErrNotOwned, before anything is
	// recorded: the last check behind the reconciler's own wait. The
	// front endpoint's requests are a container orchestrator's and are
	// not gated.
	Gate interface {
		Err() error
	}
	// Wanted, when set, is the desired state, asked under the step's lock
	// whether a Stage or Publish is still wanted: a step decided from an
	// older view (the mount check's or the republisher's snapshot, taken
	// before a teardown that held the lock) is refused with an error
	// wrapping volume.ErrNotWanted before anything is recorded or called.
	Wanted Wanted
}

// Wanted says whether the desired state still wants a volume staged and a
// pod's use of it published.
type Wanted interface {
	VolumeWanted(name volume.Name) bool
	UseWanted(key volume.PodKey) bool
}

// Operations performs the CSI steps of the lifecycle, one step per call:
// WaitForAttach, Stage, Publish, Unpublish and Unstage for the reconciler,
// and the same steps as a container orchestrator asks for them through the
// front endpoint (caller.go). Each call is a plain
// method that returns an error; it records its outcome in the actual state
// of world (mapping csiclient's error classes to states as the kubelet
// does, see transitions.go), keeps the on-disk records (written before the
// CSI call, removed after a successful teardown) and is serialized with the
// other steps on the same volume as documented on locks. Operations is safe
// for concurrent use; callers (the reconciler, the front endpoint) need no
// locking of their own.
type Operations struct {
	layout      paths.Layout
	nodeName    string
	drivers     Drivers
	policies    Policies
	attachments Attachments
	state       ActualState
	secrets     Secrets
	tokens      Tokens
	mounts      Mounts
	// stat stats a path (StatMount; tests make paths look broken).
	stat     func(string) (fs.FileInfo, error)
	observer Observer
	gate     interface{ Err() error }
	wanted   Wanted
	owners   *owners

	locks   *locks
	tree    *tree
	digests *digests
}

// New returns Operations for cfg.
func New(cfg Config) (*Operations, error) {
	layout, err := paths.New(cfg.RootDir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	var missing []string
	for name, isNil := range map[string]bool{
		"NodeName":    cfg.NodeName == "",
		"Drivers":     cfg.Drivers == nil,
		"Policies":    cfg.Policies == nil,
		"Attachments": cfg.Attachments == nil,
		"State":       cfg.State == nil,
	} {
		if isNil {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return nil, fmt.Errorf("%w: missing %s", ErrInvalidConfig, strings.Join(missing, ", "))
	}
	mounts := cfg.Mounts
	if mounts == nil {
		mounts = mount.New("")
	}

	return &Operations{
		layout:      layout,
		nodeName:    cfg.NodeName,
		drivers:     cfg.Drivers,
		policies:    cfg.Policies,
		attachments: cfg.Attachments,
		state:       cfg.State,
		secrets:     cfg.Secrets,
		tokens:      cfg.Tokens,
		mounts:      mounts,
		stat:        StatMount,
		observer:    cfg.Observer,
		gate:        cfg.Gate,
		wanted:      cfg.Wanted,
		owners:      newOwners(cfg),
		locks:       newLocks(),
		tree:        &tree{mounts: mounts},
		digests:     newDigests(),
	}, nil
}

// notOwned returns the Gate's error while the agent does not own its Node,
// nil otherwise (and without a Gate).
func (o *Operations) notOwned() error {
	if o.gate == nil {
		return nil
	}
	return o.gate.Err()
}

// volumeNotWanted returns an error wrapping volume.ErrNotWanted when the
// desired state no longer wants name staged; the volume's lock must be
// held.
func (o *Operations) volumeNotWanted(name volume.Name) error {
	if o.wanted == nil || o.wanted.VolumeWanted(name) {
		return nil
	}
	return fmt.Errorf("stage of %s: %w", name, volume.ErrNotWanted)
}

// useNotWanted returns an error wrapping volume.ErrNotWanted when the
// desired state no longer wants the pod's use published; the pod's lock
// must be held.
func (o *Operations) useNotWanted(key volume.PodKey) error {
	if o.wanted == nil || o.wanted.UseWanted(key) {
		return nil
	}
	return fmt.Errorf("publish of %s: %w", key, volume.ErrNotWanted)
}

// Layout returns the path layout the operations use.
func (o *Operations) Layout() paths.Layout { return o.layout }

// driver returns the client of a registered driver, or an error wrapping
// volume.ErrDriverNotRegistered.
func (o *Operations) driver(name string) (DriverClient, error) {
	c, ok := o.drivers.Driver(name)
	if !ok || c == nil {
		return nil, fmt.Errorf("%w: %q", volume.ErrDriverNotRegistered, name)
	}
	return c, nil
}

// observe reports a step to the Observer, if any.
func (o *Operations) observe(driver string, step volume.Step, access volume.AccessType, migrated bool, start time.Time, err error) {
	if o.observer != nil {
		o.observer.ObserveOperation(driver, step, access, migrated, err, time.Since(start))
	}
}

// alreadyDone turns csiclient.ErrAlreadyDone (NotFound on a teardown call)
// into success.
func alreadyDone(err error) error {
	if csiclient.IsAlreadyDone(err) {
		return nil
	}
	return err
}
