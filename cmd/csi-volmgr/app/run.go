package app

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/csiclient/redact"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
	"github.com/csi-volmgr/csi-volmgr/volumemanager/apibudget"
	"github.com/csi-volmgr/csi-volmgr/volumemanager/buildinfo"
	"github.com/csi-volmgr/csi-volmgr/volumemanager/nodeidentity"
)

func newRunCommand() *cobra.Command {
	o := NewRunOptions()
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the agent: discover CSI drivers and run the volume lifecycle of the node's pods",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.ConfigFile != "" {
				if err := o.overrideWithFlags(cmd.Flags()); err != nil {
					return err
				}
			}
			if err := o.Validate(); err != nil {
				return err
			}
			fg := featuregate.NewFeatureGate()
			if err := logsapi.AddFeatureGates(fg); err != nil {
				return err
			}
			if err := logsapi.ValidateAndApply(&o.Logging, fg); err != nil {
				return fmt.Errorf("logging configuration: %w", err)
			}
			defer klog.Flush()
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			ctx = klog.NewContext(ctx, klog.Background().WithName("csi-volmgr"))
			return run(ctx, o)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

// flagOf names the flag of each volumemanager.Config field.
var flagOf = map[string]string{
	"NodeName":                          "--node-name",
	"RootDir":                           "--root-dir",
	"RegistrationDir":                   "--registration-dir",
	"Manifests":                         "--manifests",
	"ResyncPeriod":                      "--resync-period",
	"CSITimeout":                        "--csi-timeout",
	"FrontEndpoint":                     "--front-endpoint",
	"FrontDriver":                       "--front-driver",
	"HTTPEndpoint":                      "--http-endpoint",
	"HTTPMaxConnections":                "--http-max-connections",
	"HTTPAccess.Plaintext":              "--http-endpoint-plaintext",
	"HTTPAccess.CertFile":               "--tls-cert-file",
	"HTTPAccess.KeyFile":                "--tls-private-key-file",
	"HTTPAccess.CertDir":                "--cert-dir",
	"HTTPAccess.MinVersion":             "--tls-min-version",
	"HTTPAccess.ClientCAFile":           "--client-ca-file",
	"HTTPAccess.AuthenticationCacheTTL": "--authentication-token-webhook-cache-ttl",
	"HTTPAccess.AllowCacheTTL":          "--authorization-webhook-cache-authorized-ttl",
	"HTTPAccess.DenyCacheTTL":           "--authorization-webhook-cache-unauthorized-ttl",
	"ExpectedDrivers":                   "--expected-drivers",
	"NodeLabels":                        "--node-labels",
	"NodeIdentity":                      "--node-identity",
	"ClusterWideInformers":              "--cluster-wide-informers",
	"NodeTaints":                        "--node-taints",
}

// flagErrors names the flag of every volumemanager.ConfigError in err,
// which may be a joined error; with a configuration file, the file's
// field first (nodeTaints (--node-taints)).
func (o *RunOptions) flagErrors(err error) error {
	errs := []error{err}
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		errs = joined.Unwrap()
	}
	out := make([]error, 0, len(errs))
	for _, e := range errs {
		if ce, ok := errors.AsType[*volumemanager.ConfigError](e); ok && flagOf[ce.Field] != "" {
			name := flagOf[ce.Field]
			if o.ConfigFile != "" {
				name = configField[strings.TrimPrefix(name, "--")] + " (" + name + ")"
			}
			e = fmt.Errorf("%s %w", name, ce.Err)
		}
		out = append(out, e)
	}
	return errors.Join(out...)
}

// run builds the volume manager from the flags and runs it until ctx ends
// (SIGTERM or SIGINT), after the steps in flight finished; it never
// unmounts on the way out.
func run(ctx context.Context, o *RunOptions) error {
	nodeName := o.NodeName
	if nodeName == "" {
		host, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("no --node-name, and the host name: %w", err)
		}
		nodeName = host
	}
	capacity, err := o.nodeCapacity()
	if err != nil {
		return err
	}
	access, err := o.httpAccess()
	if err != nil {
		return err
	}
	cfg := volumemanager.Config{
		NodeName:                 nodeName,
		RootDir:                  o.RootDir,
		RegistrationDir:          o.RegistrationDir,
		Manifests:                o.Manifests,
		RegisterNode:             o.RegisterNode,
		RemoveTerminatingPods:    o.RemoveTerminatingPods,
		WaitForContainersStopped: o.WaitForContainersStopped,
		ClusterWideInformers:     o.ClusterWideInformers,
		NodeIdentity:             o.NodeIdentity,
		SettledObjectResync:      settledObjectResync(o.SettledObjectResync.Duration),
		ResyncPeriod:             o.ResyncPeriod.Duration,
		CSITimeout:               o.CSITimeout.Duration,
		FrontEndpoint:            o.FrontEndpoint,
		FrontDriver:              o.FrontDriver,
		HTTPEndpoint:             o.HTTPEndpoint,
		HTTPAccess:               access,
		HTTPMaxConnections:       o.HTTPMaxConnections,
		Profiling:                o.Profiling,
		Changes:                  o.changes(),
		ExpectedDrivers:          o.ExpectedDrivers,
		NodeCapacity:             capacity,
		NodeLabels:               o.NodeLabels,
		NodeTaints:               o.nodeTaints(),
		Version:                  buildinfo.Get().GitVersion,
	}
	if o.Manifests == "" {
		mainConfig, reportConfig, authConfig, err := clientConfigs(ctx, o, nodeName)
		if err != nil {
			return err
		}
		if cfg.KubeClient, err = newClient(mainConfig); err != nil {
			return fmt.Errorf("creating the API client: %w", err)
		}
		if cfg.ReportClient, err = newClient(reportConfig); err != nil {
			return fmt.Errorf("creating the API client: %w", err)
		}
		if cfg.AuthClient, err = newClient(authConfig); err != nil {
			return fmt.Errorf("creating the API client: %w", err)
		}
	}
	vm, err := volumemanager.New(ctx, cfg)
	if err != nil {
		return o.flagErrors(err)
	}
	if o.Manifests == "" && !o.NodeIdentity {
		klog.FromContext(ctx).Info("Acting on the API server with the credentials given, not as the Node: the agent may do whatever they allow; --node-identity holds it to its own Node's objects as a kubelet is held")
	}
	return vm.Run(ctx)
}

// clientConfigs returns the configurations of the main client, of the
// report client (the pods' conditions, Events) and of the auth client (the
// TokenReviews and SubjectAccessReviews of --http-endpoint's callers).
// --kube-api-qps and --kube-api-burst are the budget of the agent's own
// work, as the kubelet's pod status manager writes through its one
// KubeClient: the main and report clients draw from one token bucket, the
// reads first (volumemanager/apibudget), so that in a burst of pods the
// condition writes do not delay the reads the volumes wait for. The auth
// client has a token bucket of its own of the same QPS and burst: what
// callers of the TCP endpoint send (a flood of made-up tokens, each a
// TokenReview) never takes a token the volumes wait for. QPS ≤ 0 means no
// limit, as in client-go.
//
// With --node-identity the kubeconfig's (or the in-cluster) credentials only
// ask for the Node's client certificate: every client authenticates with
// that certificate, kept current by nodeidentity, and nothing else.
func clientConfigs(ctx context.Context, o *RunOptions, nodeName string) (main, report, auth *rest.Config, err error) {
	main, err = kubeConfig(o)
	if err != nil {
		return nil, nil, nil, err
	}
	if o.NodeIdentity {
		certDir := o.CertDir
		if certDir == "" {
			certDir = filepath.Join(o.RootDir, "pki")
		}
		id, err := nodeidentity.Start(ctx, nodeidentity.Options{NodeName: nodeName, CertDir: certDir, Bootstrap: main})
		if err != nil {
			return nil, nil, nil, fmt.Errorf("--node-identity: %w", err)
		}
		asNode := id.Config()
		asNode.QPS, asNode.Burst, asNode.UserAgent = main.QPS, main.Burst, main.UserAgent
		asNode.ContentType, asNode.AcceptContentTypes = main.ContentType, main.AcceptContentTypes
		main = asNode
	}
	report = rest.CopyConfig(main)
	// No RateLimiter: client-go gives it a token bucket of its own, of
	// QPS and Burst.
	auth = rest.CopyConfig(main)
	if main.QPS > 0 {
		budget := apibudget.New(main.QPS, main.Burst)
		main.RateLimiter, report.RateLimiter = budget.Reads(), budget.Reports()
	}
	return main, report, auth, nil
}

func kubeConfig(o *RunOptions) (*rest.Config, error) {
	var (
		cfg *rest.Config
		err error
	)
	if o.Kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig %s: %w", o.Kubeconfig, err)
		}
	} else if cfg, err = rest.InClusterConfig(); err != nil {
		return nil, fmt.Errorf("no --kubeconfig and no in-cluster configuration: %w", err)
	}
	cfg.QPS, cfg.Burst = o.KubeAPIQPS, o.KubeAPIBurst
	cfg.ContentType = o.KubeAPIContentType
	cfg.AcceptContentTypes = o.KubeAPIContentType
	if o.KubeAPIContentType != runtime.ContentTypeJSON {
		cfg.AcceptContentTypes += "," + runtime.ContentTypeJSON
	}
	cfg.UserAgent = "csi-volmgr/" + buildinfo.Get().GitVersion
	return cfg, nil
}

// newClient returns the API client of restConfig, its requests' logging
// capped by withoutDetailedTiming (outermost, so that client-go's debugging
// round tripper below it sees the capped logger).
func newClient(restConfig *rest.Config) (kubernetes.Interface, error) {
	httpClient, err := rest.HTTPClientFor(restConfig)
	if err != nil {
		return nil, err
	}
	httpClient.Transport = withoutDetailedTiming{httpClient.Transport}
	return kubernetes.NewForConfigAndClient(restConfig, httpClient)
}

// withoutDetailedTiming caps client-go's request logging at V(8): at V(9)
// its debugging round tripper traces every connection with httptrace
// callbacks that write its timing fields from the dialing goroutine without
// a lock (client-go v0.37 transport/round_trippers.go, TLSHandshakeStart),
// a data race the race detector reports when a dial started for one request
// ends up serving another. URLs, headers and bodies are still logged.
type withoutDetailedTiming struct{ rt http.RoundTripper }

func (w withoutDetailedTiming) RoundTrip(req *http.Request) (*http.Response, error) {
	return w.rt.RoundTrip(req.WithContext(redact.Quiet(req.Context(), 8)))
}

// settledObjectResync turns --settled-object-resync (0: watch every
// referenced object) into volumemanager's setting (0: the default,
// negative: watch every referenced object).
func settledObjectResync(flag time.Duration) time.Duration {
	if flag <= 0 {
		return -1
	}
	return flag
}
