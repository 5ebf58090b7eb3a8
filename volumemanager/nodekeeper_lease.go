package volumemanager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	typedcoordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/nodeowner"
)

// bootIDFile holds the Linux kernel's random ID of the current boot:
// different on every host, even on hosts cloned from one image.
const bootIDFile = "/proc/sys/kernel/random/boot_id"

// errLeaseHeld is logged when another agent serves the Node.
var errLeaseHeld = errors.New("another agent renews the Node's Lease")

// leaseHeldError is why start gives up: holder renews the Node's Lease.
type leaseHeldError struct{ holder string }

func (e *leaseHeldError) Error() string {
	return fmt.Sprintf("%v: holder %s", errLeaseHeld, e.holder)
}

// holderIdentity is the identity the keeper writes into the Node's Lease
// (spec.holderIdentity): "<hostname>/<boot ID>". It is the same for every
// start of the agent during one boot of the host, so a restarted agent
// renews its own Lease at once; another host — one with the same hostname
// and --node-name, cloned from one image — has another. Without a boot ID
// (not Linux) a random ID of the process stands for it: a restart then
// waits for its previous Lease to expire.
func holderIdentity() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	b, err := os.ReadFile(bootIDFile)
	id := strings.TrimSpace(string(b))
	if err != nil || id == "" {
		id = string(uuid.NewUUID())
	}
	return host + "/" + id
}

// leaseVerdict is what a look at the Lease found.
type leaseVerdict int

const (
	// leaseHeld: the keeper holds the Lease (it just wrote it).
	leaseHeld leaseVerdict = iota
	// leaseWaiting: another holder renewed it within its duration, and
	// was not seen renewing it since: it may be gone (this host before a
	// reboot) or alive; the next look tells.
	leaseWaiting
	// leaseContested: another holder was seen renewing it: another agent
	// serves the Node.
	leaseContested
)

// nodeLease keeps the Node's Lease kube-node-lease/<node> (what
// NodeRestriction lets a node write) under the keeper's holder identity,
// as the kubelet's node lease controller does, and tells who else holds
// it. It takes over a Lease of another holder only once that one expired
// (not renewed within its duration), and gives up for good when it sees
// another holder renew it.
type nodeLease struct {
	leases         typedcoordinationv1.LeaseInterface
	name, identity string
	duration       time.Duration

	// mu protects the fields below.
	mu sync.Mutex
	// latest is the Lease as the keeper last wrote it, nil when it does
	// not hold it: the base of the next renewal.
	latest *coordinationv1.Lease
	// other and otherRenew are the other holder last seen and its
	// renewTime then; seen is set once one was.
	other      string
	otherRenew *metav1.MicroTime
	seen       bool
}

func newNodeLease(k *nodeKeeper) *nodeLease {
	return &nodeLease{leases: k.client.CoordinationV1().Leases(corev1.NamespaceNodeLease), name: k.name, identity: k.identity,
		duration: k.leaseDuration}
}

// err is nil while the keeper holds the Lease, an error wrapping
// nodeowner.ErrNotOwned otherwise. A nil nodeLease holds nothing.
func (l *nodeLease) err() error {
	if l == nil {
		return fmt.Errorf("%w: the node keeper does not hold the Node's Lease yet", nodeowner.ErrNotOwned)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.latest == nil {
		return fmt.Errorf("%w: the node keeper does not hold the Lease %s/%s (holder %q)", nodeowner.ErrNotOwned,
			corev1.NamespaceNodeLease, l.name, l.other)
	}
	return nil
}

// try renews the Lease, creates it, or takes it over when its holder let
// it expire; node, when not nil, is the Node that owns it. It returns the
// other holder with leaseWaiting and leaseContested.
func (l *nodeLease) try(ctx context.Context, node *corev1.Node) (leaseVerdict, string, error) {
	l.mu.Lock()
	base := l.latest
	l.mu.Unlock()
	if base != nil {
		// Optimistic, as the kubelet: no read while nobody else writes it.
		lease, err := l.leases.Update(ctx, l.renewed(base, node), metav1.UpdateOptions{})
		if err == nil {
			l.hold(lease)
			return leaseHeld, "", nil
		}
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			return 0, "", fmt.Errorf("renewing the Lease %s/%s: %w", corev1.NamespaceNodeLease, l.name, err)
		}
		l.hold(nil)
	}
	lease, err := l.leases.Get(ctx, l.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		fresh := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: l.name, Namespace: corev1.NamespaceNodeLease}}
		created, err := l.leases.Create(ctx, l.renewed(fresh, node), metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			// Someone created it meanwhile: the next look tells who.
			return leaseWaiting, "", nil
		}
		if err != nil {
			return 0, "", fmt.Errorf("creating the Lease %s/%s: %w", corev1.NamespaceNodeLease, l.name, err)
		}
		l.hold(created)
		return leaseHeld, "", nil
	}
	if err != nil {
		return 0, "", fmt.Errorf("reading the Lease %s/%s: %w", corev1.NamespaceNodeLease, l.name, err)
	}
	holder := ptr.Deref(lease.Spec.HolderIdentity, "")
	if holder != "" && holder != l.identity {
		l.mu.Lock()
		renewedSince := l.seen && l.other == holder && !sameTime(l.otherRenew, lease.Spec.RenewTime)
		l.other, l.otherRenew, l.seen = holder, lease.Spec.RenewTime.DeepCopy(), true
		l.mu.Unlock()
		switch {
		case renewedSince:
			return leaseContested, holder, nil
		case !expired(lease, l.duration):
			return leaseWaiting, holder, nil
		}
		klog.FromContext(ctx).Info("Taking over the Node's Lease: its holder did not renew it within its duration",
			"node", l.name, "holderIdentity", holder, "renewTime", lease.Spec.RenewTime, "identity", l.identity)
	}
	taken, err := l.leases.Update(ctx, l.renewed(lease, node), metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		// Written meanwhile: the next look tells by whom.
		return leaseWaiting, holder, nil
	}
	if err != nil {
		return 0, "", fmt.Errorf("taking the Lease %s/%s: %w", corev1.NamespaceNodeLease, l.name, err)
	}
	l.hold(taken)
	return leaseHeld, "", nil
}

// hold records the Lease the keeper wrote; nil when it holds none.
func (l *nodeLease) hold(lease *coordinationv1.Lease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.latest = lease
}

// renewed is base held by the keeper and renewed now, owned by node when
// given.
func (l *nodeLease) renewed(base *coordinationv1.Lease, node *corev1.Node) *coordinationv1.Lease {
	lease := base.DeepCopy()
	now := metav1.NowMicro()
	if ptr.Deref(lease.Spec.HolderIdentity, "") != l.identity {
		lease.Spec.HolderIdentity = ptr.To(l.identity)
		lease.Spec.AcquireTime = &now
		if base.Spec.HolderIdentity != nil {
			lease.Spec.LeaseTransitions = ptr.To(ptr.Deref(lease.Spec.LeaseTransitions, 0) + 1)
		}
	}
	lease.Spec.LeaseDurationSeconds = ptr.To(max(1, int32(l.duration/time.Second)))
	lease.Spec.RenewTime = &now
	if node != nil {
		// Owned by the Node, as the kubelet's: the garbage collector
		// deletes it with the Node.
		lease.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}}
	}
	return lease
}

// expired tells whether lease was not renewed within its duration (d when
// it has none).
func expired(lease *coordinationv1.Lease, d time.Duration) bool {
	if lease.Spec.RenewTime == nil {
		return true
	}
	if s := lease.Spec.LeaseDurationSeconds; s != nil {
		d = time.Duration(*s) * time.Second
	}
	return time.Since(lease.Spec.RenewTime.Time) > d
}

func sameTime(a, b *metav1.MicroTime) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(b)
}

// renewInterval is how often the keeper renews the Lease: a quarter of its
// duration, as the kubelet.
func (k *nodeKeeper) renewInterval() time.Duration { return k.leaseDuration / 4 }

// acquireLease takes the Node's Lease before the keeper writes anything
// to the Node (node, nil when it does not exist yet). While another holder
// may still be alive, the Gate is held closed and it looks again every
// renewal interval; a *leaseHeldError when that holder renews it.
func (k *nodeKeeper) acquireLease(ctx context.Context, node *corev1.Node) error {
	if k.lease == nil {
		k.lease = newNodeLease(k)
	}
	logged := false
	for {
		verdict, holder, err := k.lease.try(ctx, node)
		switch {
		case err != nil:
			return err
		case verdict == leaseHeld:
			k.owner.Release()
			return nil
		case verdict == leaseContested:
			return &leaseHeldError{holder: holder}
		}
		if holder != "" {
			k.owner.Hold(k.waitingReason(holder))
			if !logged {
				klog.FromContext(ctx).Info("The Node's Lease is held by another agent: waiting for it to expire before acting on the Node",
					"node", k.name, "holderIdentity", holder, "identity", k.identity)
				logged = true
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(k.renewInterval()):
		}
	}
}

func (k *nodeKeeper) waitingReason(holder string) string {
	return fmt.Sprintf("the Lease %s/%s of node %s is held by %s, renewed within its duration; this agent (%s) acts on nothing "+
		"until it expires (or, if it is renewed, for good: another agent serves the Node)", corev1.NamespaceNodeLease, k.name, k.name, holder, k.identity)
}

// renewLease renews the Lease every renewal interval until ctx ends, but
// only while the Node, as the watch last saw it, carries the label and is
// the pinned one. Another holder seen renewing it makes the agent act on
// nothing for good (contested).
func (k *nodeKeeper) renewLease(ctx context.Context) {
	logger := klog.FromContext(ctx)
	ticker := time.NewTicker(k.renewInterval())
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		if k.checkLatest() != nil {
			// Not the agent's Node now: no write (the Gate says why).
			continue
		}
		verdict, holder, err := k.lease.try(ctx, k.latestNode())
		switch {
		case err != nil:
			if ctx.Err() == nil {
				logger.Error(err, "Cannot renew the Node's Lease; will retry", "node", k.name)
			}
		case verdict == leaseContested:
			k.contested(ctx, holder)
			return
		case verdict == leaseWaiting && holder != "":
			k.owner.Hold(k.waitingReason(holder))
		case verdict == leaseHeld:
			k.owner.Release()
		}
	}
}
