package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/paths"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
	"github.com/csi-volmgr/csi-volmgr/test/agent/agenttest"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

const (
	// nodeName is the Node the agent registers and serves.
	nodeName = "chaos-node"
	// namespace holds the workload's pods and claims.
	namespace = "chaos"
	// rootSize is the size of the tmpfs that is the agent's root directory: small, so that the
	// disk-full nemesis can fill it.
	rootSize = "16m"
	// volumeSize is the size of every persistent volume.
	volumeSize = 16 << 20
	// apiTimeout bounds one request of the harness to the API server.
	apiTimeout = 10 * time.Second
	// agentStartTimeout bounds an agent start (it serves /healthz only once the API server
	// answers, since it registers its Node first).
	agentStartTimeout = 3 * time.Minute
)

// Driver roles: the three plugins and the CSIDriver objects of the run.
const (
	// roleStage stages and publishes; no attach. Filesystem (shared and single) and block volumes.
	roleStage = "stage"
	// roleAttach stages and publishes after ControllerPublishVolume (attachRequired).
	roleAttach = "attach"
	// roleDirect has no stage step; persistent volumes and CSI inline volumes.
	roleDirect = "direct"
)

// driverPlugin is one CSI test plugin of the run.
type driverPlugin struct {
	role string
	name string
	caps plugin.Capabilities
	*plugintest.Plugin
	tail *tail

	// mu serializes kill and restart with the harness's own CSI calls and fault changes.
	mu sync.Mutex
}

// Harness is one chaos run: a real API server, the agent binary, three CSI test plugins, the
// workload, the nemeses and the checks.
type Harness struct {
	cfg     Config
	env     *k8stest.Env
	client  kubernetes.Interface
	agent   *agenttest.Agent
	plugins map[string]*driverPlugin
	roles   []string
	layout  paths.Layout
	checker *Checker
	stats   *Stats
	vols    *volumePool
	pods    *podSet
	started time.Time

	// apiDown is set while the API server is stopped; apiBack holds when the last outage ended
	// (a time.Time).
	apiDown atomic.Bool
	apiBack atomic.Value
	// faults are the nemesis faults on the plugins and the node in effect.
	faults faultSet
	// agentMu serializes kills and restarts of the agent; killed holds the PIDs the harness
	// killed (their exits are inflicted), stopping is set at the end.
	agentMu  sync.Mutex
	killed   map[int]bool
	stopping bool
	// hangs counts the "hang" faults the journals showed, for the kill-inside-a-step nemesis.
	hangs atomic.Int64
	// pumpMu serializes journal reads.
	pumpMu sync.Mutex
	// logDir receives the logs; logsSaved is set once they are.
	logDir    string
	logsSaved bool
}

// New sets up a run: etcd and kube-apiserver, the agent's root directory on a small tmpfs,
// the plugins, their CSIDriver objects, the volumes with their PVs and claims. Close undoes it.
func New(ctx context.Context, cfg Config) (*Harness, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	h := &Harness{
		cfg:     cfg,
		plugins: map[string]*driverPlugin{},
		roles:   []string{roleStage, roleAttach, roleDirect},
		checker: NewChecker(5 * time.Second),
		stats:   newStats(cfg),
		pods:    newPodSet(),
		killed:  map[int]bool{},
	}
	h.checker.OnViolation = func(v Violation) {
		detail := v.Detail
		if len(detail) > 600 {
			detail = detail[:600] + "…"
		}
		h.logf("chaos: VIOLATION %s at %s: %s", v.Invariant, stamp(v.Time), detail)
	}
	if err := h.setUp(ctx); err != nil {
		return nil, errors.Join(err, h.Close())
	}
	return h, nil
}

func (h *Harness) logf(format string, args ...any) {
	_, _ = fmt.Fprintf(h.cfg.Log, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func (h *Harness) setUp(ctx context.Context) error {
	h.logf("chaos: seed %d; starting etcd and kube-apiserver", h.cfg.Seed)
	env, err := k8stest.Start(k8stest.Options{})
	if err != nil {
		return err
	}
	h.env = env
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst, cfg.Timeout = 200, 400, apiTimeout
	if h.client, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	if _, err := h.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace: %w", err)
	}

	if h.agent, err = agenttest.Prepare(agenttest.Options{
		KubeConfig: env.KubeConfig, NodeName: nodeName, CSITimeout: h.cfg.CSITimeout,
		Verbosity: h.cfg.AgentVerbosity, ExtraArgs: []string{"--register-node"},
	}); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", h.agent.RootDir, "tmpfs", 0, "size="+rootSize+",mode=0750"); err != nil {
		return fmt.Errorf("mount a tmpfs at the agent's root %s: %w", h.agent.RootDir, err)
	}
	if err := os.MkdirAll(h.agent.RegistrationDir, 0o750); err != nil {
		return err
	}
	if h.layout, err = paths.New(h.agent.RootDir); err != nil {
		return err
	}

	for _, role := range h.roles {
		if err := h.startPlugin(ctx, role); err != nil {
			return err
		}
	}
	if h.vols, err = h.createVolumes(ctx, rand.New(rand.NewPCG(h.cfg.Seed, 1))); err != nil {
		return err
	}
	h.logf("chaos: %d volumes; starting the agent (%s)", len(h.vols.all), h.agent.LogFile)
	if err := h.startAgent(ctx); err != nil {
		return err
	}
	return h.waitAgentReady(ctx, time.Minute)
}

// driverName is the CSI driver name of a role.
func driverName(role string) string { return role + ".chaos.csi-volmgr.io" }

func (h *Harness) startPlugin(ctx context.Context, role string) error {
	name := driverName(role)
	caps := plugin.Capabilities{StageUnstage: role != roleDirect, ControllerPublish: role == roleAttach}
	csiDriver := &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: storagev1.CSIDriverSpec{
			AttachRequired: ptr.To(role == roleAttach),
			PodInfoOnMount: ptr.To(role == roleDirect),
		},
	}
	if role == roleDirect {
		csiDriver.Spec.VolumeLifecycleModes = []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent, storagev1.VolumeLifecycleEphemeral}
	}
	if _, err := h.client.StorageV1().CSIDrivers().Create(ctx, csiDriver, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create CSIDriver %s: %w", name, err)
	}
	p, err := plugintest.Launch(ctx, plugintest.Options{
		Name: name, NodeID: nodeName, Capabilities: &caps, RegistrationDir: h.agent.RegistrationDir, Verbosity: 2,
	})
	if err != nil {
		return err
	}
	h.plugins[role] = &driverPlugin{role: role, name: name, caps: caps, Plugin: p, tail: newTail(p.JournalPath)}
	return nil
}

// createVolume creates a volume in a plugin, as an external provisioner would.
func (dp *driverPlugin) createVolume(ctx context.Context, name string, block bool) (string, error) {
	conn, err := dp.Dial()
	if err != nil {
		return "", err
	}
	defer func() { _ = conn.Close() }()
	c := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER}}
	if block {
		c.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
	} else {
		c.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}
	}
	resp, err := csi.NewControllerClient(conn).CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: name, VolumeCapabilities: []*csi.VolumeCapability{c},
		CapacityRange: &csi.CapacityRange{RequiredBytes: volumeSize},
	})
	if err != nil {
		return "", fmt.Errorf("CreateVolume %s in %s: %w", name, dp.name, err)
	}
	return resp.GetVolume().GetVolumeId(), nil
}

// createClaim creates a PV for the volume and a claim bound to it, as the PV controller (which
// does not run here) would leave them.
func (h *Harness) createClaim(ctx context.Context, v *poolVolume) error {
	size := resource.MustParse("16Mi")
	mode := corev1.ReadWriteOnce
	if v.shared {
		mode = corev1.ReadWriteMany
	}
	volumeMode := corev1.PersistentVolumeFilesystem
	if v.block {
		volumeMode = corev1.PersistentVolumeBlock
	}
	pvc, err := h.client.CoreV1().PersistentVolumeClaims(namespace).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: v.claim, Namespace: namespace},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{mode},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
			VolumeName:       v.pvName,
			StorageClassName: ptr.To(""),
			VolumeMode:       &volumeMode,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create PVC %s: %w", v.claim, err)
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: v.pvName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{mode},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			VolumeMode:                    &volumeMode,
			ClaimRef: &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1",
				Namespace: namespace, Name: v.claim, UID: pvc.UID},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: v.key.Driver, VolumeHandle: v.key.Handle}},
		},
	}
	pv, err = h.client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create PV %s: %w", v.pvName, err)
	}
	pv.Status.Phase = corev1.VolumeBound
	if _, err := h.client.CoreV1().PersistentVolumes().UpdateStatus(ctx, pv, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("bind PV %s: %w", v.pvName, err)
	}
	pvc.Status.Phase = corev1.ClaimBound
	pvc.Status.AccessModes = []corev1.PersistentVolumeAccessMode{mode}
	pvc.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: size}
	if _, err := h.client.CoreV1().PersistentVolumeClaims(namespace).UpdateStatus(ctx, pvc, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("bind PVC %s: %w", v.claim, err)
	}
	return nil
}

// stagingPath is the layout's staging path of a persistent volume.
func (h *Harness) stagingPath(v *poolVolume) string {
	access := volume.Filesystem
	if v.block {
		access = volume.Block
	}
	st, err := h.layout.Staging(volume.ID{Driver: v.key.Driver, Handle: v.key.Handle, PVName: v.pvName, AccessType: access})
	if err != nil {
		panic(fmt.Sprintf("chaos: staging path of %s: %v", v.key, err))
	}
	return st.Path
}

// startAgent starts the agent and waits until it serves /healthz.
func (h *Harness) startAgent(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, agentStartTimeout)
	defer cancel()
	return h.agent.Start(ctx)
}

// waitAgentReady waits until the agent answers /readyz with 200 and every driver is registered.
func (h *Harness) waitAgentReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := h.agent.WaitReady(ctx); err != nil {
		return err
	}
	for {
		drivers, err := h.agent.Drivers(ctx)
		if err == nil && len(drivers) == len(h.plugins) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("drivers registered with the agent: %v (last error: %w): %w", drivers, err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Close stops the agent and the plugins, unmounts what is left and stops the API server. The
// logs are saved to the log directory Run was given first, if Run did not get to it.
func (h *Harness) Close() error {
	var errs []error
	if h.logDir != "" && !h.logsSaved && h.agent != nil {
		errs = append(errs, h.saveLogs(h.logDir))
	}
	h.agentMu.Lock()
	h.stopping = true
	h.agentMu.Unlock()
	if h.agent != nil {
		if err := h.agent.Process.Close(); err != nil {
			errs = append(errs, fmt.Errorf("stop agent: %w", err))
		}
	}
	for _, role := range h.roles {
		if dp := h.plugins[role]; dp != nil {
			if err := dp.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close plugin %s: %w", dp.name, err))
			}
		}
	}
	if h.agent != nil {
		if err := h.agent.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close agent: %w", err))
		}
	}
	if h.env != nil {
		if err := h.env.StartAPIServer(); err != nil {
			errs = append(errs, err)
		}
		if err := h.env.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// AgentLog is the agent's log file.
func (h *Harness) AgentLog() string {
	if h.agent == nil {
		return ""
	}
	return h.agent.LogFile
}

// PluginLogs lists the plugins' log files.
func (h *Harness) PluginLogs() []string {
	var out []string
	for _, role := range h.roles {
		if dp := h.plugins[role]; dp != nil {
			out = append(out, dp.LogFile)
		}
	}
	return out
}
