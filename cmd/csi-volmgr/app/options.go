package app

import (
	"os"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/runtime"
	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// RunOptions are the flags of `csi-volmgr run`.
type RunOptions struct {
	Kubeconfig           string
	NodeName             string
	RootDir              string
	RegistrationDir      string
	HTTPEndpoint         string
	Profiling            bool
	ResyncPeriod         time.Duration
	CSITimeout           time.Duration
	RemoveTerminating    bool
	WaitForStopped       bool
	ClusterWideInformers bool
	SettledObjectResync  time.Duration
	KubeAPIQPS           float32
	KubeAPIBurst         int
	KubeAPIContentType   string
	Manifests            string
	RegisterNode         bool
	FrontEndpoint        string
	FrontDriver          string
	ChangeOptions

	Logging *logsapi.LoggingConfiguration
}

// NewRunOptions returns the defaults.
func NewRunOptions() *RunOptions {
	host, _ := os.Hostname()
	return &RunOptions{
		NodeName:          host,
		RootDir:           "/var/lib/csi-volmgr",
		HTTPEndpoint:      "127.0.0.1:9809",
		ResyncPeriod:      5 * time.Minute,
		CSITimeout:        csiclient.DefaultTimeout,
		RemoveTerminating: false,
		// The agent's own client budget (the kubelet's is 50/100, shared
		// with its status, events and node heartbeats). Its requests follow
		// the pods: a GET per newly referenced object (a LIST when a burst
		// needs a large share of a namespace), a status write per pod,
		// nothing polled. The burst lets a node start or restart its 110 pods
		// (about 330 requests) without queueing; the rate bounds a runaway.
		// The condition writes and Events have a client of their own with
		// the same budget, so that they never hold up the reads.
		KubeAPIQPS:   100,
		KubeAPIBurst: 400,
		// The kubelet's default: protobuf costs the API server and the
		// agent a fraction of JSON's CPU to encode and decode, which counts
		// when a restart or a burst reads thousands of claims and volumes.
		KubeAPIContentType: runtime.ContentTypeProtobuf,
		// Every referenced object is watched while it is referenced, so
		// that a change (an expansion, issue 14) is acted on at once; large
		// clusters trade that for fewer watches with e.g. 5m (README,
		// Performance).
		SettledObjectResync: 0,
		Logging:             logsapi.NewLoggingConfiguration(),
	}
}

// AddFlags registers the options on fs.
func (o *RunOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "Path to a kubeconfig; empty means the in-cluster configuration.")
	fs.StringVar(&o.NodeName, "node-name", o.NodeName, "Name of the node whose pods this agent serves. With an API server the agent acts only while that Node carries the label csi-volmgr.io/volume-manager=csi-volmgr (--register-node sets it; a runtime beside the agent sets it on its Node); on any other Node, a kubelet's, it mounts and writes nothing and /readyz fails.")
	fs.StringVar(&o.RootDir, "root-dir", o.RootDir, "Root directory of the agent's state (kubelet layout below it).")
	fs.StringVar(&o.RegistrationDir, "registration-dir", o.RegistrationDir, "Directory of plugin-registration sockets; empty means <root-dir>/plugins_registry.")
	fs.StringVar(&o.HTTPEndpoint, "http-endpoint", o.HTTPEndpoint, "TCP address of /metrics, /healthz, /livez and /readyz (open to anyone) and of the API under /api/ and /debug/pprof/, served only to requests the API server authenticates (bearer token, TokenReview) and authorizes (SubjectAccessReview of get, create or update on nodes/csi-volmgr of --node-name; none with --manifests); empty disables it. The whole API is always served without credentials on the root-only socket <root-dir>/"+volumemanager.SocketName+".")
	fs.BoolVar(&o.Profiling, "profiling", o.Profiling, "Serve Go's profiles (pprof) under /debug/pprof/ on the API socket, and on --http-endpoint to authorized callers.")
	fs.DurationVar(&o.ResyncPeriod, "resync-period", o.ResyncPeriod, "How often every volume is reconciled again, besides events.")
	fs.DurationVar(&o.CSITimeout, "csi-timeout", o.CSITimeout, "Timeout of one CSI call.")
	fs.BoolVar(&o.RemoveTerminating, "remove-terminating-pods", o.RemoveTerminating, "Tear down the volumes of pods marked for deletion (for nodes without a kubelet).")
	fs.BoolVar(&o.WaitForStopped, "wait-for-containers-stopped", o.WaitForStopped, "A runtime beside the agent runs the pods' containers: tear a pod's volumes down once the runtime said its containers stopped (POST /api/v1/pods/NAMESPACE/NAME/containers-stopped?uid=UID, or PUT /api/v1/running-pods without the pod, on the API socket) or the pod is terminal, never only because it is marked for deletion or gone from the API server (force delete, pod GC; after a restart, pods found on disk). A runtime that never reports keeps such volumes mounted: status shows them AwaitingRuntime, csi_volmgr_pods_awaiting_runtime counts them.")
	fs.BoolVar(&o.ClusterWideInformers, "cluster-wide-informers", o.ClusterWideInformers, "Cache every PVC, PV and VolumeAttachment of the cluster instead of watching the referenced ones by name (small clusters only).")
	fs.DurationVar(&o.SettledObjectResync, "settled-object-resync", o.SettledObjectResync, "When positive, a referenced PVC, PV or VolumeAttachment that settled (bound, attached) is no longer watched but read again about this often (jittered): fewer watches on the API server, changes such as an expansion seen up to this late. 0 watches every referenced object while it is referenced.")
	fs.Float32Var(&o.KubeAPIQPS, "kube-api-qps", o.KubeAPIQPS, "QPS of the API client.")
	fs.IntVar(&o.KubeAPIBurst, "kube-api-burst", o.KubeAPIBurst, "Burst of the API client.")
	fs.StringVar(&o.KubeAPIContentType, "kube-api-content-type", o.KubeAPIContentType, "Content type of the API client's requests and preferred answers (as the kubelet's flag); JSON is always accepted too.")
	o.addModeFlags(fs)
	o.addFrontFlags(fs)
	o.addChangeFlags(fs)
	logsapi.AddFlags(o.Logging, fs)
}

// Validate checks the flag combinations that only the command has; the
// volume manager checks the rest of its Config, and run names the flag of
// each field it rejects.
func (o *RunOptions) Validate() error {
	return o.validateMode()
}
