// Command csi-volmgr-example-runtime is a virtual-kubelet provider that
// embeds csi-volmgr: it registers a virtual Node with virtual-kubelet's
// node controller, runs each pod's containers as local processes in a
// private mount namespace with the pod's CSI volumes bound at their
// mountPaths, and lets csi-volmgr attach, stage, publish and tear down
// those volumes around them (volumemanager/vkubelet). It is a test runtime
// and a demo of the embedding, not a container runtime: no images, no
// restarts, no isolation but the mount table. It needs root.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path"
	"strings"
	"syscall"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/node"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/volumemanager"
	"github.com/csi-volmgr/csi-volmgr/volumemanager/nodeidentity"
	"github.com/csi-volmgr/csi-volmgr/volumemanager/vkubelet"
)

// DefaultTaint keeps pods off the virtual node unless they tolerate it.
const DefaultTaint = "csi-volmgr.io/example-runtime=true:NoSchedule"

type options struct {
	kubeconfig, nodeName, rootDir, stateDir, httpEndpoint string
	registrationDir, hostRoot, taint, internalIP          string
	kubeletPort                                           int
	pods                                                  int64
	workers                                               int
	volumeStatsPeriod                                     time.Duration
	// nodeCertDir, when set, gives the embedded csi-volmgr the Node's
	// identity (volumemanager/nodeidentity).
	nodeCertDir string
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == sandboxCommand {
		if err := runSandbox(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(127)
		}
		return
	}
	var o options
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the cluster")
	flag.StringVar(&o.nodeName, "node-name", "csi-volmgr-example", "name of the virtual Node")
	flag.StringVar(&o.rootDir, "root-dir", "/var/lib/csi-volmgr", "csi-volmgr's root directory (CSI drivers register in <root>/plugins_registry)")
	flag.StringVar(&o.registrationDir, "registration-dir", "", "directory where CSI drivers register; empty means <root-dir>/plugins_registry")
	flag.StringVar(&o.stateDir, "state-dir", "/run/csi-volmgr-example", "the runtime's directory: container roots and logs")
	flag.StringVar(&o.httpEndpoint, "http-endpoint", "127.0.0.1:9809", "csi-volmgr's TCP endpoint, with TLS (a self-signed certificate in <root-dir>/pki): health checks, metrics (on a loopback address; elsewhere to callers authorized on nodes/metrics), and its API to callers authenticated by a token of audience csi-volmgr and authorized by the API server on nodes/csi-volmgr; the whole API is on <root-dir>/csi-volmgr.sock. Empty disables it")
	flag.StringVar(&o.hostRoot, "host-root", "/", "where the system directories the containers see read-only (usr, etc, bin, lib...) come from")
	flag.StringVar(&o.taint, "taint", DefaultTaint, "the Node's taint, key=value:Effect; empty for none")
	flag.StringVar(&o.internalIP, "internal-ip", "127.0.0.1", "the Node's InternalIP, where the API server reaches --kubelet-port")
	flag.IntVar(&o.kubeletPort, "kubelet-port", 0, "serve the kubelet API's /stats/summary (HTTPS, self-signed) on --internal-ip at this port, the Node's kubelet endpoint; 0 disables it")
	flag.DurationVar(&o.volumeStatsPeriod, "volume-stats-period", 0, "how often the CSI volumes' stats are collected; 0 means csi-volmgr's default (1m)")
	flag.Int64Var(&o.pods, "pods", 110, "pod capacity of the Node")
	flag.IntVar(&o.workers, "workers", 10, "pods the pod controller handles at once")
	flag.StringVar(&o.nodeCertDir, "node-cert-dir", "", "when set, the embedded csi-volmgr acts on the API server as the Node (system:node:<node-name>, held by the Node authorizer and NodeRestriction) with a client certificate kept here, asked for with --kubeconfig's credentials; virtual-kubelet's controllers keep --kubeconfig's identity")
	klog.InitFlags(nil)
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background().WithName("example-runtime"))
	if err := run(ctx, o); err != nil {
		klog.FromContext(ctx).Error(err, "Stopped")
		klog.Flush()
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	logger := klog.FromContext(ctx)
	nodeSpec, err := virtualNode(o)
	if err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return err
	}
	// virtual-kubelet and csi-volmgr each get a client of their own, with
	// the rate limits of a kubelet and of csi-volmgr run (50 QPS, burst 100).
	cfg.QPS, cfg.Burst = 50, 100
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	agentConfig := cfg
	if o.nodeCertDir != "" {
		// csi-volmgr as the Node; virtual-kubelet's pod controller needs
		// cluster-wide informers of ConfigMaps, Secrets and Services,
		// which no Node may list, so it keeps the runtime's own identity.
		id, err := nodeidentity.Start(ctx, nodeidentity.Options{NodeName: o.nodeName, CertDir: o.nodeCertDir, Bootstrap: cfg})
		if err != nil {
			return err
		}
		agentConfig = id.Config()
		agentConfig.QPS, agentConfig.Burst = cfg.QPS, cfg.Burst
	}
	agentClient, err := kubernetes.NewForConfig(agentConfig)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(o.stateDir, 0o750); err != nil {
		return err
	}

	vm, err := volumemanager.New(klog.NewContext(ctx, logger.WithName("csi-volmgr")), volumeManagerConfig(o, agentClient))
	if err != nil {
		return err
	}
	procs, err := newProcessProvider(o)
	if err != nil {
		return err
	}
	pods, err := vkubelet.NewPodHandler(procs, vkubelet.Config{Volumes: vm})
	if err != nil {
		return err
	}

	// virtual-kubelet's node controller owns the Node and its Lease.
	vkubelet.PrepareNode(nodeSpec)
	naive := node.NewNaiveNodeProvider()
	nc, err := node.NewNodeController(vkubelet.NewNodeProvider(naive), nodeSpec, client.CoreV1().Nodes(),
		node.WithNodeEnableLeaseV1(client.CoordinationV1().Leases(corev1.NamespaceNodeLease), 0))
	if err != nil {
		return err
	}

	podInformers := informers.NewSharedInformerFactoryWithOptions(client, time.Minute,
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", o.nodeName).String()
		}))
	others := informers.NewSharedInformerFactory(client, time.Minute)
	podInformer := podInformers.Core().V1().Pods()
	if _, err := podInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if pod, ok := obj.(*corev1.Pod); ok {
				procs.forget(pod.UID)
			}
		},
	}); err != nil {
		return err
	}
	broadcaster := record.NewBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events(corev1.NamespaceAll)})
	defer broadcaster.Shutdown()
	pc, err := node.NewPodController(node.PodControllerConfig{
		PodClient:         client.CoreV1(),
		PodInformer:       podInformer,
		EventRecorder:     broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: path.Join(o.nodeName, "pod-controller")}),
		Provider:          pods,
		ConfigMapInformer: others.Core().V1().ConfigMaps(),
		SecretInformer:    others.Core().V1().Secrets(),
		ServiceInformer:   others.Core().V1().Services(),
	})
	if err != nil {
		return err
	}

	errs := make(chan error, 4)
	go func() { errs <- vm.Run(ctx) }()
	go func() { errs <- nc.Run(ctx) }()
	podInformers.Start(ctx.Done())
	others.Start(ctx.Done())
	go func() { errs <- pc.Run(ctx, o.workers) }()
	// The kubelet's "ask the runtime": a pod force-deleted from the API
	// server keeps its volumes while its processes run.
	go vkubelet.ReportRunningPods(ctx, pods, vm, 0)
	servers := 3
	if o.kubeletPort > 0 {
		// The kubelet API's stats summary, with the CSI volumes' stats.
		servers++
		go func() { errs <- serveKubeletAPI(ctx, o, vkubelet.WithVolumeStats(vm, procs.GetStatsSummary)) }()
	}
	select {
	case <-nc.Ready():
	case err := <-errs:
		return err
	}
	setReady(nodeSpec)
	if err := naive.UpdateStatus(ctx, nodeSpec); err != nil {
		return err
	}
	logger.Info("Virtual node ready", "node", o.nodeName)
	<-ctx.Done()
	// A test runtime: its processes do not outlive it.
	procs.stopEverything(context.WithoutCancel(ctx))
	for range servers {
		if err := <-errs; err != nil && ctx.Err() == nil {
			return err
		}
	}
	return nil
}

// virtualNode is the Node the runtime registers: labelled as a
// virtual-kubelet node, tainted, with a pod capacity, its address and
// kubelet port.
// volumeManagerConfig is the embedded volume manager's Config. It always
// waits for the runtime's word (WaitForContainersStopped; the example has
// no flag to turn it off): a pod's volumes stay mounted until its
// processes stopped (DeletePod, GetPods), never only because the pod was
// marked for deletion or force-deleted while they still run.
func volumeManagerConfig(o options, client kubernetes.Interface) volumemanager.Config {
	return volumemanager.Config{
		NodeName: o.nodeName, RootDir: o.rootDir, RegistrationDir: o.registrationDir, KubeClient: client,
		NodeIdentity: o.nodeCertDir != "",
		HTTPEndpoint: o.httpEndpoint, WaitForContainersStopped: true,
		Changes: volumemanager.ChangesConfig{StatsPeriod: o.volumeStatsPeriod},
	}
}

func virtualNode(o options) (*corev1.Node, error) {
	var taints []corev1.Taint
	if o.taint != "" {
		t, err := parseTaint(o.taint)
		if err != nil {
			return nil, err
		}
		taints = append(taints, t)
	}
	if net.ParseIP(o.internalIP) == nil {
		return nil, fmt.Errorf("--internal-ip=%q is not an IP address", o.internalIP)
	}
	capacity := corev1.ResourceList{
		corev1.ResourcePods:   *resource.NewQuantity(o.pods, resource.DecimalSI),
		corev1.ResourceCPU:    resource.MustParse("16"),
		corev1.ResourceMemory: resource.MustParse("64Gi"),
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: o.nodeName, Labels: map[string]string{
			"type": "virtual-kubelet", "kubernetes.io/role": "agent", corev1.LabelHostname: o.nodeName,
			corev1.LabelOSStable: "linux",
		}},
		Spec: corev1.NodeSpec{Taints: taints},
		Status: corev1.NodeStatus{
			Capacity: capacity, Allocatable: capacity,
			Addresses:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: o.internalIP}},
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(o.kubeletPort)}},
			Conditions:      []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: "Starting"}},
		},
	}, nil
}

// parseTaint parses key[=value]:Effect, as kubectl taint writes it.
func parseTaint(spec string) (corev1.Taint, error) {
	kv, effect, _ := strings.Cut(spec, ":")
	key, value, _ := strings.Cut(kv, "=")
	t := corev1.Taint{Key: key, Value: value, Effect: corev1.TaintEffect(effect)}
	switch {
	case key == "":
		return t, fmt.Errorf("--taint=%q: no key", spec)
	case t.Effect != corev1.TaintEffectNoSchedule && t.Effect != corev1.TaintEffectPreferNoSchedule && t.Effect != corev1.TaintEffectNoExecute:
		return t, fmt.Errorf("--taint=%q: want key[=value]:NoSchedule|PreferNoSchedule|NoExecute", spec)
	}
	return t, nil
}

// setReady marks the Node Ready.
func setReady(n *corev1.Node) {
	now := metav1.Now()
	n.Status.Conditions = []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "ExampleRuntimeReady",
		Message: "csi-volmgr example runtime (local processes) is ready", LastHeartbeatTime: now, LastTransitionTime: now,
	}}
}
