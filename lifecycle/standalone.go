package lifecycle

import (
	"context"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/localattach"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/operations"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/populator"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/reconciler"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/source/manifests"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
)

// StandaloneSource is where a node without an API server finds its pods,
// the objects they reference and their Secrets; *manifests.Source
// implements it.
type StandaloneSource interface {
	populator.Source
	// GetSecret returns the data of a Secret. Errors never contain secret
	// data.
	GetSecret(ctx context.Context, namespace, name string) (map[string]string, error)
	// Run applies changes until ctx ends.
	Run(ctx context.Context) error
}

var _ StandaloneSource = &manifests.Source{}

// standaloneMode serves a node without an API server: pods and objects
// from the standalone source, volumes attached by the agent itself
// (localattach, wrapped around the operations), and status in the logs.
type standaloneMode struct {
	src     StandaloneSource
	att     *localattach.Attacher
	drivers Drivers
	events  *status.Events
	in      inputs
}

func newStandaloneMode(ctx context.Context, m *Manager) (*standaloneMode, error) {
	src := m.cfg.Standalone
	att, err := localattach.New(localattach.Config{
		RootDir: m.layout.Root(), NodeName: m.cfg.NodeName,
		Drivers: m.cfg.Drivers, Policies: m.cfg.Policies, Volumes: src, Secrets: src,
		InUse: m.volumeInUse, Wanted: m.desire.IsVolumeWanted, Synced: m.synced,
		RetryBaseDelay: m.cfg.Reconciler.RetryBaseDelay, RetryMaxDelay: m.cfg.Reconciler.RetryMaxDelay,
	})
	if err != nil {
		return nil, err
	}
	// Without a client, Events are only logged (at V(4)).
	events, err := status.NewEvents(ctx, status.EventsConfig{NodeName: m.cfg.NodeName})
	if err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx)
	return &standaloneMode{
		src: src, att: att, drivers: m.cfg.Drivers, events: events,
		in: inputs{
			source:      src,
			attachments: att,
			secrets:     src,
			status:      &logStatus{logger: logger.WithName("status"), last: map[types.UID]status.PodVolumesStatus{}},
			events:      events,
		},
	}, nil
}

func (s *standaloneMode) inputs() inputs { return s.in }

// steps attaches volumes before WaitForAttach and releases them for detach
// after Unstage.
func (s *standaloneMode) steps(ops *operations.Operations) reconciler.Operations {
	return s.att.Wrap(ops)
}

func (s *standaloneMode) migrateRecords(ctx context.Context) int { return s.att.MigrateRecords(ctx) }

func (s *standaloneMode) runInputs(ctx context.Context, _ *reconciler.Reconciler) {
	if err := s.src.Run(ctx); err != nil {
		klog.FromContext(ctx).Error(err, "Standalone source stopped")
	}
}

func (s *standaloneMode) runOutputs(ctx context.Context, _ *reconciler.Reconciler) {
	s.drivers.OnRegistered(s.att.DriverRegistered)
	s.att.Run(ctx)
}

func (s *standaloneMode) close() error {
	s.events.Shutdown()
	return nil
}

// logStatus is the StatusWriter of standalone mode: it logs a pod's
// VolumesReady status each time it changes, where a cluster would write
// the pod condition.
type logStatus struct {
	logger klog.Logger
	// mu protects last.
	mu   sync.Mutex
	last map[types.UID]status.PodVolumesStatus
}

// Set logs s if it differs from the pod's last status.
func (l *logStatus) Set(s status.PodVolumesStatus) {
	l.mu.Lock()
	prev, ok := l.last[s.Pod.UID]
	l.last[s.Pod.UID] = s
	l.mu.Unlock()
	if ok && prev == s {
		return
	}
	pod := klog.KRef(s.Pod.Namespace, s.Pod.Name)
	if s.Ready {
		l.logger.Info("Pod volumes ready", "pod", pod, "podUID", s.Pod.UID)
		return
	}
	l.logger.Info("Pod volumes not ready", "pod", pod, "podUID", s.Pod.UID, "reason", s.Reason, "message", s.Message)
}

// Forget drops a pod that left the desired state.
func (l *logStatus) Forget(uid types.UID) {
	l.mu.Lock()
	_, known := l.last[uid]
	delete(l.last, uid)
	l.mu.Unlock()
	if known {
		l.logger.Info("Pod gone; tearing down its volumes", "podUID", uid)
	}
}
