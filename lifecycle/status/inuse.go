package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// VolumesInUseQueueName names the volumesInUse queue in workqueue metrics.
const VolumesInUseQueueName = "csi_volmgr_volumes_in_use"

// inUseKey is the only key of the volumesInUse queue.
const inUseKey = "volumesInUse"

// VolumesInUseConfig configures a VolumesInUse writer.
type VolumesInUseConfig struct {
	// Client patches nodes/status. Required.
	Client kubernetes.Interface
	// NodeName is the Node this agent serves. Required.
	NodeName string
	// Queue tunes the workqueue.
	Queue QueueOptions
	// Gate, when set, holds every write back while it is closed (the
	// agent does not own its Node).
	Gate Gate
}

// VolumesInUse writes the Node's status.volumesInUse: the volumes that the
// attach/detach controller must not detach from this node because they
// are (or may be) staged or published here. This agent is the only writer
// of the field on its node.
//
// Set gives the whole wanted set; it is written when it differs from the
// set last written, by a single worker, so a burst of Sets while a write is
// in flight costs one more write with the latest set. Failed writes are
// retried with backoff. Nothing is written before the first Set: call it
// only once the actual state is rebuilt after a restart, or the controller
// may detach volumes that are still staged.
//
// The write is a strategic merge patch of nodes/status holding only
// status.volumesInUse. The list is atomic, so the patch replaces it
// whole, and every other field, status.volumesAttached (written by the
// attach/detach controller) included, is left untouched.
type VolumesInUse struct {
	client   kubernetes.Interface
	nodeName string
	queue    workqueue.TypedRateLimitingInterface[string]
	gate     Gate

	// mu guards desired and reported.
	mu sync.Mutex
	// desired is the latest set given to Set, sorted and de-duplicated;
	// nil before the first Set.
	desired []volume.Name
	// reported is the set last written to the Node; nil before the first
	// successful write.
	reported []volume.Name
}

// NewVolumesInUse returns a writer; call Run to start writing.
func NewVolumesInUse(cfg VolumesInUseConfig) (*VolumesInUse, error) {
	if cfg.Client == nil {
		return nil, errors.New("status: VolumesInUseConfig.Client is required")
	}
	if cfg.NodeName == "" {
		return nil, errors.New("status: VolumesInUseConfig.NodeName is required")
	}
	return &VolumesInUse{
		client:   cfg.Client,
		nodeName: cfg.NodeName,
		queue:    newQueue(VolumesInUseQueueName, cfg.Queue),
		gate:     cfg.Gate,
	}, nil
}

// Set gives the set of volumes in use on the node; order and duplicates do
// not matter. The set is written unless it equals the one last written.
func (v *VolumesInUse) Set(names []volume.Name) {
	set := normalize(names)
	v.mu.Lock()
	if v.desired != nil && slices.Equal(v.desired, set) {
		v.mu.Unlock()
		return
	}
	v.desired = set
	v.mu.Unlock()
	v.queue.Add(inUseKey)
}

// Reported says whether name is in the set last written to the Node: the
// attach/detach controller can see it in use, so waiting for attach may
// start (kubernetes#106853). A name removed by Set stays reported until
// the smaller set is written.
func (v *VolumesInUse) Reported(name volume.Name) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	_, found := slices.BinarySearch(v.reported, name)
	return found
}

// Run writes the set until ctx is done. After each successful write,
// onReported (if not nil) is called with the names that the write newly
// reported (sorted), so that the caller can wake the volumes that wait for
// Reported; it runs on the writer's goroutine and must not block.
func (v *VolumesInUse) Run(ctx context.Context, onReported func(newlyReported []volume.Name)) {
	logger := klog.FromContext(ctx).WithName("volumes-in-use").WithValues("node", v.nodeName)
	ctx = klog.NewContext(ctx, logger)
	logger.V(2).Info("Starting volumesInUse writer")
	done := make(chan struct{})
	go func() {
		defer close(done)
		runWorker(ctx, v.queue, v.gate, func(ctx context.Context, key string) error { return v.sync(ctx, key, onReported) })
	}()
	<-ctx.Done()
	v.queue.ShutDown()
	<-done
	logger.V(2).Info("Stopped volumesInUse writer")
}

// sync writes the desired set if it differs from the reported one.
func (v *VolumesInUse) sync(ctx context.Context, _ string, onReported func([]volume.Name)) error {
	v.mu.Lock()
	want, before := v.desired, v.reported
	v.mu.Unlock()
	if want == nil || (before != nil && slices.Equal(want, before)) {
		return nil
	}
	data, err := volumesInUsePatch(want)
	if err != nil {
		return err
	}
	if _, err := v.client.CoreV1().Nodes().Patch(ctx, v.nodeName, types.StrategicMergePatchType, data,
		metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("writing status.volumesInUse of Node %s: %w", v.nodeName, err)
	}
	klog.FromContext(ctx).V(4).Info("Wrote volumesInUse", "volumes", len(want))
	v.mu.Lock()
	v.reported = want
	v.mu.Unlock()
	if added := difference(want, before); len(added) > 0 && onReported != nil {
		onReported(added)
	}
	return nil
}

// volumesInUsePatch is the strategic merge patch that sets
// status.volumesInUse to names; an empty set removes the field.
func volumesInUsePatch(names []volume.Name) ([]byte, error) {
	var list any // JSON null deletes the field
	if len(names) > 0 {
		list = names
	}
	data, err := json.Marshal(map[string]any{"status": map[string]any{"volumesInUse": list}})
	if err != nil {
		return nil, fmt.Errorf("encoding volumesInUse patch: %w", err)
	}
	return data, nil
}

// normalize returns names sorted and de-duplicated, never nil.
func normalize(names []volume.Name) []volume.Name {
	set := slices.Clone(names)
	if set == nil {
		set = []volume.Name{}
	}
	slices.Sort(set)
	return slices.Compact(set)
}

// difference returns the names of sorted a that are not in sorted b.
func difference(a, b []volume.Name) []volume.Name {
	var out []volume.Name
	for _, n := range a {
		if _, found := slices.BinarySearch(b, n); !found {
			out = append(out, n)
		}
	}
	return out
}
