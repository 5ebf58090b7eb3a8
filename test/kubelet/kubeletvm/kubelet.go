package kubeletvm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	v1core "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	k8smetrics "k8s.io/component-base/metrics"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/kubeletconfig"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
	kubepod "k8s.io/kubernetes/pkg/kubelet/pod"
	kubetypes "k8s.io/kubernetes/pkg/kubelet/types"
	"k8s.io/kubernetes/pkg/kubelet/volumemanager"
	vmmetrics "k8s.io/kubernetes/pkg/kubelet/volumemanager/metrics"
	"k8s.io/kubernetes/pkg/volume/csi"
	volumetypes "k8s.io/kubernetes/pkg/volume/util/types"
	"k8s.io/kubernetes/pkg/volume/util/volumepathhandler"
	"k8s.io/mount-utils"
)

// housekeepingPeriod is the kubelet's (pkg/kubelet/kubelet.go).
const housekeepingPeriod = 2 * time.Second

// Kubelet is the kubelet's volume manager with the kubelet parts around it
// that it needs: the pod config, pod manager, plugin manager, volume
// plugins, and the stand-ins of package doc.
type Kubelet struct {
	cfg    Config
	logger klog.Logger

	mounter      mount.Interface
	broadcaster  record.EventBroadcaster
	recorder     record.EventRecorderLogger
	nodeInformer informers.SharedInformerFactory
	nodeLister   corelisters.NodeLister
	nodeSynced   cache.InformerSynced
	host         *volumeHost
	podManager   kubepod.Manager
	podConfig    *config.PodConfig
	sourcesReady config.SourcesReady
	workers      *podWorkers
	plugins      pluginmanager.PluginManager
	drivers      *driverObserver
	vm           volumemanager.VolumeManager

	// running is set once Run started every loop.
	running atomic.Bool
}

// New wires the kubelet's volume manager as pkg/kubelet/kubelet.go
// NewMainKubelet does, without starting anything.
func New(ctx context.Context, cfg Config) (*Kubelet, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	k := &Kubelet{cfg: cfg, logger: klog.FromContext(ctx)}
	nodeName := types.NodeName(cfg.NodeName)

	// cmd/kubelet/app/server.go: mount.New(""); the event broadcaster.
	k.mounter = mount.New("")
	k.broadcaster = record.NewBroadcaster(record.WithContext(ctx))
	k.recorder = k.broadcaster.NewRecorder(legacyscheme.Scheme, corev1.EventSource{Component: "kubelet", Host: cfg.NodeName})

	// The kubelet's one-node informer (NewMainKubelet).
	k.nodeInformer = informers.NewSharedInformerFactoryWithOptions(cfg.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.Set{metav1.ObjectNameField: cfg.NodeName}.String()
		}))
	k.nodeLister = k.nodeInformer.Core().V1().Nodes().Lister()
	k.nodeSynced = k.nodeInformer.Core().V1().Nodes().Informer().HasSynced

	// The pod config with the API server source (makePodSourceConfig).
	k.podConfig = config.NewPodConfig(k.recorder, noStartupObserver{})
	config.NewSourceApiserver(k.logger, cfg.Client, nodeName, k.nodeSynced,
		k.podConfig.Channel(ctx, kubetypes.ApiserverSource))
	k.sourcesReady = config.NewSourcesReady(k.podConfig.SourcesReadyFn(k.logger))
	k.podManager = kubepod.NewBasicPodManager()

	// The volume plugins (cmd/kubelet/app/plugins.go) on the volume host.
	k.host = newVolumeHost(cfg.Client, nodeName, cfg.RootDir, k.nodeLister, k.recorder, k.mounter)
	if err := k.host.pluginMgr.InitPlugins(probeVolumePlugins(), nil, k.host); err != nil {
		return nil, fmt.Errorf("initializing volume plugins: %w", err)
	}

	k.plugins = pluginmanager.NewPluginManager(cfg.RegistrationDir, k.recorder)
	k.drivers = &driverObserver{PluginHandler: csi.PluginHandler, drivers: map[string]DriverRecord{}}
	k.plugins.AddHandler(registerapi.CSIPlugin, k.drivers)

	k.workers = newPodWorkers(cfg.Kubelet.SyncFrequency.Duration, k.logger.WithName("podworkers"))
	k.vm = volumemanager.NewVolumeManager(
		*cfg.Kubelet.EnableControllerAttachDetach,
		nodeName,
		k.podManager,
		k.workers,
		cfg.Client,
		&k.host.pluginMgr,
		k.mounter,
		k.host.hostUtil,
		k.host.podsDir(),
		k.recorder,
		volumepathhandler.NewBlockVolumePathHandler(),
		nil, // the status manager: only used with the CSIVolumeHealth gate (alpha, off)
		cfg.Kubelet.VolumeStatsAggPeriod.Duration)
	k.workers.vm = k.vm
	return k, nil
}

// createReconstructionCounters creates the counters of the volume
// manager's reconstruction before it runs. Its Run starts the reconciler
// and then registers its metrics, which creates these lazy counters while
// a reconstruction at start may already count into them: a data race in
// the kubelet itself, which made the race-built kubelet-volumes exit after
// a restart with volumes (TestAgentsRestart with -race). Created here, they
// are registered later as before.
func createReconstructionCounters() {
	for _, c := range []*k8smetrics.Counter{
		vmmetrics.ReconstructVolumeOperationsTotal, vmmetrics.ReconstructVolumeOperationsErrorsTotal,
		vmmetrics.ForceCleanedFailedVolumeOperationsTotal, vmmetrics.ForceCleanedFailedVolumeOperationsErrorsTotal,
	} {
		c.Create(nil)
	}
}

// Run creates the kubelet's directories, starts every loop and blocks until
// ctx ends and the pod workers returned. Like the kubelet, it leaves
// everything mounted when it stops.
func (k *Kubelet) Run(ctx context.Context) error {
	if err := k.setupDataDirs(); err != nil {
		return err
	}
	k.broadcaster.StartStructuredLogging(3)
	k.broadcaster.StartRecordingToSink(&v1core.EventSinkImpl{Interface: k.cfg.EventClient.CoreV1().Events("")})
	defer k.broadcaster.Shutdown()

	k.nodeInformer.Start(ctx.Done())
	defer k.nodeInformer.Shutdown()

	createReconstructionCounters()
	var wg sync.WaitGroup
	wg.Go(func() { k.vm.Run(ctx, k.sourcesReady) })
	wg.Go(func() { k.plugins.Run(ctx, k.sourcesReady, ctx.Done()) })
	wg.Go(func() { k.syncLoop(ctx) })
	wg.Go(func() { k.nodeStatusLoop(ctx) })
	k.running.Store(true)
	k.logger.Info("Started the kubelet's volume manager", "node", k.cfg.NodeName, "rootDir", k.cfg.RootDir,
		"registrationDir", k.cfg.RegistrationDir)
	<-ctx.Done()
	wg.Wait()
	k.workers.wait()
	return nil
}

// Ready reports what the kubelet needs before it runs pods with volumes:
// the node informer and every pod source synced, the populator's first
// pass done, the reconciler's states synced (reconstruction after a
// restart), and no storage error (CSINode initialized).
func (k *Kubelet) Ready() error {
	switch {
	case !k.running.Load():
		return errors.New("not started")
	case !k.nodeSynced():
		return errors.New("node informer not synced")
	case !k.sourcesReady.AllReady():
		return errors.New("pod sources not ready")
	case !k.vm.ReconcilerStatesHasBeenSynced():
		return errors.New("volume reconciler states not synced")
	}
	if err := k.host.storageError(); err != nil {
		return fmt.Errorf("storage: %w", err)
	}
	return nil
}

// Pods returns the pod workers' records of the pods they know.
func (k *Kubelet) Pods() []PodRecord { return k.workers.records() }

// Drivers returns the CSI drivers registered through the plugin manager.
func (k *Kubelet) Drivers() []DriverRecord { return k.drivers.list() }

// VolumeManager is the kubelet's volume manager.
func (k *Kubelet) VolumeManager() volumemanager.VolumeManager { return k.vm }

// setupDataDirs makes the kubelet's directories (setupDataDirs), 0750.
func (k *Kubelet) setupDataDirs() error {
	for _, dir := range []string{
		k.cfg.RootDir,
		k.host.podsDir(),
		k.host.pluginsDir(),
		k.cfg.RegistrationDir,
		filepath.Join(k.cfg.RootDir, kubeletconfig.DefaultKubeletPodResourcesDirName),
	} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return fmt.Errorf("creating %s: %w", dir, err)
		}
	}
	return nil
}

// syncLoop stands in for the kubelet's syncLoop as far as pods reach the
// volume manager: each config update is handled as HandlePodAdditions
// (sorted by creation time, added to the pod manager, handed to the pod
// worker), HandlePodUpdates (also for DELETE, a graceful deletion),
// HandlePodRemoves and HandlePodReconcile do it; every housekeepingPeriod,
// once the sources are ready, housekeeping runs. Admission, mirror pods,
// probes and the PLEG are not part of it.
func (k *Kubelet) syncLoop(ctx context.Context) {
	housekeeping := time.NewTicker(housekeepingPeriod)
	defer housekeeping.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case u := <-k.podConfig.Updates():
			k.sourcesReady.AddSource(u.Source)
			now := time.Now()
			switch u.Op {
			case kubetypes.ADD:
				pods := append([]*corev1.Pod(nil), u.Pods...)
				sort.SliceStable(pods, func(i, j int) bool {
					return pods[i].CreationTimestamp.Before(&pods[j].CreationTimestamp)
				})
				for _, pod := range pods {
					k.podManager.AddPod(pod)
					k.workers.update(ctx, pod, now)
				}
			case kubetypes.UPDATE, kubetypes.DELETE:
				for _, pod := range u.Pods {
					k.podManager.UpdatePod(pod)
					k.workers.update(ctx, pod, now)
				}
			case kubetypes.REMOVE:
				for _, pod := range u.Pods {
					k.podManager.RemovePod(pod)
					k.workers.remove(pod, now)
				}
			case kubetypes.RECONCILE:
				for _, pod := range u.Pods {
					k.podManager.UpdatePod(pod)
				}
			}
		case <-housekeeping.C:
			if k.sourcesReady.AllReady() {
				k.housekeeping()
			}
		}
	}
}

// housekeeping is the volume part of the kubelet's HandlePodCleanups: the
// pod workers' SyncKnownPods, then cleanupOrphanedPodDirs: every pod
// directory on disk whose pod is neither in the pod manager nor known to a
// pod worker, and whose volumes are neither possibly mounted in the
// volume manager nor mount points on disk, is removed without crossing a
// file system boundary.
func (k *Kubelet) housekeeping() {
	k.workers.syncKnownPods()
	entries, err := os.ReadDir(k.host.podsDir())
	if err != nil {
		k.logger.Error(err, "Listing pods from disk")
		return
	}
	for _, e := range entries {
		uid := types.UID(e.Name())
		if _, ok := k.podManager.GetPodByUID(uid); ok || k.workers.known(uid) {
			continue
		}
		if k.vm.HasPossiblyMountedVolumesForPod(volumetypes.UniquePodName(uid)) || k.mountedOnDisk(uid) {
			continue
		}
		if err := removeOrphanedPodDir(k.mounter, filepath.Join(k.host.podsDir(), e.Name())); err != nil {
			k.logger.V(3).Info("Orphaned pod found, but not removed", "podUID", uid, "err", err)
		}
	}
}

// mountedOnDisk is getMountedVolumePathListFromDisk: is any
// pods/<uid>/volumes/<plugin>/<volume> a mount point (or unreadable)?
func (k *Kubelet) mountedOnDisk(uid types.UID) bool {
	volumesDir := filepath.Join(k.host.podDir(uid), kubeletconfig.DefaultKubeletVolumesDirName)
	plugins, err := os.ReadDir(volumesDir)
	if err != nil {
		return !os.IsNotExist(err)
	}
	for _, p := range plugins {
		vols, err := os.ReadDir(filepath.Join(volumesDir, p.Name()))
		if err != nil {
			return true
		}
		for _, v := range vols {
			notMount, err := k.mounter.IsLikelyNotMountPoint(filepath.Join(volumesDir, p.Name(), v.Name()))
			if err != nil || !notMount {
				return true
			}
		}
	}
	return false
}

// noStartupObserver stands in for the kubelet's pod startup latency
// tracker, which only feeds a metric.
type noStartupObserver struct{}

func (noStartupObserver) ObservedPodOnWatch(klog.Logger, *corev1.Pod, time.Time) {}
