package agent_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/mount-utils"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/test/agent/agenttest"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

func TestMain(m *testing.M) {
	// Build the agent and the plugin while the API server starts; the tests
	// that need them wait for the builds.
	go func() { _, _ = agenttest.Binary() }()
	go func() { _, _ = plugintest.Binary() }()
	k8stest.Main(m, k8stest.Options{})
}

// waitTimeout bounds every wait of these tests: for a journal entry, a
// status the agent reports, a pod condition.
const waitTimeout = 60 * time.Second

// conditionVolumesReady is the pod condition the agent writes.
const conditionVolumesReady corev1.PodConditionType = "csi-volmgr.io/VolumesReady"

// node is one test's node: an API server namespace and Node, a CSIDriver
// object, the test plugin registered through the agent's registration
// directory, and the agent (not started yet).
type node struct {
	f      *k8stest.Fixture
	agent  *agenttest.Agent
	plugin *plugintest.Plugin
	driver string
	began  time.Time
}

// logStep logs how far the test got and when, for reading a slow run.
func (n *node) logStep(t *testing.T, what string) {
	t.Helper()
	t.Logf("%6.2fs %s", time.Since(n.began).Seconds(), what)
}

// nodeOptions tunes newNode.
type nodeOptions struct {
	// kubeConfig replaces the API server's kubeconfig for the agent.
	kubeConfig []byte
	// csiTimeout is the agent's --csi-timeout; 0 keeps its default.
	csiTimeout time.Duration
	// registerNode runs the agent with --register-node: it creates the
	// Node, which the test does not.
	registerNode bool
	// verbosity is the agent's -v; 0 keeps agenttest's default.
	verbosity int
	// extraArgs are more arguments of the agent's run.
	extraArgs []string
	// csiDriver, when set, changes the CSIDriver object before it is
	// created (e.g. to allow inline volumes).
	csiDriver func(*storagev1.CSIDriverSpec)
	// agentBinary is the csi-volmgr binary to run; "" builds this checkout.
	agentBinary string
}

// newNode prepares a node for t; the agent still has to be started.
func newNode(t *testing.T, opts nodeOptions) *node {
	t.Helper()
	began := time.Now()
	f := k8stest.New(t)
	extraArgs := slices.Clone(opts.extraArgs)
	if opts.registerNode {
		extraArgs = append(extraArgs, "--register-node")
		t.Cleanup(func() {
			ctx := context.WithoutCancel(t.Context())
			_ = f.Client.CoreV1().Nodes().Delete(ctx, f.NodeName, metav1.DeleteOptions{})
			_ = f.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Delete(ctx, f.NodeName, metav1.DeleteOptions{})
		})
	} else {
		f.CreateNode(t)
	}
	// A driver of its own per test: CSIDriver objects are cluster-wide.
	driver := "agent-" + utilrand.String(6) + ".csi-volmgr.io"
	csiDriver := &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: driver},
		Spec: storagev1.CSIDriverSpec{
			AttachRequired: ptr.To(false),
			PodInfoOnMount: ptr.To(false),
		},
	}
	if opts.csiDriver != nil {
		opts.csiDriver(&csiDriver.Spec)
	}
	if _, err := f.Client.StorageV1().CSIDrivers().Create(t.Context(), csiDriver, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating CSIDriver %s: %v", driver, err)
	}
	t.Cleanup(func() {
		_ = f.Client.StorageV1().CSIDrivers().Delete(context.WithoutCancel(t.Context()), driver, metav1.DeleteOptions{})
	})
	kubeConfig := opts.kubeConfig
	if kubeConfig == nil {
		kubeConfig = f.Env.KubeConfig
	}
	a := agenttest.New(t, agenttest.Options{KubeConfig: kubeConfig, NodeName: f.NodeName, CSITimeout: opts.csiTimeout,
		Verbosity: opts.verbosity, ExtraArgs: extraArgs, Binary: opts.agentBinary})
	// The agent's directory exists before the plugin starts, so the plugin's
	// cleanup (unmount everything of its volumes) runs before it is removed.
	p := plugintest.Start(t, plugintest.Options{Name: driver, NodeID: f.NodeName, RegistrationDir: a.RegistrationDir})
	return &node{f: f, agent: a, plugin: p, driver: driver, began: began}
}

// startAgent starts the agent and waits until it is ready and has
// registered the plugin.
func (n *node) startAgent(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	if err := n.agent.Start(ctx); err != nil {
		t.Fatal(err)
	}
	n.waitReady(t)
	n.waitDriverRegistered(t)
}

func (n *node) waitReady(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	if err := n.agent.WaitReady(ctx); err != nil {
		t.Fatalf("agent not ready: %v", err)
	}
}

func (n *node) waitDriverRegistered(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	err := pollUntil(ctx, func() bool {
		drivers, err := n.agent.Drivers(ctx)
		return err == nil && slices.ContainsFunc(drivers, func(d volumemanager.DriverStatus) bool { return d.Name == n.driver })
	})
	if err != nil {
		t.Fatalf("driver %s not registered with the agent: %v", n.driver, err)
	}
}

// createVolume creates a filesystem volume in the plugin and returns its handle.
func (n *node) createVolume(t *testing.T, name string) string {
	t.Helper()
	return n.createVolumeWithParameters(t, name, nil)
}

// createVolumeWithParameters creates a filesystem volume in the plugin with
// the CreateVolume parameters (e.g. plugin.FuseParameter) and returns its
// handle.
func (n *node) createVolumeWithParameters(t *testing.T, name string, parameters map[string]string) string {
	t.Helper()
	conn, err := n.plugin.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	resp, err := csi.NewControllerClient(conn).CreateVolume(t.Context(), &csi.CreateVolumeRequest{
		Name: name,
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER},
		}},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 16 << 20},
		Parameters:    parameters,
	})
	if err != nil {
		t.Fatalf("CreateVolume %s: %v", name, err)
	}
	return resp.GetVolume().GetVolumeId()
}

// claimedVolume is a plugin volume with its PV and a claim bound to it.
type claimedVolume struct {
	handle, pvName, claim string
}

// createClaimedVolume creates a plugin volume, its PV and a claim bound to
// it (as the PV controller would bind them; envtest runs no controllers).
func (n *node) createClaimedVolume(t *testing.T, name string) claimedVolume {
	t.Helper()
	return n.createClaimedVolumeWith(t, name, nil)
}

// createClaimedVolumeWith is createClaimedVolume with mutate applied to
// the PV before it is created.
func (n *node) createClaimedVolumeWith(t *testing.T, name string, mutate func(*corev1.PersistentVolume)) claimedVolume {
	t.Helper()
	return n.claimVolume(t, name, n.createVolume(t, name), mutate)
}

// claimVolume creates the PV of the plugin volume handle and a claim bound
// to it, with mutate applied to the PV before it is created.
func (n *node) claimVolume(t *testing.T, name, handle string, mutate func(*corev1.PersistentVolume)) claimedVolume {
	t.Helper()
	ctx := t.Context()
	pvName := n.f.Namespace + "-" + name
	claim := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: n.f.Namespace, Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("16Mi")}},
			VolumeName:  pvName,
		},
	}
	claim, err := n.f.Client.CoreV1().PersistentVolumeClaims(n.f.Namespace).Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating PVC %s: %v", name, err)
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:    corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("16Mi")},
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			ClaimRef: &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1",
				Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: n.driver, VolumeHandle: handle}},
		},
	}
	if mutate != nil {
		mutate(pv)
	}
	pv, err = n.f.Client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating PV %s: %v", pvName, err)
	}
	t.Cleanup(func() {
		_ = n.f.Client.CoreV1().PersistentVolumes().Delete(context.WithoutCancel(ctx), pvName, metav1.DeleteOptions{})
	})
	pv.Status.Phase = corev1.VolumeBound
	if _, err := n.f.Client.CoreV1().PersistentVolumes().UpdateStatus(ctx, pv, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("binding PV %s: %v", pvName, err)
	}
	claim.Status.Phase = corev1.ClaimBound
	if _, err := n.f.Client.CoreV1().PersistentVolumeClaims(n.f.Namespace).UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("binding PVC %s: %v", name, err)
	}
	return claimedVolume{handle: handle, pvName: pvName, claim: name}
}

// createPod creates a pod on the node whose container mounts the claims.
func (n *node) createPod(t *testing.T, name string, claims ...string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: n.f.Namespace, Name: name},
		Spec: corev1.PodSpec{
			NodeName:   n.f.NodeName,
			Containers: []corev1.Container{{Name: "c", Image: "busybox"}},
		},
	}
	for _, c := range claims {
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: c, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: c}}})
		pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts,
			corev1.VolumeMount{Name: c, MountPath: "/data/" + c})
	}
	created, err := n.f.Client.CoreV1().Pods(n.f.Namespace).Create(t.Context(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod %s: %v", name, err)
	}
	return created
}

// deletePod deletes a pod at once, as a kubelet does once its containers
// stopped.
func (n *node) deletePod(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	err := n.f.Client.CoreV1().Pods(pod.Namespace).Delete(t.Context(), pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: ptr.To[int64](0),
		Preconditions:      &metav1.Preconditions{UID: &pod.UID},
	})
	if err != nil {
		t.Fatalf("deleting pod %s: %v", pod.Name, err)
	}
}

// waitVolumesReady waits until the pod's VolumesReady condition is status
// and returns it.
func (n *node) waitVolumesReady(t *testing.T, pod *corev1.Pod, status corev1.ConditionStatus) corev1.PodCondition {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	var last corev1.PodCondition
	err := pollUntil(ctx, func() bool {
		got, err := n.f.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		c, ok := volumesReady(got)
		last = c
		return ok && c.Status == status
	})
	if err != nil {
		t.Fatalf("pod %s: condition %s did not become %s: %v; last: %+v", pod.Name, conditionVolumesReady, status, err, last)
	}
	return last
}

func volumesReady(pod *corev1.Pod) (corev1.PodCondition, bool) {
	for _, c := range pod.Status.Conditions {
		if c.Type == conditionVolumesReady {
			return c, true
		}
	}
	return corev1.PodCondition{}, false
}

// waitVolumes waits until the agent's status API satisfies done.
func (n *node) waitVolumes(t *testing.T, what string, done func([]volumemanager.VolumeStatus) bool) []volumemanager.VolumeStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	vols, err := n.agent.WaitForVolumes(ctx, done)
	if err != nil {
		t.Fatalf("waiting for the agent's status API to show %s: %v; last: %+v", what, err, vols)
	}
	return vols
}

// waitJournal waits until the plugin's calls satisfy done.
func (n *node) waitJournal(t *testing.T, what string, done func([]plugin.Call) bool) []plugin.Call {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	entries, err := n.plugin.WaitForJournal(ctx, func(entries []plugin.Entry) bool { return done(plugin.Calls(entries)) })
	if err != nil {
		t.Fatalf("waiting for the plugin journal to show %s: %v; calls: %s", what, err, describeCalls(plugin.Calls(entries)))
	}
	return plugin.Calls(entries)
}

// calls returns the plugin's calls of the node service so far.
func (n *node) calls(t *testing.T) []plugin.Call {
	t.Helper()
	entries, err := n.plugin.ReadJournal()
	if err != nil {
		t.Fatal(err)
	}
	return plugin.Calls(entries)
}

// setFaults replaces the plugin's fault rules.
func (n *node) setFaults(t *testing.T, rules ...plugin.FaultRule) {
	t.Helper()
	if err := n.plugin.SetFaults(rules...); err != nil {
		t.Fatal(err)
	}
}

// kill SIGKILLs the agent.
func (n *node) kill(t *testing.T) {
	t.Helper()
	if err := n.agent.Kill(); err != nil {
		t.Fatal(err)
	}
}

// stagingPath is the kubelet's staging path of a volume of the node's driver.
func (n *node) stagingPath(handle string) string {
	sum := sha256.Sum256([]byte(handle))
	return filepath.Join(n.agent.RootDir, "plugins", "kubernetes.io", "csi", n.driver, hex.EncodeToString(sum[:]), "globalmount")
}

// targetPath is the kubelet's target path of a pod's PV volume.
func (n *node) targetPath(uid types.UID, pvName string) string {
	return filepath.Join(n.agent.RootDir, "pods", string(uid), "volumes", "kubernetes.io~csi", pvName, "mount")
}

// volumeName is the agent's (and the kubelet's) unique name of a PV volume.
func (n *node) volumeName(handle string) string {
	return "kubernetes.io/csi/" + n.driver + "^" + handle
}

// mountsBelowRoot lists the mount points below the agent's root directory.
func (n *node) mountsBelowRoot(t *testing.T) []string {
	t.Helper()
	mps, err := agenttest.MountsBelow(n.agent.RootDir)
	if err != nil {
		t.Fatal(err)
	}
	return mps
}

// isMountPoint reports whether path is a mount point; a missing path is not.
func isMountPoint(t *testing.T, path string) bool {
	t.Helper()
	ok, err := mount.New("").IsMountPoint(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false
	}
	if err != nil {
		t.Fatalf("IsMountPoint(%s): %v", path, err)
	}
	return ok
}

func exists(t *testing.T, path string) bool {
	t.Helper()
	_, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

// callsOf returns the calls of method, optionally only those whose target
// (or staging) path is path.
func callsOf(calls []plugin.Call, method string, path string) []plugin.Call {
	var out []plugin.Call
	for _, c := range calls {
		if c.Begin.Method != method {
			continue
		}
		if path != "" && c.Begin.TargetPath != path && (c.Begin.TargetPath != "" || c.Begin.StagingPath != path) {
			continue
		}
		out = append(out, c)
	}
	return out
}

// succeeded returns the calls that returned OK.
func succeeded(calls []plugin.Call) []plugin.Call {
	var out []plugin.Call
	for _, c := range calls {
		if c.Done && c.End.Code == "OK" {
			out = append(out, c)
		}
	}
	return out
}

// nodeCalls drops the calls that are not lifecycle steps (identity,
// capabilities, registration, controller).
func nodeCalls(calls []plugin.Call) []plugin.Call {
	var out []plugin.Call
	for _, c := range calls {
		switch c.Begin.Method {
		case "NodeStageVolume", "NodeUnstageVolume", "NodePublishVolume", "NodeUnpublishVolume":
			out = append(out, c)
		}
	}
	return out
}

func describeCalls(calls []plugin.Call) string {
	var b strings.Builder
	for _, c := range calls {
		code := "(no end)"
		if c.Done {
			code = c.End.Code
		}
		fmt.Fprintf(&b, "\n  pid %d #%d %s volume=%s staging=%s target=%s → %s", c.PID, c.Seq, c.Begin.Method,
			c.Begin.VolumeID, c.Begin.StagingPath, c.Begin.TargetPath, code)
	}
	return b.String()
}

// findVolume returns the volume named name from the status API's list.
func findVolume(vols []volumemanager.VolumeStatus, name string) (volumemanager.VolumeStatus, bool) {
	for _, v := range vols {
		if v.Name == name {
			return v, true
		}
	}
	return volumemanager.VolumeStatus{}, false
}

// podState returns a pod's publish state of the volume, "" when absent.
func podState(v volumemanager.VolumeStatus, uid types.UID) string {
	for _, p := range v.Pods {
		if p.UID == string(uid) {
			return p.State
		}
	}
	return ""
}

// pollUntil calls cond every 20ms until it returns true or ctx ends.
func pollUntil(ctx context.Context, cond func() bool) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}
