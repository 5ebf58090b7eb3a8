package e2e_test

import (
	"os"
	"slices"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

// TestDriverRegistersLater starts a pod whose driver has not registered:
// its condition says so; when the plugin registers, the volume is published
// without restarting the agent.
func TestDriverRegistersLater(t *testing.T) {
	t.Parallel()
	f := k8stest.New(t)
	f.CreateNode(t)
	a := startAgent(t, f, agentOptions{})
	driver := uniqueDriverName()
	createCSIDriver(t, f, driver, false)

	// Provision the volume with a plugin process that does not register;
	// the registering one later serves the same state directory.
	dir, err := os.MkdirTemp("", "tp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	caps := nodeCaps()
	provisioner := plugintest.Start(t, plugintest.Options{Name: driver, NodeID: "node-" + f.NodeName, Capabilities: &caps, Dir: dir})
	vol := createVolume(t, provisioner, "late", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	if err := provisioner.Stop(); err != nil {
		t.Fatal(err)
	}

	pvName := "pv-" + f.Namespace
	createBoundClaim(t, f, claim{PVName: pvName, PVCName: "late", Driver: driver, Handle: vol.ID})
	pod := createPod(t, f, "late", podVolume{Name: "data", ClaimName: "late"})
	waitReason(t, f, pod, status.ReasonDriverNotRegistered, driver, pvName)

	p := plugintest.Start(t, plugintest.Options{Name: driver, NodeID: "node-" + f.NodeName, Capabilities: &caps, Dir: dir, RegistrationDir: a.RegDir})
	waitReady(t, f, pod)
	calls := volumeCalls(t, p, vol.ID)
	if got := methods(calls); !slices.Equal(got, []string{nodeStage + "=OK", nodePublish + "=OK"}) {
		t.Fatalf("calls = %q, want NodeStageVolume then NodePublishVolume", got)
	}
	deletePod(t, f, pod)
	waitCalls(t, p, vol.ID, "unstage", hasOK(nodeUnstage, 1))
}

// TestCSIDriverCreatedLater starts a pod before its driver's CSIDriver
// object exists, as when a driver's manifests are applied together with
// the first workload: without the object the kubelet's default
// attachRequired=true holds the volume back waiting for a VolumeAttachment
// that never comes. Creating the CSIDriver (attachRequired=false) must
// publish the volume at once, not after the failed wait's backoff, which
// this agent sets to ten minutes so that only the event can do it.
func TestCSIDriverCreatedLater(t *testing.T) {
	t.Parallel()
	f := k8stest.New(t)
	f.CreateNode(t)
	a := startAgent(t, f, agentOptions{RetryBaseDelay: 10 * time.Minute, RetryMaxDelay: 10 * time.Minute})
	driver := uniqueDriverName()
	p := startPlugin(t, a, driver, nodeCaps())
	vol := createVolume(t, p, "late", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	pvName := "pv-" + f.Namespace
	createBoundClaim(t, f, claim{PVName: pvName, PVCName: "late", Driver: driver, Handle: vol.ID})
	pod := createPod(t, f, "late", podVolume{Name: "data", ClaimName: "late"})
	waitReason(t, f, pod, status.ReasonWaitingForAttach, pvName, "does not exist")

	createCSIDriver(t, f, driver, false)
	waitReady(t, f, pod)
	calls := volumeCalls(t, p, vol.ID)
	if got := methods(calls); !slices.Equal(got, []string{nodeStage + "=OK", nodePublish + "=OK"}) {
		t.Fatalf("calls = %q, want NodeStageVolume then NodePublishVolume", got)
	}
	deletePod(t, f, pod)
	waitCalls(t, p, vol.ID, "unstage", hasOK(nodeUnstage, 1))
}
