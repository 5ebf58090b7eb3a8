package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/component-base/featuregate"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/test/plugin"
)

// version is set with -ldflags "-X main.version=...".
var version = "dev"

// quantity is a flag.Value for byte counts written as Kubernetes quantities ("10Gi", "1073741824").
type quantity struct{ bytes *int64 }

// String prints the quantity in binary SI units.
func (q quantity) String() string {
	if q.bytes == nil {
		return ""
	}
	return resource.NewQuantity(*q.bytes, resource.BinarySI).String()
}

// Set parses a quantity.
func (q quantity) Set(s string) error {
	v, err := resource.ParseQuantity(s)
	if err != nil {
		return err
	}
	*q.bytes = v.Value()
	return nil
}

// topology is a flag.Value for "key=value,..." topology segments.
type topology struct{ m *map[string]string }

// String prints the segments as key=value,... with keys sorted.
func (t topology) String() string {
	if t.m == nil {
		return ""
	}
	return plugin.FormatTopology(*t.m)
}

// Set parses key=value,... segments.
func (t topology) Set(s string) error {
	m, err := plugin.ParseTopology(s)
	if err != nil {
		return err
	}
	*t.m = m
	return nil
}

// fileMode is a flag.Value for octal permission bits ("0755").
type fileMode struct{ m *os.FileMode }

func (f fileMode) String() string {
	if f.m == nil || *f.m == 0 {
		return ""
	}
	return fmt.Sprintf("%#o", uint32(*f.m))
}

func (f fileMode) Set(s string) error {
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil || v&^0o777 != 0 {
		return fmt.Errorf("%q is not an octal permission mode", s)
	}
	*f.m = os.FileMode(v)
	return nil
}

func main() {
	cfg := plugin.Config{Capabilities: plugin.DefaultCapabilities(), Capacity: plugin.DefaultCapacity, VendorVersion: version}
	fs := flag.CommandLine
	fs.StringVar(&cfg.Endpoint, "endpoint", "", "Unix socket path (or unix:// URL) to serve CSI on.")
	fs.StringVar(&cfg.Name, "name", plugin.DefaultName, "Driver name.")
	fs.StringVar(&cfg.NodeID, "node-id", "", "Node ID reported by NodeGetInfo (default: the host name).")
	fs.StringVar(&cfg.StateDir, "state-dir", "", "Directory for the state file and the volumes' storage.")
	fs.Int64Var(&cfg.MaxVolumesPerNode, "max-volumes-per-node", 0, "Volume limit reported by NodeGetInfo and enforced by ControllerPublishVolume; 0 for none.")
	fs.Var(topology{&cfg.Topology}, "topology", "Accessible topology of the node, as key=value,key2=value2.")
	fs.Var(quantity{&cfg.Capacity}, "capacity", "Total capacity reported by GetCapacity, as a quantity (e.g. 100Gi).")
	fs.StringVar(&cfg.RegistrationDir, "registration-dir", "", "If set, serve the kubelet plugin-registration API on <dir>/<name>-reg.sock.")
	fs.StringVar(&cfg.ControlFile, "control-file", "", "JSON fault-injection file, re-read when it changes.")
	fs.StringVar(&cfg.JournalPath, "journal", "", "JSON-lines file that records every call.")
	fs.BoolVar(&cfg.Capabilities.StageUnstage, "node-stage-unstage", cfg.Capabilities.StageUnstage, "Advertise node STAGE_UNSTAGE_VOLUME.")
	fs.BoolVar(&cfg.Capabilities.Expand, "node-expand-volume", cfg.Capabilities.Expand, "Advertise node and controller EXPAND_VOLUME.")
	fs.BoolVar(&cfg.Capabilities.VolumeStats, "node-get-volume-stats", cfg.Capabilities.VolumeStats, "Advertise node GET_VOLUME_STATS.")
	fs.BoolVar(&cfg.Capabilities.VolumeHealth, "node-get-volume-health", cfg.Capabilities.VolumeHealth, "Advertise node GET_VOLUME_HEALTH.")
	fs.BoolVar(&cfg.Capabilities.VolumeMountGroup, "node-volume-mount-group", cfg.Capabilities.VolumeMountGroup, "Advertise node VOLUME_MOUNT_GROUP.")
	fs.BoolVar(&cfg.Capabilities.SingleNodeMultiWriter, "single-node-multi-writer", cfg.Capabilities.SingleNodeMultiWriter, "Advertise SINGLE_NODE_MULTI_WRITER (node and controller).")
	fs.BoolVar(&cfg.Capabilities.NodeOnly, "node-only", cfg.Capabilities.NodeOnly, "Advertise no CONTROLLER_SERVICE (a node-only plugin); the controller RPCs still answer, for volumes created out of band.")
	fs.BoolVar(&cfg.Capabilities.ControllerPublish, "controller-publish-unpublish", cfg.Capabilities.ControllerPublish, "Advertise controller PUBLISH_UNPUBLISH_VOLUME and PUBLISH_READONLY, and require their publish_context on the node.")
	fs.Var(fileMode{&cfg.VolumeDirMode}, "volume-dir-mode", "Mode (octal) of a new filesystem volume's directory; 0755 stands for a freshly made filesystem. Default 0777.")
	showVersion := fs.Bool("version", false, "Print the version and exit.")

	fg := featuregate.NewFeatureGate()
	if err := logsapi.AddFeatureGates(fg); err != nil {
		klog.ErrorS(err, "Failed to add logging feature gates")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	logCfg := logsapi.NewLoggingConfiguration()
	logsapi.AddGoFlags(logCfg, fs)
	logs.InitLogs()
	flag.Parse()
	if err := logsapi.ValidateAndApply(logCfg, fg); err != nil {
		klog.ErrorS(err, "Invalid logging configuration")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	if *showVersion {
		fmt.Println(os.Args[0], version)
		os.Exit(0)
	}
	if fs.NArg() > 0 {
		klog.ErrorS(nil, "Unexpected arguments", "args", fs.Args())
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	logger := klog.LoggerWithName(klog.Background(), "csi-testplugin")
	ctx = klog.NewContext(ctx, logger)

	srv, err := plugin.New(cfg)
	if err != nil {
		logger.Error(err, "Failed to start")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	if err := srv.Run(ctx); err != nil {
		logger.Error(err, "Plugin failed")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	logs.FlushLogs()
}
