package plugintest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/process"
)

const (
	// DefaultNodeID is the node ID a plugin started without Options.NodeID reports.
	DefaultNodeID = "testnode"
	// stopTimeout bounds the wait for a plugin to exit after SIGTERM before it is killed.
	stopTimeout = 30 * time.Second
	// pollInterval is how often the journal is re-read while waiting on it.
	pollInterval = 10 * time.Millisecond
	// logTail is how much of the plugin's log a failed test prints.
	logTail = 16 << 10
)

// Options configures a plugin process. The zero value starts a plugin with default capabilities in
// a fresh temporary directory.
type Options struct {
	// Name is the driver name; default plugin.DefaultName.
	Name string
	// NodeID is the node ID; default DefaultNodeID.
	NodeID string
	// Capabilities selects the optional capabilities; nil means plugin.DefaultCapabilities().
	Capabilities *plugin.Capabilities
	// RegistrationDir, when set, makes the plugin serve <RegistrationDir>/<Name>-reg.sock.
	RegistrationDir string
	// MaxVolumesPerNode is the node's volume limit; 0 for none.
	MaxVolumesPerNode int64
	// Topology is the node's accessible topology.
	Topology map[string]string
	// Capacity is the total capacity in bytes; 0 means plugin.DefaultCapacity.
	Capacity int64
	// Dir holds the socket, state, journal, control file and log unless they are given separately.
	// Default: a new directory under os.TempDir with a short path (unix socket paths are limited to
	// 107 bytes), removed by Close.
	Dir string
	// StateDir is the plugin's state directory; default <Dir>/state.
	StateDir string
	// Endpoint is the CSI socket path; default <Dir>/csi.sock.
	Endpoint string
	// Verbosity is the plugin's klog -v level; 0 means 5, which logs every request and response.
	Verbosity int
	// VolumeDirMode is the mode of new filesystem volumes' directories (--volume-dir-mode); 0 keeps
	// the plugin's default 0777. 0755 stands for a driver whose volumes are freshly made filesystems.
	VolumeDirMode os.FileMode
	// ExtraArgs are appended to the command line.
	ExtraArgs []string
}

// Plugin is a handle on one plugin process (and its successors after Restart).
// Its methods are safe for concurrent use.
//
// The embedded Process is the plugin process: its Kill is a crash (sockets, mounts and loop
// devices stay behind), its Stop a graceful exit that removes the sockets (an unclean exit is an
// error, and a race report makes the exit code 66; SIGKILL after 30s), its Restart starts it
// again with the same options and state directory and waits until it serves, and its Exited
// channel closes e.g. after a fault rule with "exit" fired.
type Plugin struct {
	*process.Process

	// Endpoint is the CSI socket path.
	Endpoint string
	// RegistrationSocket is the plugin-registration socket path, "" without Options.RegistrationDir.
	RegistrationSocket string
	// Dir, StateDir, JournalPath, ControlFile and LogFile are where the plugin keeps its files.
	Dir, StateDir, JournalPath, ControlFile, LogFile string
	// Name and NodeID are the driver name and node ID the plugin reports.
	Name, NodeID string

	ownsDir bool
}

// Start launches a plugin for a test and registers its Close with t.Cleanup. When the test has
// failed, the end of the plugin's log is printed first. Create directories the plugin will mount
// into before calling Start (or clean them up yourself): cleanups run last-in first-out, and a
// t.TempDir registered after Start would be removed while still mounted.
func Start(t testing.TB, opts Options) *Plugin {
	t.Helper()
	p, err := Launch(t.Context(), opts)
	if err != nil {
		t.Fatalf("start test plugin: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("test plugin log (%s), last %d bytes:\n%s", p.LogFile, logTail, p.TailLog(logTail))
		}
		if err := p.Close(); err != nil {
			t.Errorf("close test plugin: %v", err)
		}
	})
	return p
}

// Launch builds the binary if needed, starts the plugin and waits until it serves its endpoint
// (and registration socket). The caller owns the result and must Close it.
func Launch(ctx context.Context, opts Options) (*Plugin, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	p := &Plugin{Name: opts.Name, NodeID: opts.NodeID, Dir: opts.Dir}
	if p.Name == "" {
		p.Name = plugin.DefaultName
	}
	if p.NodeID == "" {
		p.NodeID = DefaultNodeID
	}
	if p.Dir == "" {
		if p.Dir, err = os.MkdirTemp("", "tp"); err != nil {
			return nil, fmt.Errorf("create plugin directory: %w", err)
		}
		p.ownsDir = true
	} else if err := os.MkdirAll(p.Dir, 0o750); err != nil {
		return nil, fmt.Errorf("create plugin directory: %w", err)
	}
	p.StateDir, p.Endpoint = opts.StateDir, opts.Endpoint
	if p.StateDir == "" {
		p.StateDir = filepath.Join(p.Dir, "state")
	}
	if p.Endpoint == "" {
		p.Endpoint = filepath.Join(p.Dir, "csi.sock")
	}
	p.JournalPath = filepath.Join(p.Dir, "journal.jsonl")
	p.ControlFile = filepath.Join(p.Dir, "faults.json")
	p.LogFile = filepath.Join(p.Dir, "plugin.log")
	if opts.RegistrationDir != "" {
		p.RegistrationSocket = plugin.RegistrationSocket(opts.RegistrationDir, p.Name)
	}
	p.Process = process.New(process.Options{
		Name:        "plugin",
		Path:        bin,
		Args:        p.commandLine(opts),
		LogFile:     p.LogFile,
		Ready:       p.serving,
		StopTimeout: stopTimeout,
	})
	if err := p.Start(ctx); err != nil {
		return nil, errors.Join(err, p.Close())
	}
	return p, nil
}

func (p *Plugin) commandLine(opts Options) []string {
	caps := plugin.DefaultCapabilities()
	if opts.Capabilities != nil {
		caps = *opts.Capabilities
	}
	verbosity := opts.Verbosity
	if verbosity == 0 {
		verbosity = 5
	}
	flag := func(name string, on bool) string { return "--" + name + "=" + strconv.FormatBool(on) }
	args := []string{
		"--endpoint=" + p.Endpoint,
		"--name=" + p.Name,
		"--node-id=" + p.NodeID,
		"--state-dir=" + p.StateDir,
		"--journal=" + p.JournalPath,
		"--control-file=" + p.ControlFile,
		"--max-volumes-per-node=" + strconv.FormatInt(opts.MaxVolumesPerNode, 10),
		"--v=" + strconv.Itoa(verbosity),
		flag("node-stage-unstage", caps.StageUnstage),
		flag("node-expand-volume", caps.Expand),
		flag("node-get-volume-stats", caps.VolumeStats),
		flag("node-get-volume-health", caps.VolumeHealth),
		flag("node-volume-mount-group", caps.VolumeMountGroup),
		flag("single-node-multi-writer", caps.SingleNodeMultiWriter),
		flag("controller-publish-unpublish", caps.ControllerPublish),
		flag("node-only", caps.NodeOnly),
	}
	if opts.VolumeDirMode != 0 {
		args = append(args, fmt.Sprintf("--volume-dir-mode=%o", uint32(opts.VolumeDirMode)))
	}
	if opts.Capacity > 0 {
		args = append(args, "--capacity="+strconv.FormatInt(opts.Capacity, 10))
	}
	if len(opts.Topology) > 0 {
		args = append(args, "--topology="+plugin.FormatTopology(opts.Topology))
	}
	if opts.RegistrationDir != "" {
		args = append(args, "--registration-dir="+opts.RegistrationDir)
	}
	return append(args, opts.ExtraArgs...)
}

// serving tells when a started plugin is ready: its "start" journal entry is written once its
// sockets listen.
func (p *Plugin) serving(ctx context.Context, pid int) error {
	_, err := p.WaitForJournal(ctx, func(entries []plugin.Entry) bool {
		return slices.ContainsFunc(entries, func(e plugin.Entry) bool { return e.Event == plugin.EventStart && e.PID == pid })
	})
	return err
}

// Dial opens a gRPC client connection to the plugin's CSI endpoint. The caller closes it.
func (p *Plugin) Dial() (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient("unix://"+p.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", p.Endpoint, err)
	}
	return conn, nil
}

// Volumes returns the volumes in the plugin's state file.
func (p *Plugin) Volumes() ([]plugin.Volume, error) {
	return plugin.LoadState(p.StateDir)
}

// Close stops the plugin (SIGTERM, SIGKILL after 30s), unmounts everything that shows one of its
// volumes and detaches its loop devices, and removes Dir if Launch created it.
func (p *Plugin) Close() error {
	var errs []error
	if err := p.Process.Close(); err != nil {
		errs = append(errs, err)
	}
	if err := plugin.CleanupMounts(p.StateDir); err != nil {
		// Removing Dir now could delete through a mount; leave it for inspection.
		return errors.Join(append(errs, fmt.Errorf("clean up mounts: %w", err))...)
	}
	if p.ownsDir {
		if err := os.RemoveAll(p.Dir); err != nil {
			errs = append(errs, fmt.Errorf("remove plugin directory: %w", err))
		}
	}
	return errors.Join(errs...)
}
