package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	"k8s.io/utils/ptr"
)

// TestIdentityOf: the container's runAsUser/runAsGroup win over the
// pod's; the supplemental groups are the pod's, its fsGroup and the
// volumes' extra ones, each once; without a security context, root.
func TestIdentityOf(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{SecurityContext: &corev1.PodSecurityContext{
		RunAsUser: ptr.To[int64](1000), RunAsGroup: ptr.To[int64](3000),
		SupplementalGroups: []int64{300, 100}, FSGroup: ptr.To[int64](200),
	}}}
	c := &corev1.Container{SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To[int64](1001)}}
	id := identityOf(pod, c, []int64{2345, 100})
	if id.uid != 1001 || id.gid != 3000 || !slices.Equal(id.groups, []int64{100, 200, 300, 2345}) {
		t.Errorf("identity %+v: want uid 1001 (the container's), gid 3000 (the pod's), groups [100 200 300 2345]", id)
	}
	if got, want := id.args(), []string{"--uid", "1001", "--gid", "3000", "--groups", "100,200,300,2345"}; !slices.Equal(got, want) {
		t.Errorf("sandbox flags %q, want %q", got, want)
	}
	root := identityOf(&corev1.Pod{}, &corev1.Container{}, nil)
	if root.uid != 0 || root.gid != 0 || len(root.groups) != 0 {
		t.Errorf("identity without a security context %+v, want root without supplemental groups", root)
	}
	if got, want := root.args(), []string{"--uid", "0", "--gid", "0"}; !slices.Equal(got, want) {
		t.Errorf("sandbox flags %q, want %q", got, want)
	}
}

func TestIntFlagRejectsBadIDs(t *testing.T) {
	for _, v := range []string{"-1", "x", "4294967295", ""} {
		var n int64
		if err := intFlag(&n)(v); err == nil {
			t.Errorf("intFlag(%q) accepted it as %d", v, n)
		}
	}
	var n int64
	if err := intFlag(&n)("65534"); err != nil || n != 65534 {
		t.Errorf("intFlag(65534) = %d, %v", n, err)
	}
}

// TestVirtualNode: the taint and the kubelet endpoint the flags ask for,
// and clear errors for bad ones.
func TestVirtualNode(t *testing.T) {
	n, err := virtualNode(options{nodeName: "vk", taint: "csi-volmgr.io/virtual=true:NoSchedule", internalIP: "10.244.1.7", kubeletPort: 10250, pods: 10})
	if err != nil {
		t.Fatal(err)
	}
	want := corev1.Taint{Key: "csi-volmgr.io/virtual", Value: "true", Effect: corev1.TaintEffectNoSchedule}
	if len(n.Spec.Taints) != 1 || !n.Spec.Taints[0].MatchTaint(&want) || n.Spec.Taints[0].Value != "true" {
		t.Errorf("taints %v, want [%v]", n.Spec.Taints, want)
	}
	if n.Status.DaemonEndpoints.KubeletEndpoint.Port != 10250 || len(n.Status.Addresses) != 1 || n.Status.Addresses[0].Address != "10.244.1.7" {
		t.Errorf("kubelet endpoint %v at %v, want port 10250 at 10.244.1.7", n.Status.DaemonEndpoints, n.Status.Addresses)
	}
	if n.Labels[corev1.LabelHostname] != "vk" || n.Status.Capacity.Pods().Value() != 10 {
		t.Errorf("labels %v, capacity %v", n.Labels, n.Status.Capacity)
	}
	if n, err := virtualNode(options{internalIP: "127.0.0.1"}); err != nil || len(n.Spec.Taints) != 0 {
		t.Errorf("--taint= : %v, %v; want no taint", n.Spec.Taints, err)
	}
	for _, o := range []options{
		{taint: "k=v", internalIP: "127.0.0.1"},
		{taint: "=v:NoSchedule", internalIP: "127.0.0.1"},
		{taint: "k=v:Sometimes", internalIP: "127.0.0.1"},
		{taint: DefaultTaint, internalIP: "$(POD_IP)"},
	} {
		if _, err := virtualNode(o); err == nil {
			t.Errorf("virtualNode(--taint=%q --internal-ip=%q) accepted it", o.taint, o.internalIP)
		}
	}
}

// TestStatsSummaryHandler serves the summary as JSON, and its errors.
func TestStatsSummaryHandler(t *testing.T) {
	var fail atomic.Bool
	srv := httptest.NewServer(statsSummaryHandler(func(context.Context) (*statsv1alpha1.Summary, error) {
		if fail.Load() {
			return nil, errors.New("boom")
		}
		return &statsv1alpha1.Summary{Node: statsv1alpha1.NodeStats{NodeName: "vk"}}, nil
	}))
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL + "/stats/summary") //nolint:noctx // a test
	if err != nil {
		t.Fatal(err)
	}
	var s statsv1alpha1.Summary
	err = json.NewDecoder(resp.Body).Decode(&s)
	_ = resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || s.Node.NodeName != "vk" {
		t.Errorf("GET /stats/summary: %s, %+v, %v", resp.Status, s, err)
	}
	fail.Store(true)
	resp, err = http.Get(srv.URL + "/stats/summary") //nolint:noctx // a test
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusInternalServerError {
		t.Errorf("GET /stats/summary of a failing provider: %s, want 500", resp.Status)
	}
}

// TestVolumeManagerWaitsForTheRuntime: the embedded volume manager keeps a
// pod's volumes until the runtime says its processes stopped, whatever the
// flags.
func TestVolumeManagerWaitsForTheRuntime(t *testing.T) {
	if c := volumeManagerConfig(options{nodeName: "vk"}, nil); !c.WaitForContainersStopped {
		t.Error("the embedded volume manager does not wait for the runtime (WaitForContainersStopped)")
	}
}
