package metrics

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Ownership exports the recursive fsGroup ownership changes the agent does
// for drivers without VOLUME_MOUNT_GROUP: how many run, how many files they
// have done so far (a rate that says how long a large volume will take,
// where the kubelet only warns after 30 s) and how they ended. Their
// durations are storage_operation_duration_seconds with operation_name
// "volume_apply_access_control", as the kubelet's. Its methods are safe
// for concurrent use.
type Ownership struct {
	files   *prometheus.CounterVec
	running *prometheus.GaugeVec
	done    *prometheus.CounterVec
}

// NewOwnership creates the collectors and registers them into reg.
func NewOwnership(reg prometheus.Registerer) (*Ownership, error) {
	if reg == nil {
		return nil, errors.New("metrics: a Registerer is required")
	}
	o := &Ownership{
		files: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "csi_volmgr_volume_ownership_files_total",
			Help: "Files and directories given to a pod's fsGroup by recursive ownership changes, counted as the changes go",
		}, []string{"volume_plugin"}),
		running: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "csi_volmgr_volume_ownership_changes_in_progress",
			Help: "Recursive fsGroup ownership changes running now",
		}, []string{"volume_plugin"}),
		done: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "csi_volmgr_volume_ownership_changes_total",
			Help: "Recursive fsGroup ownership changes by result: changed, skipped (fsGroupChangePolicy OnRootMismatch " +
				"found the root in place), interrupted (the pod went) or failed",
		}, []string{"volume_plugin", "result"}),
	}
	for _, c := range []prometheus.Collector{o.files, o.running, o.done} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering ownership metrics: %w", err)
		}
	}
	return o, nil
}

// OwnershipFiles adds n files done for a volume of driver.
func (o *Ownership) OwnershipFiles(driver string, n int64) {
	if n > 0 {
		o.files.WithLabelValues(PluginName(driver)).Add(float64(n))
	}
}

// OwnershipRunning adds delta to the changes in progress.
func (o *Ownership) OwnershipRunning(driver string, delta int) {
	o.running.WithLabelValues(PluginName(driver)).Add(float64(delta))
}

// OwnershipDone counts a finished change.
func (o *Ownership) OwnershipDone(driver, result string) {
	o.done.WithLabelValues(PluginName(driver), result).Inc()
}
