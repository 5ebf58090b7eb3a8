package localattach

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// Wrap returns inner with attach and detach added: WaitForAttach first
// attaches the volume (Attach), then lets inner check it through Get as it
// would check a VolumeAttachment; a successful Unstage releases the volume
// for detach (Release). The other steps are inner's. The reconciler runs
// the result exactly as it runs inner.
func (a *Attacher) Wrap(inner Steps) Steps { return &steps{Steps: inner, a: a} }

type steps struct {
	Steps
	a *Attacher
}

// WaitForAttach attaches the volume, then checks it with the wrapped step.
func (s *steps) WaitForAttach(ctx context.Context, name volume.Name, src volume.Source) error {
	// A failed attach is reported by Get as status.attachError, which the
	// wrapped step records in the actual state, where status shows it.
	_ = s.a.Attach(ctx, name, src)
	err := s.Steps.WaitForAttach(ctx, name, src)
	s.a.dropFailed(name)
	return err
}

// Unstage unstages the volume with the wrapped step and, once it is gone,
// releases it for detach.
func (s *steps) Unstage(ctx context.Context, name volume.Name) error {
	if err := s.Steps.Unstage(ctx, name); err != nil {
		return err
	}
	s.a.Release(name)
	return nil
}

// Release schedules the detach of a volume the lifecycle no longer holds.
// The detach happens only if the volume is still not in use then.
func (a *Attacher) Release(name volume.Name) { a.detaches.Add(name) }

// DriverRegistered retries now the pending detaches of a driver that
// (re-)registered.
func (a *Attacher) DriverRegistered(driver string) {
	a.mu.Lock()
	var names []volume.Name
	for _, st := range a.states {
		if st.driver == driver && st.recorded {
			names = append(names, st.volume)
		}
	}
	a.mu.Unlock()
	for _, n := range names {
		a.detaches.Forget(n)
		a.detaches.Add(n)
	}
}

// Run detaches released volumes until ctx ends. Once the desired state has
// synced it also goes through the attachments recorded by an earlier run
// and detaches those no longer in use. An attachment whose detach fails is
// retried with backoff; its record stays until it succeeds, also across
// restarts.
func (a *Attacher) Run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("localattach")
	ctx = klog.NewContext(ctx, logger)
	defer a.detaches.ShutDown()
	select {
	case <-ctx.Done():
		return
	case <-a.cfg.Synced:
	}
	a.mu.Lock()
	for _, st := range a.states {
		if st.recorded {
			a.detaches.Add(st.volume)
		}
	}
	a.mu.Unlock()
	go func() {
		<-ctx.Done()
		a.detaches.ShutDown()
	}()
	for {
		name, shutdown := a.detaches.Get()
		if shutdown || ctx.Err() != nil {
			return
		}
		if err := a.detach(ctx, name); err != nil {
			if ctx.Err() == nil {
				logger.Error(err, "Detach failed; will retry", "volume", name)
				a.detaches.AddRateLimited(name)
			}
		} else {
			a.detaches.Forget(name)
		}
		a.detaches.Done(name)
	}
}

// detach calls ControllerUnpublishVolume for a recorded attachment that is
// not in use, then removes its record. NotFound from the driver means the
// volume or node is gone: detached.
func (a *Attacher) detach(ctx context.Context, name volume.Name) error {
	a.mu.Lock()
	vaName, ok := a.byVolume[name]
	a.mu.Unlock()
	if !ok {
		return nil
	}
	a.locks.LockKey(vaName)
	defer func() { _ = a.locks.UnlockKey(vaName) }()
	if a.cfg.InUse(name) {
		// Wanted again: WaitForAttach attaches it (again).
		klog.FromContext(ctx).V(4).Info("Not detaching a volume in use", "volume", name)
		return nil
	}
	a.mu.Lock()
	st := a.states[vaName]
	if st == nil || !st.recorded {
		// Attached without a call (no PUBLISH_UNPUBLISH_VOLUME): nothing to undo.
		a.forgetLocked(vaName, name)
		a.mu.Unlock()
		return nil
	}
	// From here on the volume counts as detached: its publish_context is
	// not to be used any more, whatever the call's outcome.
	st.attached, st.publishContext = false, nil
	a.mu.Unlock()

	rec, err := a.records.read(vaName)
	if errors.Is(err, fs.ErrNotExist) {
		a.forget(vaName, name)
		return nil
	}
	if err != nil {
		return err
	}
	logger := klog.FromContext(ctx).WithValues("volume", name, "driver", rec.Driver)
	client, _, err := a.driver(rec.Driver)
	if err != nil {
		return fmt.Errorf("%w (DriverRegistered retries the detach)", err)
	}
	secrets, err := a.secrets(ctx, rec.Secret)
	if err != nil {
		return err
	}
	err = client.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{
		VolumeId: rec.Handle, NodeId: rec.NodeID, Secrets: secrets,
	})
	if err != nil && !csiclient.IsAlreadyDone(err) {
		return err
	}
	if err := a.records.remove(vaName); err != nil {
		return err
	}
	a.forget(vaName, name)
	logger.V(2).Info("Volume detached", "nodeID", rec.NodeID)
	return nil
}

// dropFailed forgets a failed attach that never reached the driver (no
// record): its error is in the actual state by now, and keeping it would
// hold an entry for every volume that was never attached.
func (a *Attacher) dropFailed(name volume.Name) {
	a.mu.Lock()
	defer a.mu.Unlock()
	vaName, ok := a.byVolume[name]
	if !ok {
		return
	}
	if st := a.states[vaName]; st != nil && !st.attached && !st.recorded {
		a.forgetLocked(vaName, name)
	}
}

func (a *Attacher) forget(vaName string, name volume.Name) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.forgetLocked(vaName, name)
}

func (a *Attacher) forgetLocked(vaName string, name volume.Name) {
	delete(a.states, vaName)
	if a.byVolume[name] == vaName {
		delete(a.byVolume, name)
	}
}
