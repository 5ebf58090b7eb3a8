// Package operations performs the CSI steps of the volume lifecycle on this
// node, one step per call: WaitForAttach, Stage, Publish, Unpublish and
// Unstage are plain methods that build the kubelet's requests, keep the
// on-disk records (lifecycle/checkpoint) in the kubelet's layout
// (lifecycle/paths), record every outcome in the actual state of world with
// the kubelet's uncertain-state rules (operation_generator.go markDeviceErrorState and markVolumeErrorState), and serialize the steps on a
// volume so that the reconciler and the front endpoint can share them. The
// front endpoint's requests (StageRequest, PublishRequest, ... in
// caller.go) run through the same steps, at the paths the container
// orchestrator chose.
package operations
