// Package chaos is the chaos harness of `make chaos` (issue 16): the real agent binary, a real
// kube-apiserver with etcd (test/k8s), three CSI test plugins registered through the agent's
// registration directory, real mounts and loop devices, a workload of pods with volumes, and
// nemeses at random moments, with invariants checked while it runs and at the end.
//
// # The node
//
// The agent runs with --register-node (it creates and keeps the Node and completes the deletion
// of pods whose volumes are torn down) and --csi-timeout=5s, on a root directory that is a 16 MiB
// tmpfs, so that the disk can be filled. The plugins are:
//
//   - stage: STAGE_UNSTAGE_VOLUME, attachRequired=false; shared (RWX) and single-pod filesystem
//     volumes and block volumes (loop devices);
//   - attach: STAGE_UNSTAGE_VOLUME and PUBLISH_UNPUBLISH_VOLUME, attachRequired=true; the harness
//     plays the attach/detach controller and the external attacher (attacher.go);
//   - direct: no stage step, podInfoOnMount; shared filesystem volumes and CSI inline volumes.
//
// # Workload
//
// Pods of one to three volumes (a single-pod volume is given to one live pod at a time; it may be
// given to a new pod while the last one's teardown is still running) and, for one pod in four, a
// CSI inline volume, live for a random time between ShortestPodLife and LongestPodLife (45–75 s,
// well above the 30 s ReadyBound) and are deleted at once (grace period 0) or gracefully (the
// agent completes the deletion). LivePods (36) are alive at once.
//
// # Nemeses
//
// One at a time, at random moments, each followed by the wait for the node to converge (see
// sampler): kill-in-step (a plugin holds a NodeStage/Publish/Unpublish/UnstageVolume open and the
// agent is SIGKILLed inside it), kill-anytime, kill-twice (again right after the restart),
// api-outage (kube-apiserver stopped for 5–30 s over the same etcd, right after some pods were
// created and deleted), api-outage-and-kill, plugin-kill (SIGKILL and restart after up to 5 s:
// re-registration), plugin-hang (every node call hangs past the CSI timeout), error-code (every
// gRPC code in turn, uncertain and final, on a random node step or on every call) and disk-full
// (the root filled to ENOSPC for 5–20 s while records are written).
//
// # Invariants
//
// See Invariants; detectionTests (invariants_test.go) names the test that proves each one fires.
// The plugins' journals are read as they grow (Checker); the mount table is watched (poll(2) on
// /proc/self/mountinfo) for mounts of live pods that disappear, the agent's own unmounts included;
// the pods' conditions and the mount table are sampled twice a second, against bounds counted in
// healthy time (the agent ready, the API server up, no nemesis fault on the pod's plugins or the
// node); at the end every pod is deleted and the node must hold nothing: no mount, record,
// directory, loop device, VolumeAttachment, or staged or published volume in any plugin's state.
// Errors of the run (a nemesis that failed, a journal line that does not parse, a failed sample, a
// drain or a convergence that did not complete) fail it as a violation does (Report.Passed).
//
// # Replay
//
// Every random choice comes from Config.Seed: the workload, the nemeses and their parameters.
// The timing of the machine is not replayed, so a failing seed makes the same choices but may not
// fail the same way every time; the logs and journals of every run are kept.
package chaos
