package status_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

var testPodInfo = volume.PodInfo{UID: "uid-1", Namespace: "ns", Name: "p1"}

// TestVolumeFailedEvents checks reason, type and the kubelet's message for
// each failed step, and that teardown steps and steps in progress record
// nothing.
func TestVolumeFailedEvents(t *testing.T) {
	fsSrc := volume.Source{ID: volume.ID{Driver: "d", Handle: "h", PVName: "pvc-1", AccessType: volume.Filesystem}}
	blockSrc := fsSrc
	blockSrc.AccessType = volume.Block
	boom := errors.New("rpc error: code = Internal desc = boom")
	tests := map[string]struct {
		b    status.Blocker
		want string // empty: no Event
	}{
		"wait for attach": {
			b:    status.Blocker{Step: volume.StepWaitForAttach, SpecName: "data", Source: fsSrc, Err: boom},
			want: `Warning FailedMount MountVolume.WaitForAttach failed for volume "pvc-1" : rpc error: code = Internal desc = boom`,
		},
		"stage": {
			b:    status.Blocker{Step: volume.StepStage, SpecName: "data", Source: fsSrc, Err: boom},
			want: `Warning FailedMount MountVolume.MountDevice failed for volume "pvc-1" : rpc error: code = Internal desc = boom`,
		},
		"publish": {
			b:    status.Blocker{Step: volume.StepPublish, SpecName: "data", Source: fsSrc, Err: boom},
			want: `Warning FailedMount MountVolume.SetUp failed for volume "pvc-1" : rpc error: code = Internal desc = boom`,
		},
		"driver not registered": {
			b: status.Blocker{Step: volume.StepStage, SpecName: "data", Source: fsSrc,
				Err: fmt.Errorf("driver d: %w", volume.ErrDriverNotRegistered)},
			want: `Warning FailedMount MountVolume.MountDevice failed for volume "pvc-1" : driver d: CSI driver is not registered`,
		},
		"block stage": {
			b:    status.Blocker{Step: volume.StepStage, SpecName: "data", Source: blockSrc, Err: boom},
			want: `Warning FailedMapVolume MapVolume.SetUpDevice failed for volume "pvc-1" : rpc error: code = Internal desc = boom`,
		},
		"block publish": {
			b:    status.Blocker{Step: volume.StepPublish, SpecName: "data", Source: blockSrc, Err: boom},
			want: `Warning FailedMapVolume MapVolume.MapPodDevice failed for volume "pvc-1" : rpc error: code = Internal desc = boom`,
		},
		"expand": {
			b:    status.Blocker{Step: volume.StepExpand, SpecName: "data", Source: fsSrc, Err: boom},
			want: `Warning VolumeResizeFailed MountVolume.NodeExpandVolume failed for volume "pvc-1" : rpc error: code = Internal desc = boom`,
		},
		"PVC not bound": {
			b:    status.Blocker{SpecName: "data", Err: fmt.Errorf("PVC \"data\" is not bound: %w", volume.ErrInvalidSpec)},
			want: `Warning FailedMount Unable to attach or mount volumes: failed to process volume "data": PVC "data" is not bound: invalid volume specification`,
		},
		"unpublish":   {b: status.Blocker{Step: volume.StepUnpublish, Source: fsSrc, Err: boom}},
		"unstage":     {b: status.Blocker{Step: volume.StepUnstage, Source: fsSrc, Err: boom}},
		"in progress": {b: status.Blocker{Step: volume.StepStage, Source: fsSrc}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			rec := record.NewFakeRecorder(10)
			e, err := status.NewEvents(testContext(t), status.EventsConfig{NodeName: testNode, Recorder: rec})
			if err != nil {
				t.Fatalf("NewEvents() error: %v", err)
			}
			e.VolumeFailed(testPodInfo, tc.b)
			var got []string
			for len(rec.Events) > 0 { // the fake recorder is synchronous
				got = append(got, <-rec.Events)
			}
			var want []string
			if tc.want != "" {
				want = []string{tc.want}
			}
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("events:\n  %q\nwant\n  %q", got, want)
			}
		})
	}
}

// TestEventsThroughBroadcaster records through the real broadcaster into a
// fake clientset: a repeated pod Event becomes one Event with a count
// (the correlator), with the agent's source, and a Node Event lands in the
// default namespace with the kubelet's Node reference.
func TestEventsThroughBroadcaster(t *testing.T) {
	ctx := testContext(t)
	client := fake.NewClientset()
	e, err := status.NewEvents(ctx, status.EventsConfig{Client: client, NodeName: testNode})
	if err != nil {
		t.Fatalf("NewEvents() error: %v", err)
	}
	t.Cleanup(e.Shutdown)

	b := status.Blocker{Step: volume.StepStage, SpecName: "data",
		Source: volume.Source{ID: volume.ID{Driver: "d", Handle: "h", PVName: "pvc-1"}}, Err: errors.New("boom")}
	for range 3 {
		e.VolumeFailed(testPodInfo, b)
	}
	e.Node(corev1.EventTypeWarning, status.EventDriverRegistrationFailed,
		"driver \"bad\" rejected: no supported CSI version")

	var podEvent, nodeEvent *corev1.Event
	waitFor(ctx, t, "aggregated pod Event", func() (bool, error) {
		list, err := client.CoreV1().Events("ns").List(ctx, metav1.ListOptions{})
		if err != nil || len(list.Items) != 1 || list.Items[0].Count != 3 {
			return false, err
		}
		podEvent = &list.Items[0]
		return true, nil
	})
	waitFor(ctx, t, "Node Event", func() (bool, error) {
		list, err := client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
		if err != nil || len(list.Items) != 1 {
			return false, err
		}
		nodeEvent = &list.Items[0]
		return true, nil
	})

	wantPodRef := corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: "ns", Name: "p1", UID: "uid-1"}
	if podEvent.InvolvedObject != wantPodRef || podEvent.Type != corev1.EventTypeWarning ||
		podEvent.Reason != status.EventFailedMount ||
		podEvent.Message != `MountVolume.MountDevice failed for volume "pvc-1" : boom` ||
		podEvent.Source != (corev1.EventSource{Component: status.Component, Host: testNode}) ||
		podEvent.ReportingController != status.Component {
		t.Errorf("pod Event = %s", mustJSON(podEvent))
	}
	wantNodeRef := corev1.ObjectReference{Kind: "Node", Name: testNode, UID: testNode}
	if nodeEvent.InvolvedObject != wantNodeRef || nodeEvent.Reason != status.EventDriverRegistrationFailed ||
		nodeEvent.Type != corev1.EventTypeWarning {
		t.Errorf("Node Event = %s", mustJSON(nodeEvent))
	}
}

// TestEventMessageTruncated: Event messages are cut to MaxMessageLength
// on one line.
func TestEventMessageTruncated(t *testing.T) {
	rec := record.NewFakeRecorder(1)
	e, err := status.NewEvents(testContext(t), status.EventsConfig{NodeName: testNode, Recorder: rec})
	if err != nil {
		t.Fatalf("NewEvents() error: %v", err)
	}
	e.Pod(testPodInfo, corev1.EventTypeWarning, status.EventFailedMount, strings.Repeat("x\n", 5000))
	got := strings.TrimPrefix(<-rec.Events, "Warning FailedMount ")
	if len(got) > status.MaxMessageLength || strings.Contains(got, "\n") || !strings.HasSuffix(got, "…") {
		t.Errorf("message of %d bytes %q, want ≤ %d bytes on one line ending in …", len(got), got, status.MaxMessageLength)
	}
}

func TestNewEventsNeedsNodeName(t *testing.T) {
	if _, err := status.NewEvents(testContext(t), status.EventsConfig{}); err == nil {
		t.Error("NewEvents() without NodeName succeeded, want an error")
	}
}
