package e2e_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// TestVolumeStatsAndHealth publishes a pod's PVC with a driver that has
// GET_VOLUME_STATS and GET_VOLUME_HEALTH: /metrics shows the kubelet's
// kubelet_volume_stats_* series for the claim with what the pod wrote, the
// runtime API has the pod's volume stats in the summary API's types, the
// JSON status has them too, and a degraded volume turns
// kubelet_volume_stats_health_status_abnormal to 1, records a
// VolumeConditionAbnormal Event on the pod and is named in the pod's
// (still True) condition until it is healthy again.
func TestVolumeStatsAndHealth(t *testing.T) {
	t.Parallel()
	f := k8stest.New(t)
	f.CreateNode(t)
	a := startAgent(t, f, agentOptions{Changes: volumemanager.ChangesConfig{StatsPeriod: 200 * time.Millisecond}})
	driver := uniqueDriverName()
	createCSIDriver(t, f, driver, false)
	p := startPlugin(t, a, driver, plugin.Capabilities{StageUnstage: true, VolumeStats: true, VolumeHealth: true})
	vol := createVolume(t, p, "data", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	pvName := "pv-" + f.Namespace
	createBoundClaim(t, f, claim{PVName: pvName, PVCName: "data", Driver: driver, Handle: vol.ID})
	pod := createPod(t, f, "app", podVolume{Name: "data", ClaimName: "data"})
	waitReady(t, f, pod)
	const written = 1 << 20
	if err := os.WriteFile(filepath.Join(publishPaths(a, pod, pvName).Target, "blob"), make([]byte, written), 0o644); err != nil {
		t.Fatal(err)
	}

	claimLabels := map[string]string{"namespace": f.Namespace, "persistentvolumeclaim": "data"}
	eventually(t, "kubelet_volume_stats_used_bytes of the claim", func() (bool, error) {
		used, ok := a.gauge(t, "kubelet_volume_stats_used_bytes", claimLabels)
		if !ok || used < written {
			return false, fmt.Errorf("used bytes %v (series present: %v)", used, ok)
		}
		return true, nil
	})
	for name, want := range map[string]float64{
		"kubelet_volume_stats_capacity_bytes":         float64(vol.CapacityBytes),
		"kubelet_volume_stats_health_status_abnormal": 0,
	} {
		if got, ok := a.gauge(t, name, claimLabels); !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", name, got, ok, want)
		}
	}
	for _, name := range []string{"kubelet_volume_stats_available_bytes", "kubelet_volume_stats_inodes", "kubelet_volume_stats_inodes_free", "kubelet_volume_stats_inodes_used"} {
		if _, ok := a.gauge(t, name, claimLabels); !ok {
			t.Errorf("%s%v missing", name, claimLabels)
		}
	}

	// The runtime API: what a virtual-kubelet provider puts in /stats/summary.
	vs := a.VM.PodVolumeStats(pod.UID)
	if len(vs) != 1 || vs[0].Name != "data" || vs[0].PVCRef == nil || vs[0].PVCRef.Name != "data" ||
		vs[0].UsedBytes == nil || *vs[0].UsedBytes < written || vs[0].CapacityBytes == nil {
		t.Errorf("PodVolumeStats = %+v, want the pod's volume \"data\" of claim data with its usage", vs)
	}

	// The JSON status API (csi-volmgr status).
	srv := httptest.NewServer(a.VM.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + volumemanager.VolumesPath)
	if err != nil {
		t.Fatal(err)
	}
	var vols []volumemanager.VolumeStatus
	err = json.NewDecoder(resp.Body).Decode(&vols)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(vols) != 1 || vols[0].Stats == nil || vols[0].Stats.UsedBytes == nil || *vols[0].Stats.UsedBytes < written ||
		len(vols[0].Stats.Health) != 1 || vols[0].Stats.Health[0].Status != "Healthy" {
		t.Errorf("status API volumes = %+v, want the volume with its usage and Healthy", vols)
	}

	if err := p.SetControl(plugin.FaultConfig{VolumeHealth: map[string]plugin.HealthReport{
		vol.ID: {Status: "DEGRADED", Reason: "ReplicaLost", Message: "one of three replicas is gone"},
	}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "kubelet_volume_stats_health_status_abnormal = 1", func() (bool, error) {
		v, _ := a.gauge(t, "kubelet_volume_stats_health_status_abnormal", claimLabels)
		return v == 1, nil
	})
	waitPodEvent(t, f, pod, corev1.EventTypeWarning, status.EventVolumeConditionAbnormal, "one of three replicas is gone")
	// The pod keeps its volume (True: nothing is torn down), and its
	// condition says which volume is unhealthy, until it is healthy again.
	waitCondition(t, f, pod, "True, naming the unhealthy volume", func(c *corev1.PodCondition) bool {
		return c.Status == corev1.ConditionTrue && c.Reason == status.ReasonVolumeUnhealthy &&
			strings.Contains(c.Message, pvName) && strings.Contains(c.Message, "one of three replicas is gone")
	})
	if err := p.ClearFaults(); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, f, pod, "True without a reason once healthy", func(c *corev1.PodCondition) bool {
		return c.Status == corev1.ConditionTrue && c.Reason == "" && c.Message == ""
	})
}
