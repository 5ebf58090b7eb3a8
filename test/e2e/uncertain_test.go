package e2e_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/mount-utils"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

// uncertainCodes are the gRPC codes after which a CSI step may have
// happened or may still be happening (the kubelet's isFinalError is false).
var uncertainCodes = []codes.Code{codes.DeadlineExceeded, codes.Unavailable, codes.Canceled, codes.ResourceExhausted, codes.Aborted}

// csiTimeout is the agent's CSI call timeout in TestUncertainStepIsTornDown,
// short because the hang cases wait for it.
const csiTimeout = 2 * time.Second

// TestUncertainStepIsTornDown makes NodeStageVolume or NodePublishVolume end
// with each uncertain gRPC code (or hang past the agent's CSI timeout), once
// or until the pod is gone, and checks that the volume is torn down all the
// same when its pod is deleted: the step may have mounted something, so the
// agent unpublishes and unstages what it cannot prove absent, and leaves no
// mount, directory or record behind.
func TestUncertainStepIsTornDown(t *testing.T) {
	t.Parallel()
	for _, method := range []string{nodeStage, nodePublish} {
		t.Run(method, func(t *testing.T) {
			t.Parallel()
			testUncertainStep(t, method)
		})
	}
}

// testUncertainStep runs TestUncertainStepIsTornDown's cases of one method
// one after the other, on one agent and one plugin.
func testUncertainStep(t *testing.T, method string) {
	f := k8stest.New(t)
	f.CreateNode(t)
	a := startAgent(t, f, agentOptions{CSITimeout: csiTimeout})
	driver := uniqueDriverName()
	createCSIDriver(t, f, driver, false)
	p := startPlugin(t, a, driver, nodeCaps())

	type testCase struct {
		method string
		code   codes.Code
		hang   bool
		// once: the fault fires once and the retry succeeds; else it fires
		// until the pod is deleted.
		once bool
		// exit: the plugin does the step and dies before it replies; the
		// pod is deleted while it is down, then it comes back.
		exit bool
	}
	var cases []testCase
	for _, code := range uncertainCodes {
		cases = append(cases, testCase{method: method, code: code, once: true}, testCase{method: method, code: code})
	}
	cases = append(cases, testCase{method: method, code: codes.DeadlineExceeded, hang: true},
		testCase{method: method, code: codes.Unavailable, exit: true})
	for i, tc := range cases {
		name := tc.code.String()
		switch {
		case tc.hang:
			name += "/hang"
		case tc.exit:
			name = "plugin_died_after_the_step"
		case tc.once:
			name += "/once"
		default:
			name += "/until_cleared"
		}
		t.Run(name, func(t *testing.T) {
			id := fmt.Sprintf("u%d", i)
			vol := createVolume(t, p, id, csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
			rule := plugin.FaultRule{Method: tc.method, VolumeID: vol.ID, Code: tc.code, Message: "injected " + tc.code.String(), Hang: tc.hang}
			if tc.hang || tc.exit {
				rule.Code, rule.Message = codes.OK, ""
			}
			if tc.exit {
				rule.Exit, rule.Times = plugin.ExitAfter, 1
			}
			if tc.once {
				rule.Times = 1
			}
			if err := p.SetFaults(rule); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.ClearFaults() })
			pvName := "pv-" + id + "-" + f.Namespace
			createBoundClaim(t, f, claim{PVName: pvName, PVCName: id, Driver: driver, Handle: vol.ID})
			pod := createPod(t, f, id, podVolume{Name: "data", ClaimName: id})
			failed := func(calls []plugin.Call) bool {
				return slices.ContainsFunc(calls, func(c plugin.Call) bool {
					return c.Begin.Method == tc.method && c.Done && c.Code() == tc.code
				})
			}
			if !tc.hang && !tc.exit {
				waitCalls(t, p, vol.ID, tc.method+" failed with "+tc.code.String(), failed)
			}
			if tc.exit {
				testPluginDiedAfterStep(t, a, p, tc.method, vol, pod, pvName)
				return
			}

			reason := status.ReasonNodeStageFailed
			if tc.method == nodePublish {
				reason = status.ReasonNodePublishFailed
			}
			if tc.once {
				waitReady(t, f, pod)
				calls := volumeCalls(t, p, vol.ID)
				if n := len(okCalls(calls, tc.method)); n != 1 {
					t.Errorf("%s succeeded %d times, want once after the failure: %q", tc.method, n, methods(calls))
				}
			} else {
				// The pod shows the step and the driver's code until it goes.
				waitReason(t, f, pod, reason, pvName, tc.method+" failed", "code = "+tc.code.String())
				waitEvent(t, f, pod, status.EventFailedMount, tc.method)
			}
			if tc.hang {
				calls := volumeCalls(t, p, vol.ID)
				if !slices.ContainsFunc(calls, func(c plugin.Call) bool { return c.Begin.Method == tc.method && len(c.Faults) > 0 }) {
					t.Fatalf("the hanging %s is not in the journal: %q", tc.method, methods(calls))
				}
			}

			deletePod(t, f, pod)
			wantTeardown := []string{nodeUnstage}
			if tc.method == nodePublish || tc.once {
				wantTeardown = []string{nodeUnpublish, nodeUnstage}
			}
			calls := waitCalls(t, p, vol.ID, "teardown", hasOK(nodeUnstage, 1))
			var teardown []string
			for _, c := range calls {
				if (c.Begin.Method == nodeUnpublish || c.Begin.Method == nodeUnstage) && c.Done && c.Code() == codes.OK {
					teardown = append(teardown, c.Begin.Method)
				}
			}
			if !slices.Equal(teardown, wantTeardown) {
				t.Errorf("teardown calls = %q, want %q (all calls: %q)", teardown, wantTeardown, methods(calls))
			}
			// No set-up step starts once the teardown has begun. A hanging
			// call the agent gave up on at its timeout may end in the plugin
			// a moment after the agent moved on, as with the kubelet; the
			// plugin's end entry then shows that it was cancelled.
			unstage := okCalls(calls, nodeUnstage)[0]
			for _, c := range calls {
				if c.Begin.Method != nodeStage && c.Begin.Method != nodePublish || endsBefore(c, unstage) {
					continue
				}
				abandoned := tc.hang && c.Begin.Time.Before(unstage.Begin.Time) && (c.Code() == codes.Canceled || c.Code() == codes.DeadlineExceeded)
				if !abandoned {
					t.Errorf("%s (began %s, %s) overlaps or follows NodeUnstageVolume (began %s): %q", c.Begin.Method,
						c.Begin.Time.Format(time.StampMicro), c.Code(), unstage.Begin.Time.Format(time.StampMicro), methods(calls))
				}
			}
			assertTornDown(t, a, driver, vol.ID, pod)
		})
	}
}

// assertTornDown checks that nothing of the volume and the pod is left: no
// directory, record or mount, nothing in the agent's actual state or in
// the Node's volumesInUse.
func assertTornDown(t *testing.T, a *agent, driver, handle string, pod *corev1.Pod) {
	t.Helper()
	st := stagingPaths(a, driver, handle)
	waitGone(t, "pod directory and staging directory", filepath.Join(a.Root, "pods", string(pod.UID)), st.Dir)
	if mounts, err := mountsUnder(a.Root); err != nil || len(mounts) > 0 {
		t.Errorf("mounts left under the root: %v (err %v)", mounts, err)
	}
	eventually(t, "agent forgot the volume", func() (bool, error) {
		for _, v := range a.VM.Volumes() {
			if v.Handle == handle {
				return false, fmt.Errorf("agent still holds %+v", v)
			}
		}
		return true, nil
	})
	waitInUse(t, a.f, "without the volume", func(got []corev1.UniqueVolumeName) bool {
		return !slices.Contains(got, uniqueName(driver, handle))
	})
}

// testPluginDiedAfterStep is the case where the plugin did the step (the
// volume is really staged or published) and died before it replied: the
// agent sees the connection fail, an uncertain result. The pod is deleted
// while the plugin is down; once it is back, the agent unpublishes and
// unstages the mounts it could not confirm.
func testPluginDiedAfterStep(t *testing.T, a *agent, p *plugintest.Plugin, method string, vol plugin.Volume, pod *corev1.Pod, pvName string) {
	t.Helper()
	eventually(t, "the plugin died in "+method, func() (bool, error) { return !p.Running(), nil })
	calls := volumeCalls(t, p, vol.ID)
	if len(calls) == 0 || calls[len(calls)-1].Begin.Method != method || calls[len(calls)-1].Done {
		t.Fatalf("calls = %q, want %s last and unanswered", methods(calls), method)
	}
	driver := p.Name
	mountPoint := stagingPaths(a, driver, vol.ID).Path
	reason := status.ReasonNodeStageFailed
	if method == nodePublish {
		mountPoint = publishPaths(a, pod, pvName).Target
		reason = status.ReasonNodePublishFailed
	}
	if ok, err := mount.New("").IsMountPoint(mountPoint); err != nil || !ok {
		t.Fatalf("%s is not mounted after the plugin did %s (err %v)", mountPoint, method, err)
	}
	waitReason(t, a.f, pod, reason, pvName, method+" failed")

	deletePod(t, a.f, pod)
	a.waitDesired(t, driver, 0)
	if err := p.Restart(t.Context()); err != nil {
		t.Fatalf("restarting the plugin: %v", err)
	}
	calls = waitCalls(t, p, vol.ID, "teardown", hasOK(nodeUnstage, 1))
	last := calls[len(calls)-1]
	if last.Begin.Method != nodeUnstage || last.Code() != codes.OK {
		t.Errorf("calls = %q, want NodeUnstageVolume last", methods(calls))
	}
	if method == nodePublish {
		unpublish := okCalls(calls, nodeUnpublish)
		if len(unpublish) != 1 || unpublish[0].Begin.TargetPath != mountPoint || !endsBefore(unpublish[0], last) {
			t.Errorf("calls = %q, want one NodeUnpublishVolume of %s before NodeUnstageVolume", methods(calls), mountPoint)
		}
	}
	if n := countCalls(calls, method); n != 1 {
		t.Errorf("calls = %q, want no %s after the one the plugin died in", methods(calls), method)
	}
	assertTornDown(t, a, driver, vol.ID, pod)
}

// waitEvent waits for a Warning Event with reason on the pod whose message
// contains msgPart.
func waitEvent(t *testing.T, f *k8stest.Fixture, pod *corev1.Pod, reason, msgPart string) {
	t.Helper()
	eventually(t, fmt.Sprintf("%s Event on pod %s", reason, pod.Name), func() (bool, error) {
		evs, err := f.Client.CoreV1().Events(pod.Namespace).List(t.Context(), metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("involvedObject.uid", string(pod.UID)).String(),
		})
		if err != nil {
			return false, err
		}
		var seen []string
		for _, e := range evs.Items {
			if e.Reason == reason && e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, msgPart) {
				return true, nil
			}
			seen = append(seen, e.Reason+": "+e.Message)
		}
		return false, fmt.Errorf("events: %q", seen)
	})
}
