package nodeinfo

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// UpdateAllocatable sets the allocatable count of driverName's entry in
// the CSINode from max_volumes_per_node (0: no limit), leaving the rest of
// the entry as it is. A missing CSINode or entry is not written: the
// driver's registration writes the whole entry.
func (m *Manager) UpdateAllocatable(ctx context.Context, driverName string, maxVolumes int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	count := allocatableCount(ctx, maxVolumes)
	return m.updateCSINode(ctx, nil, func(drivers []storagev1.CSINodeDriver) []storagev1.CSINodeDriver {
		for i := range drivers {
			if drivers[i].Name != driverName {
				continue
			}
			if count == nil {
				drivers[i].Allocatable = nil
			} else {
				drivers[i].Allocatable = &storagev1.VolumeNodeResources{Count: count}
			}
		}
		return drivers
	})
}

// InfoClient asks a registered driver for its node info.
type InfoClient interface {
	NodeGetInfo(ctx context.Context) (*csi.NodeGetInfoResponse, error)
}

// AllocatableConfig configures an AllocatableRefresher. Every field is
// required but the backoff.
type AllocatableConfig struct {
	// NodeInfo writes the CSINode.
	NodeInfo interface {
		UpdateAllocatable(ctx context.Context, driverName string, maxVolumes int64) error
	}
	// Client returns a registered driver's connection.
	Client func(driver string) (InfoClient, bool)
	// Period returns a driver's CSIDriver nodeAllocatableUpdatePeriodSeconds;
	// 0 means the driver's count is refreshed only after an attach failed
	// for the limit.
	Period func(driver string) time.Duration
	// Updated, when set, is told of every count written.
	Updated func(driver string, maxVolumes int64)
	// RetryBaseDelay and RetryMaxDelay bound the backoff of a failed
	// refresh; 0 means 500ms and 2m.
	RetryBaseDelay, RetryMaxDelay time.Duration
}

// AllocatableRefresher keeps the allocatable count of registered drivers
// in the CSINode current, as the kubelet's csi_node_updater.go does with
// MutableCSINodeAllocatableCount (KEP-4876): every
// nodeAllocatableUpdatePeriodSeconds of the driver's CSIDriver, and at once
// after an attach failed with ResourceExhausted (Refresh), it asks the
// driver for NodeGetInfo and writes a changed max_volumes_per_node.
type AllocatableRefresher struct {
	cfg   AllocatableConfig
	queue workqueue.TypedRateLimitingInterface[string]

	// mu guards last.
	mu sync.Mutex
	// last is the count last written per driver.
	last map[string]int64
}

// NewAllocatableRefresher returns a refresher; Run starts it.
func NewAllocatableRefresher(cfg AllocatableConfig) (*AllocatableRefresher, error) {
	if cfg.NodeInfo == nil || cfg.Client == nil || cfg.Period == nil {
		return nil, errors.New("nodeinfo: NodeInfo, Client and Period are required")
	}
	if cfg.RetryBaseDelay == 0 {
		cfg.RetryBaseDelay = 500 * time.Millisecond
	}
	if cfg.RetryMaxDelay == 0 {
		cfg.RetryMaxDelay = 2 * time.Minute
	}
	return &AllocatableRefresher{
		cfg: cfg,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](cfg.RetryBaseDelay, cfg.RetryMaxDelay),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "csi_volmgr_allocatable"}),
		last: map[string]int64{},
	}, nil
}

// Registered schedules a registered driver's periodic refresh (its
// registration wrote the count it reported then). It does not block.
func (r *AllocatableRefresher) Registered(driver string, maxVolumes int64) {
	r.mu.Lock()
	r.last[driver] = maxVolumes
	r.mu.Unlock()
	if p := r.cfg.Period(driver); p > 0 {
		r.queue.AddAfter(driver, p)
	}
}

// PeriodChanged schedules a driver whose CSIDriver changed (its period may
// have). It does not block.
func (r *AllocatableRefresher) PeriodChanged(driver string) {
	if p := r.cfg.Period(driver); p > 0 {
		r.queue.AddAfter(driver, p)
	}
}

// Refresh asks the driver for its count now: an attach failed because the
// node reached the limit, which may have changed. It does not block.
func (r *AllocatableRefresher) Refresh(driver string) { r.queue.Add(driver) }

// Run refreshes until ctx ends.
func (r *AllocatableRefresher) Run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("allocatable")
	ctx = klog.NewContext(ctx, logger)
	go func() {
		<-ctx.Done()
		r.queue.ShutDown()
	}()
	for {
		driver, shutdown := r.queue.Get()
		if shutdown {
			return
		}
		if err := r.refresh(ctx, driver); err != nil && ctx.Err() == nil {
			logger.Info("Refreshing the driver's allocatable volume count failed; will retry", "driver", driver, "err", err)
			r.queue.AddRateLimited(driver)
		} else {
			r.queue.Forget(driver)
			if p := r.cfg.Period(driver); p > 0 {
				r.queue.AddAfter(driver, p)
			}
		}
		r.queue.Done(driver)
	}
}

func (r *AllocatableRefresher) refresh(ctx context.Context, driver string) error {
	client, ok := r.cfg.Client(driver)
	if !ok {
		return nil // deregistered: its next registration writes the count
	}
	info, err := client.NodeGetInfo(ctx)
	if err != nil {
		return fmt.Errorf("NodeGetInfo: %w", err)
	}
	maxVolumes := info.GetMaxVolumesPerNode()
	r.mu.Lock()
	last, known := r.last[driver]
	r.mu.Unlock()
	if known && last == maxVolumes {
		return nil
	}
	if err := r.cfg.NodeInfo.UpdateAllocatable(ctx, driver, maxVolumes); err != nil {
		return err
	}
	r.mu.Lock()
	r.last[driver] = maxVolumes
	r.mu.Unlock()
	if r.cfg.Updated != nil {
		r.cfg.Updated(driver, maxVolumes)
	}
	klog.FromContext(ctx).Info("Updated the driver's allocatable volume count in the CSINode", "driver", driver, "maxVolumes", maxVolumes, "was", last)
	return nil
}
