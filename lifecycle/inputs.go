package lifecycle

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/operations"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/podfinalizer"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/populator"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/reconciler"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/source"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// inputs are the parts of the lifecycle that differ between a node served
// from an API server and a standalone node: where pods and objects come
// from, how volumes get attached, and where status goes. The populator,
// operations and reconciler around them are the same.
type inputs struct {
	source      populator.Source
	attachments operations.Attachments
	secrets     operations.Secrets
	tokens      operations.Tokens
	// status, events and inUse are the reconciler's outputs; nil ones are
	// not written.
	status reconciler.StatusWriter
	events reconciler.EventRecorder
	inUse  reconciler.InUseReporter
	// wrap turns the operations into the reconciler's; identity when nil.
	wrapOps func(reconciler.Operations) reconciler.Operations
	// onReconciler wires the reconciler to the inputs' events.
	onReconciler func(*reconciler.Reconciler)
	// onDriver is told of every driver (re-)registration.
	onDriver func(driver string)
	// run are the goroutines the inputs need until the context ends.
	run []func(context.Context)
	// stop releases what the inputs hold, after the goroutines returned.
	stop []func()
}

func (in *inputs) wrap(ops *operations.Operations) reconciler.Operations {
	if in.wrapOps == nil {
		return ops
	}
	return in.wrapOps(ops)
}

func (in *inputs) connect(rec *reconciler.Reconciler) {
	if in.onReconciler != nil {
		in.onReconciler(rec)
	}
}

func (in *inputs) driverRegistered(driver string) {
	if in.onDriver != nil {
		in.onDriver(driver)
	}
}

func (in *inputs) shutdown() {
	for _, stop := range in.stop {
		stop()
	}
}

// clusterInputs are the inputs of a node served from an API server: the
// node-scoped informers and by-name watches of lifecycle/source,
// VolumeAttachments written by the attach/detach controller, and the pod
// condition, Events and node.status.volumesInUse as outputs.
func (m *Manager) clusterInputs(ctx context.Context, queues status.QueueOptions) (inputs, error) {
	client := m.cfg.Client
	src, err := source.New(ctx, source.Config{Client: client, NodeName: m.cfg.NodeName, ClusterWideInformers: m.cfg.ClusterWideInformers})
	if err != nil {
		return inputs{}, fmt.Errorf("start sources: %w", err)
	}
	conds, err := status.NewPodConditions(status.PodConditionsConfig{
		Client: client, Queue: queues,
		CachedPod: func(namespace, name string) *corev1.Pod {
			pod, _ := src.PodByName(namespace, name)
			return pod
		},
	})
	if err != nil {
		return inputs{}, err
	}
	events, err := status.NewEvents(ctx, status.EventsConfig{Client: client, NodeName: m.cfg.NodeName})
	if err != nil {
		return inputs{}, err
	}
	// rec is set by onReconciler, before any goroutine that reads it runs.
	var rec *reconciler.Reconciler
	inUse, err := status.NewVolumesInUse(status.VolumesInUseConfig{
		Client: client, NodeName: m.cfg.NodeName, Queue: queues,
		OnReported: func(names []volume.Name) { rec.Reported(names) },
	})
	if err != nil {
		events.Shutdown()
		return inputs{}, err
	}
	in := inputs{
		source:      src,
		attachments: src.Attachments(),
		secrets:     source.NewSecrets(client),
		tokens:      tokenRequester{client: client},
		status:      conds,
		events:      events,
		inUse:       inUse,
		onReconciler: func(r *reconciler.Reconciler) {
			rec = r
			src.OnAttachmentChange(r.AttachmentChanged)
		},
		run: []func(context.Context){
			src.Run,
			func(ctx context.Context) { conds.Run(ctx, 4) },
			inUse.Run,
		},
		stop: []func(){events.Shutdown},
	}
	if m.cfg.CompletePodDeletion {
		fin, err := podfinalizer.New(podfinalizer.Config{
			Client: client, Pods: src, Desired: m.desire, Actual: m.world, Layout: m.layout,
			MetricsProvider: queues.MetricsProvider,
		})
		if err != nil {
			events.Shutdown()
			return inputs{}, err
		}
		// The reconciler forgets a pod's status each time it has torn down
		// one of the volumes of a pod that left the desired state: the
		// moment to see whether the pod may go.
		in.status = forgetHook{StatusWriter: conds, forgot: fin.PodChanged}
		in.run = append(in.run, fin.Run)
	}
	return in, nil
}

// forgetHook is a StatusWriter that also tells fn of every Forget.
type forgetHook struct {
	reconciler.StatusWriter
	forgot func(uid types.UID)
}

// Forget forgets the pod's status and reports the pod.
func (h forgetHook) Forget(uid types.UID) {
	h.StatusWriter.Forget(uid)
	h.forgot(uid)
}
