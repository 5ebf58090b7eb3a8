package registry_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/csi-volmgr/csi-volmgr/driver/nodeinfo"
	"github.com/csi-volmgr/csi-volmgr/driver/registry"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

func TestMain(m *testing.M) { k8stest.Main(m, k8stest.Options{}) }

const zoneKey = "topology.testplugin.csi-volmgr.io/zone"

// csiNodeDriver returns the named driver's entry in the node's CSINode.
func csiNodeDriver(ctx context.Context, c kubernetes.Interface, node, driver string) (*storagev1.CSINodeDriver, error) {
	csiNode, err := c.StorageV1().CSINodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	for i := range csiNode.Spec.Drivers {
		if csiNode.Spec.Drivers[i].Name == driver {
			return &csiNode.Spec.Drivers[i], nil
		}
	}
	return nil, nil
}

func nodeIDAnnotation(t *testing.T, c kubernetes.Interface, node string) map[string]string {
	t.Helper()
	n, err := c.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get node: %v", err)
	}
	ids := map[string]string{}
	if raw, ok := n.Annotations["csi.volume.kubernetes.io/nodeid"]; ok {
		if err := json.Unmarshal([]byte(raw), &ids); err != nil {
			t.Fatalf("node ID annotation %q: %v", raw, err)
		}
	}
	return ids
}

// TestRealPluginRegistrationLifecycle drives the whole discovery path with
// the real test plugin registering through its -reg.sock and the real API
// server: registration publishes CSINode, annotation and labels; the socket
// going away removes them; a new process of the same driver at a new
// endpoint replaces the connection.
func TestRealPluginRegistrationLifecycle(t *testing.T) {
	f := k8stest.New(t)
	f.CreateNode(t)
	regDir := shortDir(t)
	nim, err := nodeinfo.New(nodeinfo.Config{Client: f.Client, NodeName: f.NodeName})
	if err != nil {
		t.Fatal(err)
	}
	r, evs := startRegistry(t, registry.Config{Dir: regDir, NodeInfo: nim})

	first := plugintest.Start(t, plugintest.Options{
		NodeID: "node-a", RegistrationDir: regDir, MaxVolumesPerNode: 7,
		Topology: map[string]string{zoneKey: "zone-1"},
	})
	ctx := t.Context()
	eventually(t, "CSINode entry", func() bool {
		d, err := csiNodeDriver(ctx, f.Client, f.NodeName, first.Name)
		return err == nil && d != nil
	})
	entry, _ := csiNodeDriver(ctx, f.Client, f.NodeName, first.Name)
	if entry.NodeID != "node-a" || !slices.Equal(entry.TopologyKeys, []string{zoneKey}) ||
		entry.Allocatable == nil || entry.Allocatable.Count == nil || *entry.Allocatable.Count != 7 {
		t.Errorf("CSINode entry = %+v, want node-a, [%s], allocatable 7", entry, zoneKey)
	}
	if ids := nodeIDAnnotation(t, f.Client, f.NodeName); ids[first.Name] != "node-a" {
		t.Errorf("node ID annotation = %v", ids)
	}
	node, _ := f.Client.CoreV1().Nodes().Get(ctx, f.NodeName, metav1.GetOptions{})
	if node.Labels[zoneKey] != "zone-1" {
		t.Errorf("topology label %s = %q, want zone-1", zoneKey, node.Labels[zoneKey])
	}
	if _, err := first.WaitForJournal(ctx, func(es []plugin.Entry) bool {
		return slices.ContainsFunc(es, func(e plugin.Entry) bool {
			return e.Method == "NotifyRegistrationStatus" && e.Registered != nil && *e.Registered
		})
	}); err != nil {
		t.Fatalf("plugin never told it was registered: %v", err)
	}
	client, ok := r.Client(first.Name)
	if !ok {
		t.Fatal("no client for the registered driver")
	}
	if info, err := client.NodeGetInfo(ctx); err != nil || info.GetNodeId() != "node-a" {
		t.Fatalf("NodeGetInfo through the registry = %v, %v", info, err)
	}

	// The registration socket goes away (the registrar stops): everything
	// published for the driver is removed.
	if err := first.Stop(); err != nil {
		t.Fatalf("stop plugin: %v", err)
	}
	eventually(t, "CSINode entry removed", func() bool {
		d, err := csiNodeDriver(ctx, f.Client, f.NodeName, first.Name)
		return err == nil && d == nil
	})
	if ids := nodeIDAnnotation(t, f.Client, f.NodeName); len(ids) != 0 {
		t.Errorf("node ID annotation after deregistration = %v, want none", ids)
	}
	node, _ = f.Client.CoreV1().Nodes().Get(ctx, f.NodeName, metav1.GetOptions{})
	if _, ok := node.Labels[zoneKey]; ok {
		t.Errorf("topology label %s still set after deregistration", zoneKey)
	}
	if _, ok := r.Client(first.Name); ok {
		t.Error("client still handed out after deregistration")
	}

	// A new process of the same driver at a new endpoint.
	second := plugintest.Start(t, plugintest.Options{
		NodeID: "node-b", RegistrationDir: regDir,
		Topology: map[string]string{zoneKey: "zone-1"},
	})
	if second.Endpoint == first.Endpoint {
		t.Fatalf("second plugin reuses endpoint %s", first.Endpoint)
	}
	eventually(t, "re-registration at the new endpoint", func() bool {
		d, ok := r.Driver(second.Name)
		return ok && d.Endpoint == second.Endpoint
	})
	client, _ = r.Client(second.Name)
	if info, err := client.NodeGetInfo(ctx); err != nil || info.GetNodeId() != "node-b" {
		t.Fatalf("client talks to %v, %v; want the new process (node-b)", info, err)
	}
	eventually(t, "CSINode entry of the new process", func() bool {
		d, err := csiNodeDriver(ctx, f.Client, f.NodeName, second.Name)
		return err == nil && d != nil && d.NodeID == "node-b"
	})
	want := []registry.EventType{registry.Registered, registry.Deregistered, registry.Registered}
	driverEvents := func() []registry.EventType {
		var types []registry.EventType
		for _, ev := range evs.snapshot() {
			if ev.Driver == first.Name {
				types = append(types, ev.Type)
			}
		}
		return types
	}
	eventually(t, "three driver events", func() bool { return len(driverEvents()) >= len(want) })
	if got := driverEvents(); !slices.Equal(got, want) {
		t.Errorf("events = %v, want %v", got, want)
	}
}

// TestRegistrationWaitsForNode: a driver that registers before its Node
// exists is retried with backoff and registers once the Node appears.
func TestRegistrationWaitsForNode(t *testing.T) {
	f := k8stest.New(t)
	regDir := shortDir(t)
	nim, err := nodeinfo.New(nodeinfo.Config{Client: f.Client, NodeName: f.NodeName})
	if err != nil {
		t.Fatal(err)
	}
	r, evs := startRegistry(t, registry.Config{Dir: regDir, NodeInfo: nim, RetryBaseDelay: 20 * time.Millisecond, RetryMaxDelay: 200 * time.Millisecond})
	p := plugintest.Start(t, plugintest.Options{RegistrationDir: regDir})
	eventually(t, "a rejection because the Node is missing", func() bool {
		return slices.ContainsFunc(evs.snapshot(), func(e registry.Event) bool { return e.Type == registry.Rejected && e.Driver == p.Name })
	})
	if _, ok := r.Driver(p.Name); ok {
		t.Fatal("registered without a Node")
	}
	f.CreateNode(t)
	eventually(t, "registration once the Node exists", func() bool { _, ok := r.Driver(p.Name); return ok })
	if d, err := csiNodeDriver(t.Context(), f.Client, f.NodeName, p.Name); err != nil || d == nil {
		t.Fatalf("CSINode entry after late Node = %v, %v", d, err)
	}
}

// BenchmarkRegistrationLatency measures the time from a registration socket
// appearing to the driver's entry in CSINode, against the real API server
// and the real test plugin, and reports the median and the worst of the
// runs. Each run removes the socket and waits for the entry to go first.
func BenchmarkRegistrationLatency(b *testing.B) {
	const runs = 25
	f := k8stest.New(b)
	f.CreateNode(b)
	regDir := shortDir(b)
	nim, err := nodeinfo.New(nodeinfo.Config{Client: f.Client, NodeName: f.NodeName})
	if err != nil {
		b.Fatal(err)
	}
	p := plugintest.Start(b, plugintest.Options{Verbosity: 1})
	r, err := registry.New(registry.Config{Dir: regDir, NodeInfo: nim})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	b.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("registry.Run: %v", err)
		}
	})

	csiNodes := f.Client.StorageV1().CSINodes()
	hasEntry := func(want bool) error {
		w, err := csiNodes.Watch(b.Context(), metav1.ListOptions{FieldSelector: "metadata.name=" + f.NodeName})
		if err != nil {
			return err
		}
		defer w.Stop()
		if d, err := csiNodeDriver(b.Context(), f.Client, f.NodeName, p.Name); (err == nil || apierrors.IsNotFound(err)) && (d != nil) == want {
			return nil
		}
		timeout := time.After(waitTimeout)
		for {
			select {
			case ev, ok := <-w.ResultChan():
				if !ok {
					return fmt.Errorf("watch closed")
				}
				cn, ok := ev.Object.(*storagev1.CSINode)
				if !ok {
					continue
				}
				found := slices.ContainsFunc(cn.Spec.Drivers, func(d storagev1.CSINodeDriver) bool { return d.Name == p.Name })
				if found == want {
					return nil
				}
			case <-timeout:
				return fmt.Errorf("CSINode entry present=%v not reached", want)
			}
		}
	}

	var samples []time.Duration
	b.ResetTimer()
	for range b.N {
		samples = samples[:0]
		for range runs {
			sock := regDir + "/bench-reg.sock"
			reg := &fakeRegistrar{info: registerInfo(p)}
			start := time.Now()
			stop := serveRegistrarManual(b, sock, reg)
			if err := hasEntry(true); err != nil {
				b.Fatal(err)
			}
			samples = append(samples, time.Since(start))
			stop()
			if err := os.Remove(sock); err != nil {
				b.Fatal(err)
			}
			if err := hasEntry(false); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	slices.Sort(samples)
	b.ReportMetric(float64(samples[len(samples)/2].Microseconds())/1000, "ms-p50")
	b.ReportMetric(float64(samples[len(samples)-1].Microseconds())/1000, "ms-max")
	b.ReportMetric(float64(len(samples)), "runs")
}
