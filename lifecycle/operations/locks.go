package operations

import (
	"context"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// locks serializes the steps on volumes, the agent's concurrency rule,
// shared by the reconciler and the front endpoint because both call the
// same Operations:
//
//   - Stage and Unstage hold the volume's lock exclusively, so nothing else
//     runs on that volume meanwhile. So does Publish of a ReadWriteOncePod
//     volume, which makes its "no other pod uses it" check and the publish
//     one atomic step.
//   - WaitForAttach, Publish and Unpublish hold the volume's lock shared, so
//     steps for different pods of a staged volume run in parallel (the
//     kubelet serializes them); Publish and Unpublish also hold their
//     PodKey's lock, so the same (volume, pod) never runs twice at once.
//     Publish and Unpublish of a driver without STAGE_UNSTAGE_VOLUME, which
//     mounts the volume itself there, hold it exclusively (mountsInPublish).
//   - A waiting exclusive holder keeps new shared holders out, so a stage or
//     unstage is not starved by a stream of publishes.
//   - Locks are taken volume first, then pod; a wait ends early with the
//     context's error.
//
// Entries are reference-counted and dropped when no step holds or waits for
// them, so the table holds only volumes with steps in flight.
type locks struct {
	// mu guards volumes and every field of the entries.
	mu      sync.Mutex
	volumes map[volume.Name]*volumeLock
}

type volumeLock struct {
	// refs counts holders and waiters of this volume and its pods.
	refs int
	// readers holding the lock shared; writer holding it exclusively.
	readers int
	writer  bool
	// writersWaiting counts exclusive waiters, which keep readers out.
	writersWaiting int
	// waiting counts steps blocked on this volume or one of its pods.
	waiting int
	// changed is closed and replaced whenever the lock state changes.
	changed chan struct{}
	pods    map[types.UID]*podLock
}

type podLock struct {
	refs int
	held bool
}

func newLocks() *locks {
	return &locks{volumes: map[volume.Name]*volumeLock{}}
}

// broadcast wakes every waiter of v; mu must be held.
func (v *volumeLock) broadcast() {
	close(v.changed)
	v.changed = make(chan struct{})
}

// entry returns the lock of name with one more reference; mu must be held.
func (l *locks) entry(name volume.Name) *volumeLock {
	v, ok := l.volumes[name]
	if !ok {
		v = &volumeLock{changed: make(chan struct{}), pods: map[types.UID]*podLock{}}
		l.volumes[name] = v
	}
	v.refs++
	return v
}

// unref drops one reference of name's lock; mu must be held.
func (l *locks) unref(name volume.Name, v *volumeLock) {
	v.refs--
	if v.refs == 0 {
		delete(l.volumes, name)
	}
}

// wait blocks until v changes or ctx ends; mu must be held and is held
// again on return.
func (l *locks) wait(ctx context.Context, v *volumeLock) error {
	ch := v.changed
	v.waiting++
	l.mu.Unlock()
	var err error
	select {
	case <-ch:
	case <-ctx.Done():
		err = ctx.Err()
	}
	l.mu.Lock()
	v.waiting--
	return err
}

// lockVolume takes name's lock, exclusively or shared, and returns the
// function that releases it.
func (l *locks) lockVolume(ctx context.Context, name volume.Name, exclusive bool) (func(), error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v := l.entry(name)
	if err := l.acquire(ctx, v, exclusive); err != nil {
		l.unref(name, v)
		return nil, fmt.Errorf("waiting for other steps on volume %s: %w", name, err)
	}
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.release(v, exclusive)
		l.unref(name, v)
	}, nil
}

// lockPod takes key's volume lock (exclusively or shared) and then its
// pod lock, and returns the function that releases both.
func (l *locks) lockPod(ctx context.Context, key volume.PodKey, exclusive bool) (func(), error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v := l.entry(key.Volume)
	if err := l.acquire(ctx, v, exclusive); err != nil {
		l.unref(key.Volume, v)
		return nil, fmt.Errorf("waiting for other steps on volume %s: %w", key.Volume, err)
	}
	p, ok := v.pods[key.Pod]
	if !ok {
		p = &podLock{}
		v.pods[key.Pod] = p
	}
	p.refs++
	for p.held {
		if err := l.wait(ctx, v); err != nil {
			l.unrefPod(v, key.Pod, p)
			l.release(v, exclusive)
			l.unref(key.Volume, v)
			return nil, fmt.Errorf("waiting for another step on %s: %w", key, err)
		}
	}
	p.held = true
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		p.held = false
		l.unrefPod(v, key.Pod, p)
		l.release(v, exclusive)
		l.unref(key.Volume, v)
	}, nil
}

// acquire waits until v can be held as asked and takes it; mu must be held.
func (l *locks) acquire(ctx context.Context, v *volumeLock, exclusive bool) error {
	if exclusive {
		v.writersWaiting++
		defer func() { v.writersWaiting-- }()
	}
	for {
		if exclusive && !v.writer && v.readers == 0 {
			v.writer = true
			return nil
		}
		if !exclusive && !v.writer && v.writersWaiting == 0 {
			v.readers++
			return nil
		}
		if err := l.wait(ctx, v); err != nil {
			if exclusive {
				// Readers held back by this waiter may go now.
				v.broadcast()
			}
			return err
		}
	}
}

// release gives up a hold of v taken by acquire; mu must be held.
func (l *locks) release(v *volumeLock, exclusive bool) {
	if exclusive {
		v.writer = false
	} else {
		v.readers--
	}
	v.broadcast()
}

// unrefPod drops one reference of a pod lock; mu must be held.
func (l *locks) unrefPod(v *volumeLock, uid types.UID, p *podLock) {
	p.refs--
	if p.refs == 0 {
		delete(v.pods, uid)
	}
}

// waiters returns how many steps are blocked on name or its pods; for tests.
func (l *locks) waiters(name volume.Name) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if v, ok := l.volumes[name]; ok {
		return v.waiting
	}
	return 0
}

// mapSizes counts the entries of the Operations' maps (locks, the front
// endpoint's request digests, ownership changes in flight); for tests that
// check that they do not grow with the pods and volumes seen.
func (o *Operations) mapSizes() map[string]int {
	o.locks.mu.Lock()
	lockedVolumes := len(o.locks.volumes)
	o.locks.mu.Unlock()
	o.digests.mu.Lock()
	stages, publishes := len(o.digests.stages), len(o.digests.publishes)
	o.digests.mu.Unlock()
	o.owners.mu.Lock()
	runs := len(o.owners.runs)
	o.owners.mu.Unlock()
	return map[string]int{"locks": lockedVolumes, "stageDigests": stages, "publishDigests": publishes, "ownershipRuns": runs}
}
