package registry

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/driver/nodeinfo"
)

const (
	// notifyTimeout bounds NotifyRegistrationStatus, which is best effort.
	notifyTimeout = 5 * time.Second
	// probeTimeout bounds the health check of a driver that a second
	// registration wants to replace.
	probeTimeout = 2 * time.Second
)

// sync brings one registration socket's state in line with the file system:
// a socket that exists is registered, one that is gone is deregistered.
func (r *Registry) sync(ctx context.Context, socket string) error {
	fi, err := os.Lstat(socket)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return r.deregister(ctx, socket)
	case err != nil:
		return fmt.Errorf("stat registration socket: %w", err)
	case fi.Mode()&os.ModeSocket == 0:
		// Replaced by something that is not a socket: whatever registered
		// through it is gone.
		return r.deregister(ctx, socket)
	}
	return r.register(ctx, socket)
}

func (r *Registry) register(ctx context.Context, socket string) error {
	logger := klog.FromContext(ctx).WithValues("socket", socket)
	hctx, cancel := context.WithTimeout(ctx, r.cfg.HandshakeTimeout)
	defer cancel()

	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return r.reject(ctx, logger, nil, socket, "", fmt.Errorf("dial registration socket: %w", err))
	}
	defer func() { _ = conn.Close() }()
	registrar := registerapi.NewRegistrationClient(conn)

	info, err := registrar.GetInfo(hctx, &registerapi.InfoRequest{})
	if err != nil {
		// Nobody answers: nobody to notify either.
		return r.reject(ctx, logger, nil, socket, "", fmt.Errorf("GetInfo on registration socket: %w", err))
	}
	cand, err := ValidateInfo(info)
	if err == nil {
		err = CheckEndpoint(cand.Endpoint)
	}
	if err != nil {
		return r.reject(ctx, logger, registrar, socket, cand.Name, err)
	}
	logger = logger.WithValues("driver", cand.Name, "endpoint", cand.Endpoint, "version", cand.Version.String())

	r.nameLocks.LockKey(cand.Name)
	defer func() { _ = r.nameLocks.UnlockKey(cand.Name) }()

	if err := r.checkReplace(hctx, cand, socket); err != nil {
		return r.reject(ctx, logger, registrar, socket, cand.Name, err)
	}
	d, err := r.connect(ctx, hctx, cand, socket)
	if err != nil {
		return r.reject(ctx, logger, registrar, socket, cand.Name, err)
	}
	if r.cfg.NodeInfo != nil {
		err := r.cfg.NodeInfo.Install(hctx, nodeinfo.DriverInfo{
			Name: d.Name, NodeID: d.NodeID, MaxVolumes: d.MaxVolumes, Topology: d.Topology,
		})
		if err != nil {
			_ = d.Client.Close()
			return r.reject(ctx, logger, registrar, socket, cand.Name, fmt.Errorf("publish node info: %w", err))
		}
	}
	if old := r.commit(d); old != nil {
		r.retire(old.Client)
	}
	notifyRegistrar(ctx, logger, registrar, nil)
	logger.Info("Registered CSI driver", "nodeID", d.NodeID, "maxVolumes", d.MaxVolumes, "topology", d.Topology)
	r.notify(Event{Type: Registered, Driver: d.Name, Socket: socket})
	return nil
}

// checkReplace enforces that a second registration of a driver name through
// another socket is accepted only at a higher version, or when the driver
// registered first is no longer healthy. A registration through the same
// socket is a re-registration (the registrar restarted) and always accepted.
func (r *Registry) checkReplace(ctx context.Context, cand Candidate, socket string) error {
	r.mu.RLock()
	existing := r.drivers[cand.Name]
	r.mu.RUnlock()
	if existing == nil || existing.RegistrationSocket == socket || cand.Version.GreaterThan(existing.version) {
		return nil
	}
	if !healthy(ctx, existing) {
		return nil
	}
	return fmt.Errorf("%w: driver %q is already registered through %s at version %s, equal to or higher than the offered %s",
		ErrInvalidRegistration, cand.Name, existing.RegistrationSocket, existing.Version, cand.Version)
}

// healthy says whether a registered driver still has its registration socket
// and answers Probe.
func healthy(ctx context.Context, d *Driver) bool {
	if fi, err := os.Lstat(d.RegistrationSocket); err != nil || fi.Mode()&os.ModeSocket == 0 {
		return false
	}
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	_, err := d.Client.Probe(pctx)
	return err == nil
}

// connect opens the driver's persistent connection and asks for its node
// info; ctx bounds the handshake, life is the registry's run (a reconnection
// is confirmed within it).
func (r *Registry) connect(life, ctx context.Context, cand Candidate, socket string) (*Driver, error) {
	client, err := csiclient.New(ctx, csiclient.Config{
		DriverName: cand.Name,
		Endpoint:   cand.Endpoint,
		Timeout:    r.cfg.CSITimeout,
		Metrics:    r.cfg.Metrics,
		OnReconnect: func(c *csiclient.Client) {
			go r.reconnected(life, cand.Name, socket, c)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("connect to driver endpoint: %w", err)
	}
	info, err := client.NodeGetInfo(ctx)
	if err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("NodeGetInfo: %w", err)
	}
	if info.GetNodeId() == "" {
		_ = client.Close()
		return nil, fmt.Errorf("%w: NodeGetInfo returned an empty node ID", ErrInvalidRegistration)
	}
	return &Driver{
		Name:               cand.Name,
		Endpoint:           cand.Endpoint,
		Version:            cand.Version.String(),
		SupportedVersions:  cand.SupportedVersions,
		NodeID:             info.GetNodeId(),
		MaxVolumes:         info.GetMaxVolumesPerNode(),
		Topology:           info.GetAccessibleTopology().GetSegments(),
		RegistrationSocket: socket,
		RegisteredAt:       time.Now(),
		Client:             client,
		version:            cand.Version,
	}, nil
}

// commit makes d the registration of its name and returns the one it replaces.
// Only the socket of the newest registration deregisters the driver when it
// goes, as in the kubelet.
func (r *Registry) commit(d *Driver) *Driver {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.drivers[d.Name]
	if old != nil && old.RegistrationSocket != d.RegistrationSocket {
		delete(r.owners, old.RegistrationSocket)
	}
	r.drivers[d.Name] = d
	r.owners[d.RegistrationSocket] = d.Name
	return old
}

// deregister removes the driver that registered through socket, if it is
// still the current registration of its name.
func (r *Registry) deregister(ctx context.Context, socket string) error {
	r.mu.RLock()
	name, ok := r.owners[socket]
	r.mu.RUnlock()
	if !ok {
		return nil
	}
	r.nameLocks.LockKey(name)
	defer func() { _ = r.nameLocks.UnlockKey(name) }()
	logger := klog.FromContext(ctx).WithValues("socket", socket, "driver", name)

	r.mu.Lock()
	if r.owners[socket] != name {
		r.mu.Unlock()
		return nil
	}
	current := r.drivers[name]
	if current != nil && current.RegistrationSocket != socket {
		// Re-registered through another socket meanwhile: nothing to remove.
		delete(r.owners, socket)
		r.mu.Unlock()
		return nil
	}
	if current != nil {
		delete(r.drivers, name)
	}
	r.mu.Unlock()

	if current != nil {
		r.retire(current.Client)
		logger.Info("Deregistered CSI driver: its registration socket is gone")
		r.notify(Event{Type: Deregistered, Driver: name, Socket: socket})
	}
	if r.cfg.NodeInfo != nil {
		if err := r.cfg.NodeInfo.Uninstall(ctx, name); err != nil {
			// owners keeps the socket, so the retry uninstalls again.
			logger.Error(err, "Removing the deregistered driver's node info failed; will retry")
			return fmt.Errorf("remove node info of driver %q: %w", name, err)
		}
	}
	r.mu.Lock()
	if r.owners[socket] == name {
		delete(r.owners, socket)
	}
	r.mu.Unlock()
	return nil
}

// reject logs one clear line, tells the registrar (when it answered), informs
// observers and returns err so that the socket is retried with backoff.
func (r *Registry) reject(ctx context.Context, logger logr.Logger, registrar registerapi.RegistrationClient, socket, name string, err error) error {
	logger.Error(err, "CSI driver registration failed; will retry with backoff")
	if registrar != nil {
		notifyRegistrar(ctx, logger, registrar, err)
	}
	r.notify(Event{Type: Rejected, Driver: name, Socket: socket, Err: err})
	return err
}

func notifyRegistrar(ctx context.Context, logger logr.Logger, registrar registerapi.RegistrationClient, regErr error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), notifyTimeout)
	defer cancel()
	status := &registerapi.RegistrationStatus{PluginRegistered: regErr == nil}
	if regErr != nil {
		status.Error = regErr.Error()
	}
	if _, err := registrar.NotifyRegistrationStatus(ctx, status); err != nil {
		logger.V(2).Info("NotifyRegistrationStatus failed", "err", err)
	}
}
