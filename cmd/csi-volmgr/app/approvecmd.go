package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/volumemanager/buildinfo"
	"github.com/csi-volmgr/csi-volmgr/volumemanager/csrapprover"
)

// approveOptions are the flags of `csi-volmgr approve-node-csrs`.
type approveOptions struct {
	kubeconfig     string
	rules          csrapprover.Rules
	workers        int
	healthEndpoint string
	logging        *logsapi.LoggingConfiguration
}

func newApproveOptions() *approveOptions {
	return &approveOptions{rules: csrapprover.DefaultRules(), workers: 2, logging: logsapi.NewLoggingConfiguration()}
}

func (o *approveOptions) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.kubeconfig, "kubeconfig", o.kubeconfig, "Path to a kubeconfig; empty means the in-cluster configuration.")
	fs.StringVar(&o.rules.NodeNamePrefix, "node-name-prefix", o.rules.NodeNamePrefix, "The approver serves the Nodes whose names start with this, and only them: it approves a client certificate request for system:node:<name> only when <name> starts with it.")
	fs.StringArrayVar(&o.rules.AgentServiceAccounts, "agent-service-account", o.rules.AgentServiceAccounts, "namespace/name of an agent ServiceAccount (repeatable): a token of it bound to a pod on the Node H may get system:node:<--node-name-prefix>H approved; its other requests are denied. Given once or more, the flags replace the default.")
	fs.StringVar(&o.rules.BootstrapGroupPrefix, "bootstrap-group-prefix", o.rules.BootstrapGroupPrefix, "A bootstrap token (user system:bootstrap:<token id>) of the group <this><name> (the token Secret's auth-extra-groups) may get system:node:<name> approved, <name> starting with --node-name-prefix and without dots (group names allow [a-z0-9:-]); other requests of such tokens are denied. Empty turns this path off.")
	fs.IntVar(&o.workers, "workers", o.workers, "How many requests are decided at once.")
	fs.StringVar(&o.healthEndpoint, "health-endpoint", o.healthEndpoint, "TCP address of /healthz (200 once the requests are watched and decided, 503 before), e.g. :9810 for a liveness probe; empty serves nothing.")
	logsapi.AddFlags(o.logging, fs)
}

func (o *approveOptions) validate() error {
	if o.workers < 1 {
		return fmt.Errorf("--workers %d: want at least 1", o.workers)
	}
	return o.rules.Validate()
}

func newApproveCommand() *cobra.Command {
	o := newApproveOptions()
	cmd := &cobra.Command{
		Use:   "approve-node-csrs",
		Short: "Approve the csi-volmgr agents' node client certificate requests (signer " + csrapprover.SignerName + ") when the requester is proven to be that node, deny the agents' other requests, leave the rest alone",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			fg := featuregate.NewFeatureGate()
			if err := logsapi.AddFeatureGates(fg); err != nil {
				return err
			}
			if err := logsapi.ValidateAndApply(o.logging, fg); err != nil {
				return fmt.Errorf("logging configuration: %w", err)
			}
			defer klog.Flush()
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			ctx = klog.NewContext(ctx, klog.Background().WithName("csi-volmgr-approver"))
			return runApprover(ctx, o)
		},
	}
	o.addFlags(cmd.Flags())
	return cmd
}

// runApprover runs the approver until ctx ends.
func runApprover(ctx context.Context, o *approveOptions) error {
	cfg, err := approverKubeConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating the API client: %w", err)
	}
	c, err := csrapprover.New(csrapprover.Config{Client: client, Rules: o.rules, Workers: o.workers})
	if err != nil {
		return err
	}
	if o.healthEndpoint != "" {
		stopHealth, err := serveHealth(ctx, o.healthEndpoint, c.Running)
		if err != nil {
			return err
		}
		defer stopHealth()
	}
	return c.Run(ctx)
}

func approverKubeConfig(kubeconfig string) (*rest.Config, error) {
	var (
		cfg *rest.Config
		err error
	)
	if kubeconfig != "" {
		if cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig); err != nil {
			return nil, fmt.Errorf("--kubeconfig %s: %w", kubeconfig, err)
		}
	} else if cfg, err = rest.InClusterConfig(); err != nil {
		return nil, fmt.Errorf("no --kubeconfig and no in-cluster configuration: %w", err)
	}
	cfg.UserAgent = "csi-volmgr-approver/" + buildinfo.Get().GitVersion
	return cfg, nil
}

// serveHealth serves /healthz on addr, 200 while running says so; stop
// closes the server.
func serveHealth(ctx context.Context, addr string, running func() bool) (stop func(), err error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--health-endpoint %s: %w", addr, err)
	}
	srv := &http.Server{Handler: healthHandler(running), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, "Serving /healthz stopped", "address", addr)
		}
	}()
	return func() { _ = srv.Close() }, nil
}

// healthHandler serves /healthz: 200 while running says so, 503 before.
func healthHandler(running func() bool) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !running() {
			http.Error(w, "not watching the requests yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	return mux
}
