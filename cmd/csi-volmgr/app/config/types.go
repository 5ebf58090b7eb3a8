// Package config is the file form of `csi-volmgr run`'s flags: the
// versioned kind CSIVolmgrConfiguration (apiVersion
// config.csi-volmgr.io/v1alpha1), as the kubelet's KubeletConfiguration
// is the file form of its flags. `csi-volmgr run --config FILE` reads it;
// flags given on the command line override it. Every field is one flag;
// durations are Go duration strings ("1m30s").
package config

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logsapi "k8s.io/component-base/logs/api/v1"
)

// The group, version and kind of a configuration file.
const (
	GroupName  = "config.csi-volmgr.io"
	Version    = "v1alpha1"
	APIVersion = GroupName + "/" + Version
	Kind       = "CSIVolmgrConfiguration"
)

// CSIVolmgrConfiguration holds every setting of `csi-volmgr run`. The
// comment of each field names its flag.
type CSIVolmgrConfiguration struct {
	metav1.TypeMeta `json:",inline"`

	// kubeconfig is the path of a kubeconfig; empty means the in-cluster
	// configuration (--kubeconfig).
	Kubeconfig string `json:"kubeconfig"`
	// nodeIdentity makes the agent act on the API server as its Node,
	// system:node:<nodeName> in system:nodes, with a client certificate it
	// asks for with the kubeconfig's (or the in-cluster) credentials, keeps
	// in certDir and renews before it expires; the API server's Node
	// authorizer and NodeRestriction then hold it to its Node's objects
	// (--node-identity).
	NodeIdentity bool `json:"nodeIdentity"`
	// certDir holds the Node's client certificate and key and the
	// self-signed serving certificate of httpEndpoint; empty means
	// <rootDir>/pki (--cert-dir).
	CertDir string `json:"certDir"`
	// kubeAPIQPS is the queries per second of the agent's API requests,
	// all its clients together on one token bucket (--kube-api-qps).
	KubeAPIQPS float32 `json:"kubeAPIQPS"`
	// kubeAPIBurst is the burst of that token bucket (--kube-api-burst).
	KubeAPIBurst int `json:"kubeAPIBurst"`
	// kubeAPIContentType is the content type of the API client's requests
	// and preferred answers, as the kubelet's; JSON is always accepted too
	// (--kube-api-content-type).
	KubeAPIContentType string `json:"kubeAPIContentType"`

	// nodeName is the node whose pods this agent serves; empty means the
	// host name (--node-name).
	NodeName string `json:"nodeName"`
	// rootDir is the root directory of the agent's state, the kubelet's
	// layout below it, and holds the API socket csi-volmgr.sock and the lock
	// file (--root-dir).
	RootDir string `json:"rootDir"`
	// registrationDir is the directory of plugin-registration sockets;
	// empty means <rootDir>/plugins_registry (--registration-dir).
	RegistrationDir string `json:"registrationDir"`
	// httpEndpoint is the TCP address of the health checks (open), of
	// /metrics (open on a loopback address, else authorized as
	// nodes/metrics) and of /api/ and /debug/pprof/ (authenticated and
	// authorized); TLS unless httpEndpointPlaintext; empty disables it
	// (--http-endpoint).
	HTTPEndpoint string `json:"httpEndpoint"`
	// httpEndpointPlaintext serves plain HTTP on httpEndpoint, which must
	// then be a loopback address (--http-endpoint-plaintext).
	HTTPEndpointPlaintext bool `json:"httpEndpointPlaintext"`
	// tlsCertFile and tlsPrivateKeyFile are the serving certificate and key
	// of httpEndpoint, read again when they change; empty means a
	// self-signed certificate kept in certDir (--tls-cert-file,
	// --tls-private-key-file).
	TLSCertFile       string `json:"tlsCertFile"`
	TLSPrivateKeyFile string `json:"tlsPrivateKeyFile"`
	// tlsMinVersion is the lowest TLS version served, VersionTLS12 or
	// VersionTLS13 (--tls-min-version).
	TLSMinVersion string `json:"tlsMinVersion"`
	// tlsCipherSuites are the TLS 1.2 cipher suites served; empty means
	// Go's defaults (--tls-cipher-suites).
	TLSCipherSuites []string `json:"tlsCipherSuites"`
	// clientCAFile is the CA bundle of the client certificates httpEndpoint
	// accepts (--client-ca-file).
	ClientCAFile string `json:"clientCAFile"`
	// apiAudiences are the audiences a bearer token must be issued for
	// (--api-audiences).
	APIAudiences []string `json:"apiAudiences"`
	// authenticationTokenWebhookCacheTTL is how long a token's review is
	// cached (--authentication-token-webhook-cache-ttl).
	AuthenticationTokenWebhookCacheTTL metav1.Duration `json:"authenticationTokenWebhookCacheTTL"`
	// authorizationWebhookCacheAuthorizedTTL is how long an allowed
	// request's review is cached
	// (--authorization-webhook-cache-authorized-ttl).
	AuthorizationWebhookCacheAuthorizedTTL metav1.Duration `json:"authorizationWebhookCacheAuthorizedTTL"`
	// authorizationWebhookCacheUnauthorizedTTL is how long a denied
	// request's review is cached
	// (--authorization-webhook-cache-unauthorized-ttl).
	AuthorizationWebhookCacheUnauthorizedTTL metav1.Duration `json:"authorizationWebhookCacheUnauthorizedTTL"`
	// httpMaxConnections bounds httpEndpoint's open connections, a
	// quarter of them from one address (--http-max-connections).
	HTTPMaxConnections int `json:"httpMaxConnections"`
	// profiling serves Go's profiles under /debug/pprof/ (--profiling).
	Profiling bool `json:"profiling"`

	// manifests, in standalone mode, is the directory of Pod, PVC, PV,
	// Secret and CSIDriver manifests read instead of an API server
	// (--manifests).
	Manifests string `json:"manifests"`
	// registerNode creates and keeps the Node object of a node without
	// kubelet; implies removeTerminatingPods (--register-node).
	RegisterNode bool `json:"registerNode"`
	// nodePods is the pod capacity (and allocatable) of the Node that
	// registerNode keeps; 0 posts none, and then no scheduler places pods
	// on it (--node-pods).
	NodePods int `json:"nodePods"`
	// nodeCPU is the cpu capacity (and allocatable) of the registered
	// Node, a quantity such as "8"; empty posts none (--node-cpu).
	NodeCPU string `json:"nodeCPU"`
	// nodeMemory is the memory capacity (and allocatable) of the
	// registered Node, a quantity such as "16Gi"; empty posts none
	// (--node-memory).
	NodeMemory string `json:"nodeMemory"`
	// nodeLabels are labels of the registered Node besides the agent's own
	// (--node-labels).
	NodeLabels map[string]string `json:"nodeLabels"`
	// nodeTaints are taints the registered Node carries from its
	// registration, as the kubelet's registerWithTaints; by default
	// csi-volmgr.io/virtual=true:NoSchedule, so that only pods that
	// tolerate it are scheduled to a node that runs no containers itself
	// (--node-taints).
	NodeTaints []corev1.Taint `json:"nodeTaints"`
	// expectedDrivers, with registerNode, are the CSI drivers the node
	// needs: until all have registered the Node carries the NoSchedule
	// taint csi-volmgr.io/drivers-not-ready, or with nodeIdentity is
	// NotReady (--expected-drivers).
	ExpectedDrivers []string `json:"expectedDrivers"`

	// removeTerminatingPods tears down the volumes of pods marked for
	// deletion, for nodes without a kubelet (--remove-terminating-pods).
	RemoveTerminatingPods bool `json:"removeTerminatingPods"`
	// waitForContainersStopped holds a pod's teardown until the runtime
	// beside the agent reported its containers stopped
	// (--wait-for-containers-stopped).
	WaitForContainersStopped bool `json:"waitForContainersStopped"`
	// clusterWideInformers caches every PVC, PV and VolumeAttachment of
	// the cluster instead of watching the referenced ones by name
	// (--cluster-wide-informers).
	ClusterWideInformers bool `json:"clusterWideInformers"`
	// settledObjectResync, when positive, stops watching a settled PVC, PV
	// or VolumeAttachment and reads it again about this often; 0 watches
	// every referenced object while it is referenced
	// (--settled-object-resync).
	SettledObjectResync metav1.Duration `json:"settledObjectResync"`
	// resyncPeriod is how often every volume is reconciled again, besides
	// events (--resync-period).
	ResyncPeriod metav1.Duration `json:"resyncPeriod"`
	// csiTimeout is the timeout of one CSI call (--csi-timeout).
	CSITimeout metav1.Duration `json:"csiTimeout"`

	// frontEndpoint is the unix socket of csi-volmgr's own CSI endpoint in
	// front of frontDriver; empty disables it (--front-endpoint).
	FrontEndpoint string `json:"frontEndpoint"`
	// frontDriver is the registered CSI driver that frontEndpoint fronts
	// (--front-driver).
	FrontDriver string `json:"frontDriver"`

	// mountCheckPeriod is how often the mounts of mountCheckDrivers are
	// verified and broken ones set up again; 0 verifies them only when
	// their driver registers again (--mount-check-period).
	MountCheckPeriod metav1.Duration `json:"mountCheckPeriod"`
	// mountCheckDrivers are the drivers whose mounts mountCheckPeriod
	// verifies; empty means all (--mount-check-drivers).
	MountCheckDrivers []string `json:"mountCheckDrivers"`
	// statsPeriod is how often the usage and health of every published
	// volume are collected; negative disables it (--stats-period).
	StatsPeriod metav1.Duration `json:"statsPeriod"`
	// statsConcurrency is how many volume stats calls may be in flight at
	// once (--stats-concurrency).
	StatsConcurrency int `json:"statsConcurrency"`
	// republishPeriod is how often the volumes of drivers with
	// requiresRepublish are published again (--republish-period).
	RepublishPeriod metav1.Duration `json:"republishPeriod"`

	// logging is component-base's logging configuration, as in the
	// kubelet's KubeletConfiguration (--logging-format, -v, --vmodule,
	// --log-flush-frequency and the --log-*-split-stream and
	// --log-*-info-buffer-size options).
	Logging logsapi.LoggingConfiguration `json:"logging"`
}
