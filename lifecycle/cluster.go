package lifecycle

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/expand"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/nodeowner"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/operations"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/podfinalizer"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/reconciler"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/source"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
)

// clusterMode serves a node from an API server: the node-scoped informers
// and by-name watches of lifecycle/source, VolumeAttachments written by the
// attach/detach controller, and the pod condition, Events and
// node.status.volumesInUse as outputs; with CompletePodDeletion also the
// deletion of pods whose volumes are torn down.
type clusterMode struct {
	src    *source.Source
	node   *source.Node
	conds  *status.PodConditions
	events *status.Events
	inUse  *status.VolumesInUse
	expand *expand.Expander
	// fin is nil without CompletePodDeletion.
	fin *podfinalizer.Finalizer
	// owner is told of every version of the Node's labels: the agent
	// acts only while the Node carries nodeowner.Label.
	owner *nodeowner.Gate
	// nodeKept: the node keeper tells owner of the Node, not observeOwner.
	nodeKept bool
	// ownerMu serializes observeOwner.
	ownerMu sync.Mutex
	in      inputs
}

func newClusterMode(ctx context.Context, m *Manager, queues status.QueueOptions) (*clusterMode, error) {
	client, report := m.cfg.Client, m.cfg.Client
	if m.cfg.ReportClient != nil {
		report = m.cfg.ReportClient
	}
	src, err := source.New(ctx, source.Config{Client: client, NodeName: m.cfg.NodeName, ClusterWideInformers: m.cfg.ClusterWideInformers,
		SettledObjectResync: m.cfg.SettledObjectResync, GetOnly: m.cfg.GetOnly})
	if err != nil {
		return nil, fmt.Errorf("start sources: %w", err)
	}
	node, err := source.NewNode(client, m.cfg.NodeName)
	if err != nil {
		return nil, err
	}
	c := &clusterMode{src: src, node: node, owner: m.owner, nodeKept: m.cfg.NodeKept}
	c.conds, err = status.NewPodConditions(status.PodConditionsConfig{
		Client: report, Queue: queues, Gate: m.owner,
		CachedPod: func(namespace, name string) *corev1.Pod {
			pod, _ := src.PodByName(namespace, name)
			return pod
		},
	})
	if err != nil {
		return nil, err
	}
	if c.inUse, err = status.NewVolumesInUse(status.VolumesInUseConfig{Client: client, NodeName: m.cfg.NodeName, Queue: queues, Gate: m.owner}); err != nil {
		return nil, err
	}
	var statusWriter reconciler.StatusWriter = c.conds
	if m.cfg.CompletePodDeletion {
		c.fin, err = podfinalizer.New(podfinalizer.Config{
			Client: client, Pods: src, Desired: m.desire, Actual: m.world, Layout: m.layout,
			MetricsProvider: queues.MetricsProvider, Gate: m.owner,
		})
		if err != nil {
			return nil, err
		}
		// The reconciler forgets a pod's status each time it has torn down
		// one of the volumes of a pod that left the desired state: the
		// moment to see whether the pod may go.
		statusWriter = forgetHook{StatusWriter: c.conds, forgot: c.fin.PodChanged}
	}
	// Events start a broadcaster: made last, so that nothing above can
	// fail with it running.
	if c.events, err = status.NewEvents(ctx, status.EventsConfig{Client: report, NodeName: m.cfg.NodeName, Owned: m.owner.Owned}); err != nil {
		return nil, err
	}
	watchAttachLimits(m, src)
	if c.expand, err = newExpander(m, src, c.events, queues); err != nil {
		c.events.Shutdown()
		return nil, err
	}
	c.in = inputs{
		source:      src,
		node:        node,
		attachments: src.Attachments(),
		secrets:     source.NewSecrets(client),
		tokens:      newCachedTokens(tokenRequester{client: client}, m.cfg.Changes.TokenClock),
		status:      statusWriter,
		events:      c.events,
		inUse:       c.inUse,
		expander:    c.expand,
	}
	return c, nil
}

func (c *clusterMode) inputs() inputs { return c.in }

func (c *clusterMode) steps(ops *operations.Operations) reconciler.Operations { return ops }

// migrateRecords: a cluster's attachments are VolumeAttachments, not
// records of the agent.
func (c *clusterMode) migrateRecords(context.Context) int { return 0 }

func (c *clusterMode) runInputs(ctx context.Context, rec *reconciler.Reconciler) {
	// Subscribed before the sources start, so no change is missed.
	c.src.OnAttachmentChange(rec.AttachmentChanged)
	// A pod's or the Node's next change restores what others overwrote.
	c.src.OnPodChange(c.conds.Recheck)
	c.node.OnUpdate(c.inUse.NodeChanged)
	if !c.nodeKept {
		c.node.OnChange(c.observeOwner)
	}
	var wg sync.WaitGroup
	wg.Go(func() { c.src.Run(ctx) })
	wg.Go(func() { c.node.Run(ctx) })
	wg.Go(func() {
		// A Node that does not exist has no event: the first list tells.
		if cache.WaitForCacheSync(ctx.Done(), c.node.HasSynced) && !c.nodeKept {
			c.observeOwner()
		}
	})
	wg.Wait()
}

func (c *clusterMode) runOutputs(ctx context.Context, rec *reconciler.Reconciler) {
	var wg sync.WaitGroup
	wg.Go(func() { c.conds.Run(ctx, 4) })
	wg.Go(func() { c.inUse.Run(ctx, rec.Reported) })
	wg.Go(func() { c.expand.Run(ctx, 2) })
	if c.fin != nil {
		wg.Go(func() { c.fin.Run(ctx) })
	}
	wg.Wait()
}

// observeOwner tells the owner Gate of the Node's UID and labels as cached
// now: the first Node seen with the owner label is pinned, and a Node
// recreated under the same name is another Node the agent does not serve
// until it is told to (nodeowner.Gate.ObserveNode).
// It is called from the Node's events and once after its first list; the
// lock makes the last to read the cache the last to tell the Gate, so that
// an older view never overwrites a newer one.
func (c *clusterMode) observeOwner() {
	c.ownerMu.Lock()
	defer c.ownerMu.Unlock()
	uid, labels, exists := c.node.Identity()
	c.owner.ObserveNode(uid, labels, exists)
}

func (c *clusterMode) close() error {
	c.events.Shutdown()
	return nil
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
