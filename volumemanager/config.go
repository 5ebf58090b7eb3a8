package volumemanager

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/lifecycle"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/reconciler"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/selinux"
)

// DefaultSettledObjectResync is how often a settled object is read again
// by default (Config.SettledObjectResync): 2 GETs per pod every 2 minutes
// is less than the kubelet's pod syncs make (1.6 per pod and minute), with
// no standing watch, and a change such as an expansion is seen within 3
// minutes, about a minute on average (docs/performance.md).
const DefaultSettledObjectResync = 2 * time.Minute

// Config is what a runtime decides when it embeds the volume manager; the
// csi-volmgr command fills it from its flags.
type Config struct {
	// NodeName is the node whose pods are served. Required.
	NodeName string
	// RootDir is the root of the agent's state (the kubelet's layout below
	// it), and holds the API socket (SocketPath); absolute. Required.
	RootDir string
	// RegistrationDir is the directory of plugin-registration sockets;
	// empty means <RootDir>/plugins_registry.
	RegistrationDir string
	// KubeClient talks to the API server. Exactly one of KubeClient and
	// Manifests is set.
	KubeClient kubernetes.Interface
	// ReportClient, when set, writes the pods' VolumesReady conditions and
	// the Events instead of KubeClient, so that the condition writes of a
	// burst of pods do not delay the reads their volumes wait for: with a
	// rate limiter of its own, or, as csi-volmgr run gives them, the two
	// lanes of one budget (apibudget), reads first. Cluster mode only.
	ReportClient kubernetes.Interface
	// AuthClient, when set, creates the TokenReviews and
	// SubjectAccessReviews of the TCP endpoint's callers (HTTPEndpoint)
	// instead of KubeClient, with a rate limiter of its own: then callers
	// with made-up tokens cannot spend the budget the volumes' reads wait
	// for. csi-volmgr run gives it a token bucket of its own, of
	// --kube-api-qps and --kube-api-burst. Nil means KubeClient: the
	// reviews then draw from the volumes' budget, bounded per caller
	// address by the failed-authentication limit (apiauth.FailureLimiter).
	// Cluster mode only.
	AuthClient kubernetes.Interface
	// Manifests is the directory that standalone mode reads Pods, PVCs,
	// PVs, Secrets and CSIDrivers from (watched), instead of an API
	// server; volumes are then attached with ControllerPublishVolume by
	// the agent itself.
	Manifests string
	// RegisterNode creates and keeps the Node object of a node without
	// kubelet or runtime with virtual-kubelet's node controller (labels,
	// controller-managed-attach-detach annotation, Ready condition, node
	// Lease), tears down the volumes of pods marked for
	// deletion and then completes their deletion. It implies
	// RemoveTerminatingPods. Cluster mode only.
	RegisterNode bool
	// ExpectedDrivers are the CSI drivers a node needs, with RegisterNode:
	// while one of them is not registered the Node carries the NoSchedule
	// taint csi-volmgr.io/drivers-not-ready (see TaintDriversNotReady for
	// why a taint and not NotReady) — or, under NodeIdentity, whose
	// NodeRestriction forbids a node to change its taints, its Ready
	// condition is False with NodeDriversNotRegisteredReason, which the
	// node lifecycle controller answers with the not-ready taints, NoExecute
	// included (pods without a toleration are evicted after 300s).
	ExpectedDrivers []string
	// NodeCapacity, with RegisterNode, is the Node's status.capacity and
	// status.allocatable (e.g. pods, cpu, memory), kept by every status
	// update. Without "pods" the scheduler places no pod on the Node and
	// pods reach it only by spec.nodeName; nil posts none.
	NodeCapacity corev1.ResourceList
	// NodeLabels, with RegisterNode, are labels of the Node besides the
	// ones the agent sets (OwnerLabel, kubernetes.io/hostname, os, arch),
	// which they may not set; kept by every status update.
	NodeLabels map[string]string
	// NodeTaints, with RegisterNode, are taints the Node is registered
	// with, and that are added to an existing Node the agent keeps when it
	// lacks them, as the kubelet's --register-with-taints (e.g. a NoSchedule
	// taint that only the pods meant for a virtual node tolerate). Status
	// updates leave them alone; one removed by hand stays removed until
	// the agent starts again.
	NodeTaints []corev1.Taint
	// RemoveTerminatingPods tears down the volumes of pods marked for
	// deletion (for nodes without a kubelet). Cluster mode only.
	RemoveTerminatingPods bool
	// WaitForContainersStopped is for a runtime that runs the pods'
	// containers (virtual-kubelet provider, sandbox host): a pod's volumes
	// are torn down once the runtime said its containers stopped
	// (VolumeManager.ContainersStopped, or the HTTP API), its report of the
	// pods it runs no longer has the pod (VolumeManager.RunningPods, or PUT
	// /api/v1/running-pods) or the pod reached a terminal phase — never
	// only because it is marked for deletion or left the API server (or
	// the manifests), while its containers may still use the mounts. A
	// runtime that never reports keeps such volumes mounted
	// (PodVolumesAwaitingRuntime).
	WaitForContainersStopped bool
	// NodeIdentity says that KubeClient (and ReportClient) authenticate as
	// the Node, system:node:<NodeName> in group system:nodes
	// (volumemanager/nodeidentity gives such a client), so that the API
	// server's Node authorizer and NodeRestriction admission hold the agent
	// to its own Node's objects as they hold a kubelet. The agent then reads
	// the way the kubelet reads: the node's pods, its Node and the
	// CSIDrivers by watch, each referenced claim, volume and attachment by
	// GET only (no LIST, no watch: the Node authorizer allows neither),
	// polled with backoff until it settles. Cluster mode only; not with
	// ClusterWideInformers.
	NodeIdentity bool
	// ClusterWideInformers caches every PVC, PV and VolumeAttachment of the
	// cluster instead of watching the referenced ones by name (small
	// clusters only). Cluster mode only.
	ClusterWideInformers bool
	// SettledObjectResync ends the by-name watch of a referenced PVC, PV
	// or VolumeAttachment once it settled (bound, attached) and reads it
	// again with a GET about this often (±50 %) instead: a watch costs
	// the API server memory for as long as it is open, and the agent a
	// watch's buffers. 0 means DefaultSettledObjectResync; negative
	// watches every referenced object while it is referenced (a change is
	// seen at once). Cluster mode only.
	SettledObjectResync time.Duration
	// ResyncPeriod is how often every volume is reconciled again, besides
	// events; 0 means 5m.
	ResyncPeriod time.Duration
	// CSITimeout bounds one CSI call; 0 means csiclient.DefaultTimeout.
	CSITimeout time.Duration
	// FrontEndpoint, when set, serves csi-volmgr's own CSI endpoint on this
	// unix socket in front of the registered driver FrontDriver: Identity
	// answers as that driver, Controller calls pass through, Node calls run
	// through the volume lifecycle. Both or neither are set.
	FrontEndpoint, FrontDriver string
	// HTTPEndpoint, when set, is a TCP address Run serves Handler on
	// besides the API socket (SocketPath of RootDir, always served, mode
	// 0600): /metrics and the health checks to anyone, /api/ and
	// /debug/pprof/ only to requests the API server authenticated
	// (TokenReview) and authorized (SubjectAccessReview of a verb on
	// nodes/csi-volmgr of NodeName, see package apiauth), with KubeClient;
	// in standalone mode it serves no /api/ and no /debug/pprof/. It
	// serves TLS unless HTTPAccess says plaintext on a loopback address;
	// off the loopback /metrics too needs an authorized caller (get on
	// nodes/metrics).
	HTTPEndpoint string
	// HTTPAccess secures HTTPEndpoint: TLS, client certificates, the
	// tokens' audience and the reviews' cache (apiserve_tls.go).
	HTTPAccess HTTPAccessConfig
	// HTTPMaxConnections bounds the TCP endpoint's open connections, at
	// most a quarter of them from one address (an IPv6 address by its
	// /64); a connection past either bound is closed as soon as it is
	// accepted. 0 means DefaultHTTPMaxConnections. The endpoint's other
	// bounds are fixed (apiserve_limits.go): timeouts, header and body
	// sizes, failed authentications per address.
	HTTPMaxConnections int
	// Profiling adds Go's profiles (net/http/pprof) under /debug/pprof/ to
	// Handler, as the kubelet's enableProfilingHandler does: where the heap
	// and CPU of a node agent go, measured on the node that has them.
	Profiling bool
	// Changes tunes what is done for volumes that change while in use
	// (see ChangesConfig).
	Changes ChangesConfig
	// Version is reported in the logs.
	Version string
	// Tuning holds the knobs that tests and benchmarks turn; the zero
	// value is the production default.
	Tuning Tuning

	// limits replaces the TCP endpoint's bounds in tests (export_test.go).
	limits *ServerLimits
	// servingCertClock replaces the self-signed certificate renewer's
	// clock in tests (export_test.go).
	servingCertClock clock.WithTicker
}

// ChangesConfig tunes what is done for volumes that change while in use:
// the mount check after driver restarts.
type ChangesConfig = lifecycle.ChangesConfig

// Tuning holds the knobs that tests and benchmarks turn.
type Tuning struct {
	// Reconciler tunes the reconciler (workers, backoff, shutdown grace)
	// and may observe the pods whose volumes became ready; its wiring
	// fields are filled in by the lifecycle.
	Reconciler reconciler.Config
	// RegistryRetryBaseDelay and RegistryRetryMaxDelay bound the backoff
	// of failed driver registrations; 0 means 500ms and 2m.
	RegistryRetryBaseDelay, RegistryRetryMaxDelay time.Duration
	// NodeLeaseDuration and NodeStatusInterval tune the Node that
	// RegisterNode keeps: the node Lease's duration (renewed every quarter
	// of it) and how often its status is posted; 0 means 40s and 1m.
	NodeLeaseDuration, NodeStatusInterval time.Duration
	// ManifestsDebounce is how long standalone mode waits for more changes
	// to a manifest file before reading it; 0 means the manifests
	// source's default.
	ManifestsDebounce time.Duration
	// StepLivenessBound is how long a lifecycle worker may stay inside one
	// step without progress before /healthz and /livez fail; 0 means twice
	// the CSI call timeout.
	StepLivenessBound time.Duration
	// PodWatchLivenessBound is how long the watch of the node's pods may
	// fail without a break before /healthz and /livez fail; 0 means
	// DefaultPodWatchLivenessBound.
	PodWatchLivenessBound time.Duration
	// SELinux turns pods' SELinux options into the context= their volumes
	// are mounted with; nil asks the host's policy (on a host without
	// SELinux no volume gets a context). selinux.Defaults stands for an
	// SELinux host in tests.
	SELinux selinux.Translator
}

// validate checks c and fills its derived defaults. Every error about one
// field is a *ConfigError; they are joined.
func (c *Config) validate() error {
	var errs []error
	bad := func(field string, err error) { errs = append(errs, &ConfigError{Field: field, Err: err}) }
	if c.NodeName == "" {
		bad("NodeName", errors.New("is required"))
	}
	if !filepath.IsAbs(c.RootDir) {
		bad("RootDir", fmt.Errorf("%q must be an absolute path", c.RootDir))
	}
	if c.RegistrationDir == "" {
		c.RegistrationDir = filepath.Join(c.RootDir, "plugins_registry")
	} else if !filepath.IsAbs(c.RegistrationDir) {
		bad("RegistrationDir", fmt.Errorf("%q must be an absolute path", c.RegistrationDir))
	} else if filepath.Clean(c.RegistrationDir) == filepath.Clean(c.RootDir) {
		// The registry would take the API socket for a plugin's.
		bad("RegistrationDir", fmt.Errorf("%q must not be the root directory, which holds the API socket %s", c.RegistrationDir, SocketName))
	}
	if (c.KubeClient == nil) == (c.Manifests == "") {
		errs = append(errs, errors.New("exactly one of an API client and a manifest directory is required"))
	}
	if c.ReportClient != nil && c.KubeClient == nil {
		bad("ReportClient", errors.New("needs KubeClient (cluster mode)"))
	}
	if c.AuthClient != nil && c.KubeClient == nil {
		bad("AuthClient", errors.New("needs KubeClient (cluster mode)"))
	}
	if c.HTTPMaxConnections < 0 {
		bad("HTTPMaxConnections", fmt.Errorf("%d must not be negative (0 means %d)", c.HTTPMaxConnections, DefaultHTTPMaxConnections))
	}
	if c.Manifests != "" && (c.RegisterNode || c.RemoveTerminatingPods || c.ClusterWideInformers) {
		bad("Manifests", errors.New("runs without an API server: node registration, removing terminating pods and cluster-wide informers need one"))
	}
	if c.NodeIdentity && c.Manifests != "" {
		bad("NodeIdentity", errors.New("needs an API server (cluster mode)"))
	}
	if c.NodeIdentity && c.SettledObjectResync < 0 {
		bad("SettledObjectResync", errors.New("must be positive with the Node's identity: the Node authorizer lets a node watch no claims, volumes or attachments, so settled ones are read again by GET"))
	}
	if c.NodeIdentity && c.ClusterWideInformers {
		bad("ClusterWideInformers", errors.New("cannot be used with the Node's identity: the Node authorizer lets a node list no claims, volumes or attachments"))
	}
	if c.RegisterNode {
		c.RemoveTerminatingPods = true
	}
	if len(c.ExpectedDrivers) > 0 && !c.RegisterNode {
		bad("ExpectedDrivers", errors.New("needs RegisterNode: the taint goes on the Node the agent registers"))
	}
	errs = append(errs, c.validateNode()...)
	if c.ResyncPeriod < 0 {
		bad("ResyncPeriod", fmt.Errorf("%v must not be negative", c.ResyncPeriod))
	}
	if c.CSITimeout < 0 {
		bad("CSITimeout", fmt.Errorf("%v must not be negative", c.CSITimeout))
	}
	switch {
	case c.FrontEndpoint == "" && c.FrontDriver != "":
		bad("FrontDriver", errors.New("is set without a front endpoint"))
	case c.FrontEndpoint != "" && c.FrontDriver == "":
		bad("FrontEndpoint", errors.New("is set without a front driver"))
	case c.FrontEndpoint != "":
		if _, err := csiclient.ParseEndpoint(c.FrontEndpoint); err != nil {
			bad("FrontEndpoint", err)
		}
	}
	if c.HTTPEndpoint != "" {
		if _, _, err := net.SplitHostPort(c.HTTPEndpoint); err != nil {
			bad("HTTPEndpoint", fmt.Errorf("%q: %w", c.HTTPEndpoint, err))
		}
		errs = append(errs, c.HTTPAccess.validate(c.HTTPEndpoint, c.KubeClient != nil)...)
	}
	return errors.Join(errs...)
}

// ConfigError is an error in one field of Config that a user has to fix,
// e.g. a root directory that is not writable or an HTTP endpoint in use:
// the csi-volmgr command names the flag of Field in its one line.
type ConfigError struct {
	// Field is the Config field at fault, e.g. "RootDir".
	Field string
	// Err says what is wrong, starting with the field's value.
	Err error
}

func (e *ConfigError) Error() string { return e.Field + " " + e.Err.Error() }

// Unwrap returns Err.
func (e *ConfigError) Unwrap() error { return e.Err }
