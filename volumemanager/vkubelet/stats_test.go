package vkubelet_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/volumemanager/vkubelet"
)

// fakeStats has stats for the CSI volumes of pod u1 only.
type fakeStats map[types.UID][]statsv1alpha1.VolumeStats

func (f fakeStats) PodVolumeStats(uid types.UID) []statsv1alpha1.VolumeStats { return f[uid] }

func volumeStats(name string, used uint64) statsv1alpha1.VolumeStats {
	return statsv1alpha1.VolumeStats{Name: name, FsStats: statsv1alpha1.FsStats{UsedBytes: ptr.To(used)}}
}

func names(vs []statsv1alpha1.VolumeStats) []string {
	var out []string
	for _, v := range vs {
		out = append(out, v.Name)
	}
	return out
}

// TestWithVolumeStatsFillsThePodsCSIVolumes: a provider's summary gets the
// stats of each pod's CSI volumes by name, beside the volumes the provider
// reports itself; a stale entry of a CSI volume is replaced, and pods the
// volume manager has no stats for are left as they are.
func TestWithVolumeStatsFillsThePodsCSIVolumes(t *testing.T) {
	vm := fakeStats{"u1": {
		{Name: "data", FsStats: statsv1alpha1.FsStats{CapacityBytes: ptr.To[uint64](1 << 30), UsedBytes: ptr.To[uint64](4096)},
			PVCRef: &statsv1alpha1.PVCReference{Namespace: "ns", Name: "data"}},
		volumeStats("scratch", 1),
	}}
	provider := func(context.Context) (*statsv1alpha1.Summary, error) {
		return &statsv1alpha1.Summary{
			Node: statsv1alpha1.NodeStats{NodeName: "vk"},
			Pods: []statsv1alpha1.PodStats{
				{PodRef: statsv1alpha1.PodReference{Namespace: "ns", Name: "a", UID: "u1"},
					VolumeStats: []statsv1alpha1.VolumeStats{volumeStats("cache", 7), volumeStats("data", 0)}},
				{PodRef: statsv1alpha1.PodReference{Namespace: "ns", Name: "b", UID: "u2"},
					VolumeStats: []statsv1alpha1.VolumeStats{volumeStats("cache", 9)}},
			},
		}, nil
	}
	s, err := vkubelet.WithVolumeStats(vm, provider)(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	a, b := s.Pods[0], s.Pods[1]
	if got := names(a.VolumeStats); !slices.Equal(got, []string{"cache", "data", "scratch"}) {
		t.Fatalf("pod a's volumes %v, want cache (the provider's), data and scratch (the volume manager's)", got)
	}
	data := a.VolumeStats[1]
	if *data.UsedBytes != 4096 || *data.CapacityBytes != 1<<30 || data.PVCRef == nil || data.PVCRef.Name != "data" {
		t.Errorf("pod a's volume data %+v: want the volume manager's stats with its claim, not the provider's", data)
	}
	if *a.VolumeStats[0].UsedBytes != 7 {
		t.Errorf("the provider's own volume cache changed: %+v", a.VolumeStats[0])
	}
	if got := names(b.VolumeStats); !slices.Equal(got, []string{"cache"}) {
		t.Errorf("pod b (no CSI volume stats) has volumes %v, want the provider's cache only", got)
	}
}

func TestWithVolumeStatsPassesErrorsOn(t *testing.T) {
	boom := errors.New("boom")
	_, err := vkubelet.WithVolumeStats(fakeStats{}, func(context.Context) (*statsv1alpha1.Summary, error) { return nil, boom })(t.Context())
	if !errors.Is(err, boom) {
		t.Errorf("WithVolumeStats = %v, want the provider's error", err)
	}
}
