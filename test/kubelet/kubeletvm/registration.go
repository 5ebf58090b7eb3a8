package kubeletvm

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/kubernetes/pkg/kubelet/pluginmanager/cache"
)

// DriverRecord is one CSI driver registered through the plugin manager.
type DriverRecord struct {
	Name         string    `json:"name"`
	Endpoint     string    `json:"endpoint"`
	RegisteredAt time.Time `json:"registeredAt"`
}

// driverObserver is the kubelet's CSI registration handler (csi.PluginHandler,
// which the plugin manager calls exactly as in the kubelet) with a record
// of the drivers it registered, so that a benchmark can tell when the
// driver is usable. It changes nothing of what the handler does.
type driverObserver struct {
	cache.PluginHandler

	// mu guards drivers.
	mu      sync.Mutex
	drivers map[string]DriverRecord
}

func (o *driverObserver) RegisterPlugin(ctx context.Context, name, endpoint string, versions []string, timeout *time.Duration) error {
	if err := o.PluginHandler.RegisterPlugin(ctx, name, endpoint, versions, timeout); err != nil {
		return err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.drivers[name] = DriverRecord{Name: name, Endpoint: endpoint, RegisteredAt: time.Now()}
	return nil
}

func (o *driverObserver) DeRegisterPlugin(ctx context.Context, name, endpoint string) {
	o.PluginHandler.DeRegisterPlugin(ctx, name, endpoint)
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.drivers, name)
}

func (o *driverObserver) list() []DriverRecord {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]DriverRecord, 0, len(o.drivers))
	for _, d := range o.drivers {
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b DriverRecord) int { return strings.Compare(a.Name, b.Name) })
	return out
}
