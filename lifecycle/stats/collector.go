package stats

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/metrics"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// Defaults of Config.
const (
	// DefaultPeriod is the kubelet's volumeStatsAggPeriod.
	DefaultPeriod = time.Minute
	// DefaultConcurrency bounds the calls in flight per collection.
	DefaultConcurrency = 4
)

// Client is the part of a driver connection the collector calls;
// *csiclient.Client implements it.
type Client interface {
	NodeCapabilities(ctx context.Context) (csiclient.NodeCapabilities, error)
	NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error)
	NodeGetVolumeHealth(ctx context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error)
}

// ActualState is what the collector reads of the actual state; *asw.World
// implements it.
type ActualState interface {
	Snapshot() []asw.VolumeStatus
}

// DesiredState names the pods' uses; *dsw.Store implements it.
type DesiredState interface {
	PodVolume(key volume.PodKey) (dsw.Use, bool)
}

// Claims finds the claim of a PersistentVolume (its claimRef); the
// sources' caches implement it.
type Claims interface {
	PV(name string) (*corev1.PersistentVolume, error)
}

// Events records Events on pods; *status.Events implements it.
type Events interface {
	Pod(pod volume.PodInfo, eventType, reason, message string)
}

// Config configures a Collector. State, Desired and Drivers are required.
type Config struct {
	State   ActualState
	Desired DesiredState
	// Drivers returns a registered driver's client.
	Drivers func(name string) (Client, bool)
	// Claims names the claims of the volumes, for the metrics' labels and
	// the pods' stats; nil leaves them without a claim.
	Claims Claims
	// Events, when set, records VolumeConditionAbnormal on the pods of a
	// volume that became unhealthy.
	Events Events
	// Registerer receives the kubelet_volume_stats_* metrics; nil
	// registers nothing.
	Registerer prometheus.Registerer
	// Period is how often every published volume's stats are collected; 0
	// means DefaultPeriod.
	Period time.Duration
	// Concurrency bounds the CSI calls in flight; 0 means
	// DefaultConcurrency.
	Concurrency int
	// Synced, when set, delays the first collection until the desired
	// state has seen every pod.
	Synced <-chan struct{}
	// OnHealthChange, when set, is told of the pods of a volume whose set
	// of adverse health conditions changed (either way), so that their
	// condition names it (Unhealthy). It must not block long.
	OnHealthChange func(pods []types.UID)
}

// VolumeStats is the last collection of one volume.
type VolumeStats struct {
	// Volume, Driver and PVName name the volume.
	Volume volume.Name
	Driver string
	PVName string
	// Claim is the PersistentVolumeClaim the volume is bound to; nil for
	// inline volumes or when it is unknown.
	Claim *types.NamespacedName
	// Pods are the pods whose publish of the volume is done.
	Pods []types.UID
	// Time is when the stats were collected.
	Time time.Time
	// Usage is NodeGetVolumeStats' answer; nil when the driver has no
	// GET_VOLUME_STATS or the call failed.
	Usage *Usage
	// HealthSupported says the driver has GET_VOLUME_HEALTH; Health is
	// then its adverse conditions (none means healthy).
	HealthSupported bool
	Health          []corev1.VolumeHealthCondition
	// Err is the last call's error, "" when none.
	Err string
}

// Usage is a volume's usage, from NodeGetVolumeStats; nil fields were not
// reported.
type Usage struct {
	CapacityBytes, AvailableBytes, UsedBytes *int64
	Inodes, InodesFree, InodesUsed           *int64
}

// Abnormal says the driver reports an adverse health condition.
func (s VolumeStats) Abnormal() bool { return len(s.Health) > 0 }

// Collector collects the stats and health of the node's published volumes
// from their drivers, as the kubelet's volume stats (csi_metrics.go, every
// volumeStatsAggPeriod) and volume health manager (NodeGetVolumeHealth)
// do, on a period and with a bounded number of calls in flight. Unlike the
// kubelet it calls once per volume, not once per pod using it, and asks
// for the capabilities once per connection (csiclient caches them).
//
// The results are exported as the kubelet's kubelet_volume_stats_* metrics
// ({namespace, persistentvolumeclaim}), kept for the status API and the
// runtime API (PodVolumeStats, for /stats/summary), and an adverse health
// condition that appears is recorded as a VolumeConditionAbnormal Event on
// the volume's pods.
type Collector struct {
	cfg Config

	// mu guards last.
	mu   sync.Mutex
	last map[volume.Name]VolumeStats
}

// New returns a Collector; Run starts it.
func New(cfg Config) (*Collector, error) {
	if cfg.State == nil || cfg.Desired == nil || cfg.Drivers == nil {
		return nil, errors.New("stats: State, Desired and Drivers are required")
	}
	if cfg.Period == 0 {
		cfg.Period = DefaultPeriod
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = DefaultConcurrency
	}
	c := &Collector{cfg: cfg, last: map[volume.Name]VolumeStats{}}
	if cfg.Registerer != nil {
		if err := metrics.RegisterStable(cfg.Registerer, NewMetrics(c.Volumes)); err != nil {
			return nil, fmt.Errorf("registering volume stats metrics: %w", err)
		}
	}
	return c, nil
}

// Run collects every Period, starting after a random part of the first
// period (as the kubelet jitters), until ctx ends.
func (c *Collector) Run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("volume-stats")
	ctx = klog.NewContext(ctx, logger)
	if c.cfg.Synced != nil {
		select {
		case <-ctx.Done():
			return
		case <-c.cfg.Synced:
		}
	}
	delay := time.Duration(rand.Int64N(int64(c.cfg.Period)/2 + 1))
	t := time.NewTimer(delay)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		began := time.Now()
		n := c.Collect(ctx)
		logger.V(4).Info("Collected volume stats", "volumes", n, "took", time.Since(began))
		t.Reset(c.cfg.Period)
	}
}

// target is one volume to collect, at the path of one of its publishes.
type target struct {
	v    asw.VolumeStatus
	path string
	pods []types.UID
}

// Collect collects every published volume's stats once, with at most
// Concurrency calls in flight, and returns how many volumes it asked about.
func (c *Collector) Collect(ctx context.Context) int {
	var targets []target
	for _, v := range c.cfg.State.Snapshot() {
		if v.External {
			continue // a container orchestrator's: it asks for stats itself
		}
		t := target{v: v}
		for _, p := range v.Pods {
			if p.State == volume.Published && !p.External && p.TargetPath != "" {
				if t.path == "" {
					t.path = p.TargetPath
				}
				t.pods = append(t.pods, p.Key.Pod)
			}
		}
		if t.path != "" {
			targets = append(targets, t)
		}
	}
	results := make([]VolumeStats, len(targets))
	sem := make(chan struct{}, c.cfg.Concurrency)
	var wg sync.WaitGroup
	for i, t := range targets {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			results[i] = c.collect(ctx, t)
		})
	}
	wg.Wait()

	next := make(map[volume.Name]VolumeStats, len(results))
	for _, r := range results {
		next[r.Volume] = r
	}
	c.mu.Lock()
	prev := c.last
	c.last = next
	c.mu.Unlock()
	for _, r := range results {
		c.healthChanged(prev[r.Volume], r)
	}
	return len(targets)
}

// collect asks one volume's driver for its stats and health.
func (c *Collector) collect(ctx context.Context, t target) VolumeStats {
	s := VolumeStats{Volume: t.v.Name, Driver: t.v.Driver, PVName: t.v.PVName, Pods: t.pods, Time: time.Now(), Claim: c.claimOf(t.v.PVName)}
	client, ok := c.cfg.Drivers(t.v.Driver)
	if !ok {
		s.Err = fmt.Sprintf("%v: %q", volume.ErrDriverNotRegistered, t.v.Driver)
		return s
	}
	caps, err := client.NodeCapabilities(ctx)
	if err != nil {
		s.Err = err.Error()
		return s
	}
	var errs []string
	if caps.Stats() {
		resp, err := client.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{
			VolumeId: t.v.Handle, VolumePath: t.path, StagingTargetPath: t.v.StagingPath,
		})
		if err != nil {
			errs = append(errs, err.Error())
		} else {
			s.Usage = usageOf(resp)
		}
	}
	if caps.VolumeHealth() {
		s.HealthSupported = true
		resp, err := client.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{
			VolumeId: t.v.Handle, VolumePublishPath: t.path, StagingTargetPath: t.v.StagingPath,
		})
		if err != nil {
			errs = append(errs, err.Error())
			s.HealthSupported = false
		} else {
			s.Health = healthOf(resp.GetVolumeHealth())
		}
	}
	s.Err = strings.Join(errs, "; ")
	if s.Err != "" {
		klog.FromContext(ctx).V(2).Info("Collecting volume stats failed", "volume", t.v.Name, "driver", t.v.Driver, "err", s.Err)
	}
	return s
}

// claimOf returns the claim a PersistentVolume is bound to.
func (c *Collector) claimOf(pvName string) *types.NamespacedName {
	if c.cfg.Claims == nil || pvName == "" {
		return nil
	}
	pv, err := c.cfg.Claims.PV(pvName)
	if err != nil || pv.Spec.ClaimRef == nil {
		return nil
	}
	return &types.NamespacedName{Namespace: pv.Spec.ClaimRef.Namespace, Name: pv.Spec.ClaimRef.Name}
}

// usageOf maps NodeGetVolumeStats' usage as the kubelet's csi_client.go
// does: BYTES gives capacity, available and used; INODES gives inodes,
// free and used.
func usageOf(resp *csi.NodeGetVolumeStatsResponse) *Usage {
	u := &Usage{}
	for _, e := range resp.GetUsage() {
		total, avail, used := e.GetTotal(), e.GetAvailable(), e.GetUsed()
		switch e.GetUnit() {
		case csi.VolumeUsage_BYTES:
			u.CapacityBytes, u.AvailableBytes, u.UsedBytes = &total, &avail, &used
		case csi.VolumeUsage_INODES:
			u.Inodes, u.InodesFree, u.InodesUsed = &total, &avail, &used
		}
	}
	return u
}

// healthOf maps CSI health entries to the API's conditions, as the
// kubelet's mapVolumeHealthConditions does; unknown types are kept with
// their CSI name.
func healthOf(h *csi.VolumeHealth) []corev1.VolumeHealthCondition {
	var out []corev1.VolumeHealthCondition
	for _, e := range h.GetHealthStatuses() {
		st := corev1.VolumeHealthStatusType(e.GetStatus().String())
		switch e.GetStatus() {
		case csi.VolumeHealthErrorType_INACCESSIBLE:
			st = corev1.VolumeHealthInaccessible
		case csi.VolumeHealthErrorType_DATA_LOSS:
			st = corev1.VolumeHealthDataLoss
		case csi.VolumeHealthErrorType_DEGRADED:
			st = corev1.VolumeHealthDegraded
		}
		out = append(out, corev1.VolumeHealthCondition{Status: st, Reason: e.GetReason(), Message: e.GetMessage()})
	}
	return out
}

// healthChanged records a VolumeConditionAbnormal Event on the pods of a
// volume whose set of adverse conditions (status, reason) changed to a
// non-empty one.
func (c *Collector) healthChanged(prev, next VolumeStats) {
	if !next.HealthSupported || sameConditions(prev.Health, next.Health) {
		return
	}
	if c.cfg.OnHealthChange != nil {
		c.cfg.OnHealthChange(next.Pods)
	}
	if c.cfg.Events == nil || !next.Abnormal() {
		return
	}
	msg := unhealthyMessage(next)
	for _, uid := range next.Pods {
		if use, ok := c.cfg.Desired.PodVolume(volume.PodKey{Volume: next.Volume, Pod: uid}); ok {
			c.cfg.Events.Pod(use.Volume.Pod, corev1.EventTypeWarning, status.EventVolumeConditionAbnormal, msg)
		}
	}
}

// sameConditions compares the (status, reason) sets, as the kubelet's
// VolumeHealthConditionSetsEqual: message changes alone do not count.
func sameConditions(a, b []corev1.VolumeHealthCondition) bool {
	key := func(cs []corev1.VolumeHealthCondition) []string {
		out := make([]string, 0, len(cs))
		for _, c := range cs {
			out = append(out, string(c.Status)+"/"+c.Reason)
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	return slices.Equal(key(a), key(b))
}

// Volumes returns the last collection, sorted by volume name.
func (c *Collector) Volumes() []VolumeStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]VolumeStats, 0, len(c.last))
	for _, name := range slices.Sorted(maps.Keys(c.last)) {
		out = append(out, c.last[name])
	}
	return out
}

// Volume returns the last collection of one volume.
func (c *Collector) Volume(name volume.Name) (VolumeStats, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.last[name]
	return s, ok
}

// unhealthyMessage names a volume's adverse health conditions.
func unhealthyMessage(s VolumeStats) string {
	var parts []string
	for _, h := range s.Health {
		part := string(h.Status) + " " + h.Reason
		if h.Message != "" {
			part += ": " + h.Message
		}
		parts = append(parts, part)
	}
	name := s.PVName
	if name == "" {
		name = string(s.Volume)
	}
	return fmt.Sprintf("volume %s is unhealthy: %s", name, strings.Join(parts, "; "))
}

// Unhealthy returns, when the driver reported adverse health conditions
// of the volume at the last collection, a message that names them.
func (c *Collector) Unhealthy(name volume.Name) (string, bool) {
	s, ok := c.Volume(name)
	if !ok || !s.HealthSupported || !s.Abnormal() {
		return "", false
	}
	return unhealthyMessage(s), true
}
