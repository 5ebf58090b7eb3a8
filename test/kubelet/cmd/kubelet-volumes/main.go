// Command kubelet-volumes runs the real kubelet's volume manager (package
// kubeletvm) as a process of its own, the way the benchmarks of issue 17
// run it beside csi-volmgr:
//
//	kubelet-volumes --kubeconfig=<file> --node-name=<node> --root-dir=<dir> \
//	    [--registration-dir=<dir>] --http-endpoint=127.0.0.1:<port> [--v=N] \
//	    [--kube-api-qps=50] [--kube-api-burst=100]
//
// Its API client has the kubelet's defaults (50 QPS, burst 100, protobuf);
// --kube-api-qps and --kube-api-burst set them as the kubelet's flags of
// the same names do (the kubelet's heartbeat client stays unlimited and its
// event client keeps EventRecordQPS and EventBurst, as in the kubelet).
// SIGTERM or SIGINT stop it; like the kubelet, it leaves every volume
// mounted, and a restart on the same root directory reconstructs them.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/test/kubelet/kubeletvm"
)

// userAgent names the harness in the API server's logs and audit.
const userAgent = "kubelet-volumes"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kubelet-volumes:", err)
		os.Exit(1)
	}
}

func run() error {
	var kubeconfig, nodeName, rootDir, regDir, httpEndpoint string
	fs := flag.NewFlagSet("kubelet-volumes", flag.ExitOnError)
	fs.StringVar(&kubeconfig, "kubeconfig", "", "Path to the kubeconfig of the API server.")
	fs.StringVar(&nodeName, "node-name", "", "Name of the (existing) Node whose pods to serve.")
	fs.StringVar(&rootDir, "root-dir", "", "The kubelet's --root-dir (absolute).")
	fs.StringVar(&regDir, "registration-dir", "", "Plugin registration directory; empty means <root-dir>/plugins_registry.")
	fs.StringVar(&httpEndpoint, "http-endpoint", "", "Address of /healthz, /readyz, /metrics and the JSON API.")
	kc := kubeletvm.Defaults()
	qps := fs.Int("kube-api-qps", int(*kc.KubeAPIQPS), "QPS of the kubelet's main API client (the kubelet's --kube-api-qps).")
	burst := fs.Int("kube-api-burst", int(kc.KubeAPIBurst), "Burst of the kubelet's main API client (the kubelet's --kube-api-burst).")
	klog.InitFlags(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	if kubeconfig == "" || nodeName == "" || rootDir == "" || httpEndpoint == "" {
		return errors.New("--kubeconfig, --node-name, --root-dir and --http-endpoint are required")
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background())

	base, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("reading %s: %w", kubeconfig, err)
	}
	base.UserAgent = userAgent
	q := int32(*qps)                                   //nolint:gosec // a flag's small number
	kc.KubeAPIQPS, kc.KubeAPIBurst = &q, int32(*burst) //nolint:gosec // a flag's small number
	clientCfg, heartbeatCfg, eventCfg := kubeletvm.ClientConfigs(base, &kc)
	var clients [3]kubernetes.Interface
	for i, c := range []*rest.Config{clientCfg, heartbeatCfg, eventCfg} {
		if clients[i], err = kubernetes.NewForConfig(c); err != nil {
			return err
		}
	}
	k, err := kubeletvm.New(ctx, kubeletvm.Config{
		Client: clients[0], HeartbeatClient: clients[1], EventClient: clients[2],
		NodeName: nodeName, RootDir: rootDir, RegistrationDir: regDir, Kubelet: kc,
	})
	if err != nil {
		return err
	}

	l, err := net.Listen("tcp", httpEndpoint)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: k.Handler(), ReadHeaderTimeout: 10 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(l) }()

	runErr := k.Run(ctx)
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err = errors.Join(runErr, srv.Shutdown(shutdownCtx))
	if serr := <-serveErr; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	klog.Flush()
	return err
}
