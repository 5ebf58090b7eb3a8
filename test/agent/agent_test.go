package agent_test

import (
	"context"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/csi-volmgr/csi-volmgr/test/agent/agenttest"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// TestAgentPublishesPodVolume runs the agent binary against the real API
// server and the real test plugin (issue 6): it is live at once but ready
// only once it could sync with the API server; a pod with a claim on the
// plugin gets its volume staged and published, which `csi-volmgr status -o
// json` shows (on the agent's root-only socket, its default) and /metrics
// counts, while the TCP endpoint serves the volumes to no one without a
// token; it writes nothing surprising to the API server or the disk; and
// SIGTERM ends it with exit code 0 and no unmount.
func TestAgentPublishesPodVolume(t *testing.T) {
	t.Parallel()
	env := newGatedEnv(t)
	n := newNode(t, nodeOptions{kubeConfig: env.kubeConfig})
	ctx := t.Context()
	n.logStep(t, "node prepared")

	// Live but not ready while the API server is out of reach.
	if err := n.agent.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if code, _, err := n.agent.Get(ctx, "/healthz"); err != nil || code != http.StatusOK {
		t.Fatalf("/healthz before sync = %d, %v; want 200", code, err)
	}
	if code, body, err := n.agent.Get(ctx, "/readyz"); err != nil || code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz while the API server is unreachable = %d %q, %v; want 503", code, body, err)
	}
	n.logStep(t, "agent started, not ready")
	env.gate.Open()
	n.waitReady(t)
	n.logStep(t, "agent ready")
	n.waitDriverRegistered(t)
	n.logStep(t, "driver registered")

	vol := n.createClaimedVolume(t, "data")
	pod := n.createPod(t, "app", vol.claim)
	n.waitVolumesReady(t, pod, corev1.ConditionTrue)
	n.logStep(t, "volumes ready")

	// What a user sees: the real binary as the client.
	vols, err := n.agent.StatusCommand(ctx)
	if err != nil {
		t.Fatal(err)
	}
	staging, target := n.stagingPath(vol.handle), n.targetPath(pod.UID, vol.pvName)
	want := []volumemanager.VolumeStatus{{
		Name: n.volumeName(vol.handle), Driver: n.driver, Handle: vol.handle, PVName: vol.pvName,
		AccessType: "Filesystem", Attached: true, State: "Staged", StagingPath: staging,
		Pods: []volumemanager.PodStatus{{UID: string(pod.UID), Namespace: pod.Namespace, Name: pod.Name, State: "Published", TargetPath: target}},
	}}
	if diff := cmp.Diff(want, vols); diff != "" {
		t.Errorf("csi-volmgr status -o json (-want +got):\n%s", diff)
	}

	if code, body, err := n.agent.GetTCP(ctx, agenttest.VolumesPath); err != nil || code != http.StatusUnauthorized {
		t.Errorf("%s over TCP without a token = %d %q, %v; want 401", agenttest.VolumesPath, code, body, err)
	}
	if code, _, err := n.agent.GetTCP(ctx, agenttest.MetricsPath); err != nil || code != http.StatusOK {
		t.Errorf("%s over TCP = %d, %v; want 200", agenttest.MetricsPath, code, err)
	}

	drivers, err := n.agent.DriversCommand(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(drivers) != 1 || drivers[0].Name != n.driver || drivers[0].NodeID != n.f.NodeName ||
		drivers[0].Endpoint != n.plugin.Endpoint || !slices.Contains(drivers[0].Capabilities, "STAGE_UNSTAGE_VOLUME") {
		t.Errorf("csi-volmgr drivers -o json = %+v, want the test plugin at %s with node ID %s and STAGE_UNSTAGE_VOLUME",
			drivers, n.plugin.Endpoint, n.f.NodeName)
	}

	// The target is a real mount of the volume's data.
	if !isMountPoint(t, staging) || !isMountPoint(t, target) {
		t.Fatalf("staging %s mounted %v, target %s mounted %v; want both mounted", staging, isMountPoint(t, staging), target, isMountPoint(t, target))
	}
	if err := os.WriteFile(filepath.Join(target, "hello"), []byte("from the pod"), 0o600); err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(filepath.Join(n.plugin.StateDir, "volumes", vol.handle, "hello")); err != nil || string(data) != "from the pod" {
		t.Errorf("file written through the target: in the volume %q, %v; want it there", data, err)
	}
	calls := nodeCalls(n.calls(t))
	if got := methods(calls); !slices.Equal(got, []string{"NodeStageVolume:OK", "NodePublishVolume:OK"}) {
		t.Errorf("node calls = %v, want one stage then one publish:%s", got, describeCalls(calls))
	}

	if code, _, err := n.agent.Get(ctx, "/healthz"); err != nil || code != http.StatusOK {
		t.Errorf("/healthz with a volume published = %d, %v; want 200", code, err)
	}
	checkMetrics(t, n)
	checkNothingSurprising(t, n, pod, vol)

	// SIGTERM: exit 0, nothing unmounted.
	n.logStep(t, "checked")
	if err := n.agent.Stop(); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	n.logStep(t, "stopped")
	if !isMountPoint(t, staging) || !isMountPoint(t, target) {
		t.Errorf("after SIGTERM: staging mounted %v, target mounted %v; want both still mounted", isMountPoint(t, staging), isMountPoint(t, target))
	}
	for _, c := range n.calls(t) {
		if c.Begin.Method == "NodeUnpublishVolume" || c.Begin.Method == "NodeUnstageVolume" {
			t.Errorf("the agent called %s on its way out:%s", c.Begin.Method, describeCalls([]plugin.Call{c}))
		}
	}
}

// TestRegisterNode runs the agent as the only agent of a node without
// kubelet (--register-node, issue 6): it creates the Node for the
// attach/detach controller, publishes a pod's volume, which `csi-volmgr
// status -o json` shows, and when the pod is deleted it tears the volume
// down and only then completes the deletion.
func TestRegisterNode(t *testing.T) {
	t.Parallel()
	n := newNode(t, nodeOptions{registerNode: true})
	n.startAgent(t)
	ctx := t.Context()
	node, err := n.f.Client.CoreV1().Nodes().Get(ctx, n.f.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the Node the agent registers: %v", err)
	}
	if got := node.Annotations["volumes.kubernetes.io/controller-managed-attach-detach"]; got != "true" {
		t.Errorf("Node annotation controller-managed-attach-detach = %q, want \"true\"", got)
	}
	// The Node takes pods without a patch (issue 25): the defaults of
	// --node-pods and --node-taints.
	if pods := node.Status.Allocatable[corev1.ResourcePods]; pods.Value() != 110 {
		t.Errorf("Node allocatable pods = %s, want 110", pods.String())
	}
	if !slices.ContainsFunc(node.Spec.Taints, func(taint corev1.Taint) bool {
		return taint.Key == "csi-volmgr.io/virtual" && taint.Value == "true" && taint.Effect == corev1.TaintEffectNoSchedule
	}) {
		t.Errorf("Node taints %v lack csi-volmgr.io/virtual=true:NoSchedule", node.Spec.Taints)
	}

	vol := n.createClaimedVolume(t, "data")
	pod := n.createPod(t, "app", vol.claim)
	n.waitVolumesReady(t, pod, corev1.ConditionTrue)
	vols, err := n.agent.StatusCommand(ctx)
	if err != nil {
		t.Fatal(err)
	}
	target := n.targetPath(pod.UID, vol.pvName)
	if v, ok := findVolume(vols, n.volumeName(vol.handle)); !ok || len(vols) != 1 || v.State != "Staged" ||
		podState(v, pod.UID) != "Published" || v.Pods[0].TargetPath != target {
		t.Errorf("csi-volmgr status -o json = %+v, want the volume staged and published for the pod at %s", vols, target)
	}

	// A deletion as kubectl makes it: with the default grace period.
	if err := n.f.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	err = pollUntil(waitCtx, func() bool {
		_, err := n.f.Client.CoreV1().Pods(pod.Namespace).Get(waitCtx, pod.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	if err != nil {
		t.Fatalf("the agent did not complete the pod's deletion: %v", err)
	}
	// Gone from the API only once its volume is unpublished.
	if unpublished := succeeded(callsOf(n.calls(t), "NodeUnpublishVolume", target)); len(unpublished) != 1 || isMountPoint(t, target) {
		t.Errorf("pod deleted with its volume unpublished %d times and the target mounted %v; want unpublished first",
			len(unpublished), isMountPoint(t, target))
	}
	n.waitJournal(t, "NodeUnstageVolume", func(calls []plugin.Call) bool {
		return len(succeeded(callsOf(calls, "NodeUnstageVolume", n.stagingPath(vol.handle)))) == 1
	})
	n.waitVolumes(t, "no volume", func(vols []volumemanager.VolumeStatus) bool { return len(vols) == 0 })
	n.assertNothingLeft(t, pod)
}

// checkMetrics checks that /metrics exposes the lifecycle's metrics with
// what the test did: one stage and one publish of the driver, one volume in
// each world, the CSI calls and the reconciler's queues.
func checkMetrics(t *testing.T, n *node) {
	t.Helper()
	families, err := n.agent.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	pluginLabel := "kubernetes.io/csi:" + n.driver
	for _, op := range []string{"mount_device", "volume_mount"} {
		if c := histogramCount(families, "storage_operation_duration_seconds",
			map[string]string{"volume_plugin": pluginLabel, "operation_name": op, "status": "success"}); c != 1 {
			t.Errorf("storage_operation_duration_seconds{operation_name=%q,status=success} count = %d, want 1", op, c)
		}
	}
	for _, state := range []string{"desired_state_of_world", "actual_state_of_world"} {
		if v, ok := gauge(families, "volume_manager_total_volumes", map[string]string{"plugin_name": pluginLabel, "state": state}); !ok || v != 1 {
			t.Errorf("volume_manager_total_volumes{state=%q} = %v (present %v), want 1", state, v, ok)
		}
	}
	for _, method := range []string{"/csi.v1.Node/NodeStageVolume", "/csi.v1.Node/NodePublishVolume"} {
		if c := histogramCount(families, "csi_operations_seconds",
			map[string]string{"driver_name": n.driver, "method_name": method, "grpc_status_code": "OK"}); c != 1 {
			t.Errorf("csi_operations_seconds{method_name=%q,grpc_status_code=OK} count = %d, want 1", method, c)
		}
	}
	for _, queue := range []string{"csi_volmgr_volumes", "csi_volmgr_pod_volumes"} {
		if v, ok := counter(families, "workqueue_adds_total", map[string]string{"name": queue}); !ok || v < 1 {
			t.Errorf("workqueue_adds_total{name=%q} = %v (present %v), want at least 1", queue, v, ok)
		}
		if _, ok := gauge(families, "workqueue_depth", map[string]string{"name": queue}); !ok {
			t.Errorf("workqueue_depth{name=%q} missing", queue)
		}
	}
}

// checkNothingSurprising checks what the agent wrote besides the mounts: in
// the API server the pod's condition, the Node's volumesInUse and nodeid
// annotation and the CSINode, and no warning Event; on disk only the
// kubelet's layout below the root directory.
func checkNothingSurprising(t *testing.T, n *node, pod *corev1.Pod, vol claimedVolume) {
	t.Helper()
	ctx := t.Context()
	c := n.f.Client
	pods, err := c.CoreV1().Pods(n.f.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 1 || pods.Items[0].UID != pod.UID {
		t.Errorf("pods in the namespace: %d, want only the test's", len(pods.Items))
	}
	events, err := c.CoreV1().Events(n.f.Namespace).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("type", corev1.EventTypeWarning).String()})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		t.Errorf("warning Event on a volume that mounted at once: %s %s: %s", e.InvolvedObject.Name, e.Reason, e.Message)
	}
	vas, err := c.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, va := range vas.Items {
		if va.Spec.NodeName == n.f.NodeName {
			t.Errorf("VolumeAttachment %s for a driver that needs no attach", va.Name)
		}
	}
	node, err := c.CoreV1().Nodes().Get(ctx, n.f.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The driver needs no attach: its volumes are not reported in use, as
	// the kubelet reports attachable volumes only.
	if len(node.Status.VolumesInUse) != 0 {
		t.Errorf("node.status.volumesInUse = %v, want none: the driver needs no attach", node.Status.VolumesInUse)
	}
	csiNode, err := c.StorageV1().CSINodes().Get(ctx, n.f.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("CSINode of the node: %v", err)
	}
	if len(csiNode.Spec.Drivers) != 1 || csiNode.Spec.Drivers[0].Name != n.driver || csiNode.Spec.Drivers[0].NodeID != n.f.NodeName {
		t.Errorf("CSINode drivers = %+v, want the test driver with node ID %s", csiNode.Spec.Drivers, n.f.NodeName)
	}

	entries, err := os.ReadDir(n.agent.RootDir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	// pki: the self-signed serving certificate of --http-endpoint.
	if want := []string{volumemanager.LockFileName, volumemanager.SocketName, "pki", "plugins", "plugins_registry", "pods"}; !slices.Equal(names, want) {
		t.Errorf("root directory holds %v, want %v", names, want)
	}
}

// gatedEnv is the API server behind a gate, and a kubeconfig that goes
// through it.
type gatedEnv struct {
	gate       *gate
	kubeConfig []byte
}

func newGatedEnv(t *testing.T) gatedEnv {
	t.Helper()
	env := k8stest.Shared(t)
	u, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	g := startGate(t, u.Host)
	return gatedEnv{gate: g, kubeConfig: kubeConfigThrough(t, env.KubeConfig, g)}
}

func methods(calls []plugin.Call) []string {
	out := make([]string, 0, len(calls))
	for _, c := range calls {
		code := "no-end"
		if c.Done {
			code = c.End.Code
		}
		out = append(out, c.Begin.Method+":"+code)
	}
	return out
}

func matches(m *dto.Metric, labels map[string]string) bool {
	n := 0
	for _, l := range m.GetLabel() {
		if v, ok := labels[l.GetName()]; ok {
			if v != l.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(labels)
}

func histogramCount(families map[string]*dto.MetricFamily, name string, labels map[string]string) uint64 {
	for _, m := range families[name].GetMetric() {
		if matches(m, labels) {
			return m.GetHistogram().GetSampleCount()
		}
	}
	return 0
}

func gauge(families map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	for _, m := range families[name].GetMetric() {
		if matches(m, labels) {
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

func counter(families map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	for _, m := range families[name].GetMetric() {
		if matches(m, labels) {
			return m.GetCounter().GetValue(), true
		}
	}
	return 0, false
}
