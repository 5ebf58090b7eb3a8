// Command nodecni stands in for kind's kindnetd, which is not published as a
// Go module: kind's node image carries it as docker.io/kindest/kindnetd and
// `kind create cluster` deploys it with /kind/manifests/default-cni.yaml.
// It does the two things a kind cluster needs of kindnetd, and no more:
//
//   - writes /etc/cni/net.d/10-kindnet.conflist for its node, a ptp
//     network with host-local addresses from the node's spec.podCIDR (and
//     masquerading of traffic that leaves the pod network), once the
//     controller manager has assigned the CIDR;
//   - routes every other node's pod CIDR through that node's InternalIP,
//     so that pods on different nodes reach each other.
//
// It finds its node by the HOST_IP that the manifest passes in (kindnetd
// does the same). Network policies and IPv6 are not supported.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

const (
	confDir  = "/etc/cni/net.d"
	confFile = "10-kindnet.conflist"
	// resync re-applies every route now and then, in case something
	// removed one.
	resync = 5 * time.Minute
)

func main() {
	klog.InitFlags(nil)
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	logger := klog.Background().WithName("nodecni")
	if err := run(klog.NewContext(ctx, logger)); err != nil {
		logger.Error(err, "Failed")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
}

func run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	hostIP := net.ParseIP(os.Getenv("HOST_IP"))
	if hostIP == nil {
		return fmt.Errorf("HOST_IP %q is not an IP address", os.Getenv("HOST_IP"))
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	factory := informers.NewSharedInformerFactory(client, resync)
	nodes := factory.Core().V1().Nodes()
	queue := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	defer queue.ShutDown()
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			queue.Add(key)
		}
	}
	if _, err := nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: enqueue,
	}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), nodes.Informer().HasSynced) {
		return ctx.Err()
	}
	logger.Info("Watching nodes", "hostIP", hostIP)
	go func() {
		<-ctx.Done()
		queue.ShutDown()
	}()
	for {
		key, quit := queue.Get()
		if quit {
			return nil
		}
		node, err := nodes.Lister().Get(key)
		switch {
		case err == nil:
			err = syncNode(logger, node, hostIP)
		case apierrors.IsNotFound(err):
			err = nil // its routes go with the next restart; kind never deletes nodes
		}
		if err != nil {
			logger.Error(err, "Syncing node", "node", key)
			queue.AddRateLimited(key)
		} else {
			queue.Forget(key)
		}
		queue.Done(key)
	}
}

// syncNode writes the CNI configuration for the own node and a route for
// any other.
func syncNode(logger klog.Logger, node *corev1.Node, hostIP net.IP) error {
	ip := internalIP(node)
	if ip == nil || node.Spec.PodCIDR == "" {
		return nil // not ready yet; an update follows
	}
	_, cidr, err := net.ParseCIDR(node.Spec.PodCIDR)
	if err != nil {
		return fmt.Errorf("node %s: podCIDR: %w", node.Name, err)
	}
	if cidr.IP.To4() == nil {
		return nil // IPv4 only
	}
	if ip.Equal(hostIP) {
		return writeConf(logger, cidr)
	}
	route := &netlink.Route{Dst: cidr, Gw: ip}
	if err := netlink.RouteReplace(route); err != nil {
		return fmt.Errorf("route %s via %s: %w", cidr, ip, err)
	}
	logger.V(2).Info("Route", "node", node.Name, "podCIDR", cidr, "via", ip)
	return nil
}

func internalIP(node *corev1.Node) net.IP {
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			if ip := net.ParseIP(a.Address); ip != nil && ip.To4() != nil {
				return ip
			}
		}
	}
	return nil
}

// writeConf writes the conflist atomically when it changed.
func writeConf(logger klog.Logger, cidr *net.IPNet) error {
	conf := map[string]any{
		"cniVersion": "0.4.0",
		"name":       "kindnet",
		"plugins": []any{
			map[string]any{
				"type":   "ptp",
				"ipMasq": true,
				"mtu":    1500,
				"ipam": map[string]any{
					"type":    "host-local",
					"dataDir": "/run/cni-ipam-state",
					"routes":  []any{map[string]any{"dst": "0.0.0.0/0"}},
					"ranges":  []any{[]any{map[string]any{"subnet": cidr.String()}}},
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]any{"portMappings": true}},
		},
	}
	data, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(confDir, confFile)
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return nil
	}
	tmp, err := os.CreateTemp(confDir, "."+confFile)
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	logger.Info("Wrote CNI configuration", "path", path, "podCIDR", cidr)
	return nil
}
