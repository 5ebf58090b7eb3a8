package app

import (
	"errors"
	"fmt"

	"github.com/spf13/pflag"
	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/csi-volmgr/csi-volmgr/cmd/csi-volmgr/app/config"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
	"github.com/csi-volmgr/csi-volmgr/volumemanager/nodeidentity"
)

// RunOptions are the flags of `csi-volmgr run`: --config, and the settings
// every other flag sets, which a configuration file holds too.
type RunOptions struct {
	// ConfigFile is --config: a CSIVolmgrConfiguration file read before
	// the flags, which override it.
	ConfigFile string
	*config.CSIVolmgrConfiguration
}

// NewRunOptions returns the defaults.
func NewRunOptions() *RunOptions {
	return &RunOptions{CSIVolmgrConfiguration: config.Defaults()}
}

// AddFlags registers the options on fs.
func (o *RunOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.ConfigFile, "config", o.ConfigFile, "A "+config.Kind+" file (apiVersion "+config.APIVersion+", YAML or JSON; csi-volmgr config print-defaults writes one) holding the settings of these flags; a flag given on the command line overrides its field.")
	o.addSettingFlags(fs)
}

// addSettingFlags registers the flags of the configuration's fields.
func (o *RunOptions) addSettingFlags(fs *pflag.FlagSet) {
	c := o.CSIVolmgrConfiguration
	fs.StringVar(&c.Kubeconfig, "kubeconfig", c.Kubeconfig, "Path to a kubeconfig; empty means the in-cluster configuration.")
	fs.BoolVar(&c.NodeIdentity, "node-identity", c.NodeIdentity, "Act on the API server as the Node: user system:node:<--node-name> in group system:nodes, with a client certificate asked for (CSR, signer "+nodeidentity.SignerName+") with the credentials of --kubeconfig or the in-cluster ServiceAccount, which then need only the ClusterRole system:node-bootstrapper; kept in --cert-dir and renewed before it expires. The API server's Node authorizer and NodeRestriction admission then hold the agent to what a kubelet of its Node may read and write.")
	fs.StringVar(&c.CertDir, "cert-dir", c.CertDir, "Directory of the Node's client certificate and key (--node-identity) and of the self-signed serving certificate of --http-endpoint (without --tls-cert-file); empty means <root-dir>/pki.")
	fs.StringVar(&c.NodeName, "node-name", c.NodeName, "Name of the node whose pods this agent serves; empty means the host name. With an API server the agent acts only while that Node carries the label csi-volmgr.io/volume-manager=csi-volmgr (--register-node sets it; a runtime beside the agent sets it on its Node); on any other Node, a kubelet's, it mounts and writes nothing and /readyz fails.")
	fs.StringVar(&c.RootDir, "root-dir", c.RootDir, "Root directory of the agent's state (kubelet layout below it).")
	fs.StringVar(&c.RegistrationDir, "registration-dir", c.RegistrationDir, "Directory of plugin-registration sockets; empty means <root-dir>/plugins_registry.")
	fs.StringVar(&c.HTTPEndpoint, "http-endpoint", c.HTTPEndpoint, "TCP address of /healthz, /livez and /readyz (open to anyone), /metrics (open on a loopback address; elsewhere only to callers authorized for get on nodes/metrics of --node-name, as the kubelet's) and the API under /api/ and /debug/pprof/, served only to callers authenticated by a client certificate of --client-ca-file or a bearer token for --api-audiences (TokenReview) and authorized by the API server (SubjectAccessReview of get, create or update on nodes/csi-volmgr of --node-name; none with --manifests). Served with TLS (--tls-cert-file, or a self-signed certificate), plain HTTP only on a loopback address with --http-endpoint-plaintext; empty disables it. The whole API is always served without credentials on the root-only socket <root-dir>/"+volumemanager.SocketName+".")
	fs.IntVar(&c.HTTPMaxConnections, "http-max-connections", c.HTTPMaxConnections, "Most open connections of --http-endpoint, at most a quarter of them from one address (an IPv6 address by its /64); a connection past either bound is closed as soon as it is accepted. The endpoint's other bounds are fixed: 10s to send the headers (64 KiB at most), 1m to send a request, 2m to answer it (a ?wait= long poll: its own timeout plus 30s), 90s idle between requests, a body of 64 KiB (a running-pods report: 4 MiB), and per address 20 failed authentications, then one a second (429 without a TokenReview past it).")
	fs.BoolVar(&c.Profiling, "profiling", c.Profiling, "Serve Go's profiles (pprof) under /debug/pprof/ on the API socket, and on --http-endpoint to authorized callers.")
	fs.DurationVar(&c.ResyncPeriod.Duration, "resync-period", c.ResyncPeriod.Duration, "How often every volume is reconciled again, besides events.")
	fs.DurationVar(&c.CSITimeout.Duration, "csi-timeout", c.CSITimeout.Duration, "Timeout of one CSI call.")
	fs.BoolVar(&c.RemoveTerminatingPods, "remove-terminating-pods", c.RemoveTerminatingPods, "Tear down the volumes of pods marked for deletion (for nodes without a kubelet).")
	fs.BoolVar(&c.WaitForContainersStopped, "wait-for-containers-stopped", c.WaitForContainersStopped, "A runtime beside the agent runs the pods' containers: tear a pod's volumes down once the runtime said its containers stopped (POST /api/v1/pods/NAMESPACE/NAME/containers-stopped?uid=UID, or a PUT /api/v1/running-pods report without the pod, with the mark of POST /api/v1/running-pods/begin taken before the runtime listed its pods; on the API socket) or the pod is terminal, never only because it is marked for deletion or gone from the API server (force delete, pod GC; after a restart, pods found on disk). A runtime that never reports keeps such volumes mounted: status shows them AwaitingRuntime, csi_volmgr_pods_awaiting_runtime counts them.")
	fs.BoolVar(&c.ClusterWideInformers, "cluster-wide-informers", c.ClusterWideInformers, "Cache every PVC, PV and VolumeAttachment of the cluster instead of watching the referenced ones by name (small clusters only).")
	fs.DurationVar(&c.SettledObjectResync.Duration, "settled-object-resync", c.SettledObjectResync.Duration, "When positive, a referenced PVC, PV or VolumeAttachment that settled (bound, attached) is no longer watched but read again about this often (±50 %; a claim at most every 1m ±25 %, so that an expansion is seen within 75s): no standing watch per volume on the API server, other changes seen up to 1.5 times this late. With --node-identity it must be positive. 0 watches every referenced object while it is referenced (a change is seen at once, at the price of two watches per volume).")
	fs.Float32Var(&c.KubeAPIQPS, "kube-api-qps", c.KubeAPIQPS, "Queries per second of the agent's API requests, all its clients together (volume reads and watches, pod condition writes, Events, Node status): one token bucket, as the kubelet's --kube-api-qps, where the pod condition writes and Events yield to the requests the volumes wait for (at most 5s). The TokenReviews and SubjectAccessReviews of --http-endpoint's callers have a token bucket of their own, of the same QPS and burst, so that callers never spend what the volumes wait for. 0 or less means no client-side limit.")
	fs.IntVar(&c.KubeAPIBurst, "kube-api-burst", c.KubeAPIBurst, "Burst of the agent's API requests, all clients together (the token bucket of --kube-api-qps).")
	fs.StringVar(&c.KubeAPIContentType, "kube-api-content-type", c.KubeAPIContentType, "Content type of the API client's requests and preferred answers (as the kubelet's flag); JSON is always accepted too.")
	o.addHTTPFlags(fs)
	o.addModeFlags(fs)
	o.addNodeFlags(fs)
	o.addFrontFlags(fs)
	o.addChangeFlags(fs)
	logsapi.AddFlags(&c.Logging, fs)
}

// Validate checks the flag combinations that only the command has; the
// volume manager checks the rest of its Config, and run names the flag of
// each field it rejects.
func (o *RunOptions) Validate() error {
	return o.validateMode()
}

// overrideWithFlags loads --config and sets on it the flags of fs given on
// the command line (pflag's Changed), so that they win over the file.
func (o *RunOptions) overrideWithFlags(fs *pflag.FlagSet) error {
	loaded, err := config.Load(o.ConfigFile)
	if err != nil {
		return err
	}
	onFile := pflag.NewFlagSet("config", pflag.ContinueOnError)
	(&RunOptions{CSIVolmgrConfiguration: loaded}).addSettingFlags(onFile)
	var errs []error
	fs.Visit(func(f *pflag.Flag) {
		dst := onFile.Lookup(f.Name)
		if dst == nil {
			return // --config itself
		}
		if src, ok := f.Value.(pflag.SliceValue); ok {
			errs = append(errs, dst.Value.(pflag.SliceValue).Replace(src.GetSlice()))
			return
		}
		if err := dst.Value.Set(f.Value.String()); err != nil {
			errs = append(errs, fmt.Errorf("--%s: %w", f.Name, err))
		}
	})
	if err := errors.Join(errs...); err != nil {
		return err
	}
	o.CSIVolmgrConfiguration = loaded
	return nil
}
