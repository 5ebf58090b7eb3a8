package volumemanager

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// MountedVolume is one of a pod's volumes as a runtime hands it to its
// sandbox: a filesystem volume is bind-mounted from HostPath at each of
// the container's volumeMounts that name it, a block volume's DevicePath is
// exposed at each volumeDevices' devicePath.
type MountedVolume struct {
	// Name is the pod's name for the volume, pod.spec.volumes[].name.
	Name string `json:"name"`
	// AccessType is "Filesystem" or "Block".
	AccessType string `json:"accessType"`
	// HostPath is where a filesystem volume is mounted on the host (the
	// CSI target_path); empty for block volumes.
	HostPath string `json:"hostPath,omitempty"`
	// DevicePath is the pod's device of a block volume on the host: a
	// symbolic link at <root>/pods/<podUID>/volumeDevices/kubernetes.io~csi/<name>
	// to the published device (the CSI target_path), where the kubelet
	// keeps it; expose the device it resolves to. When the actual state
	// does not know the link (a publish reconstructed after a restart) it
	// is the CSI target_path, the published device itself. Empty for
	// filesystem volumes.
	DevicePath string `json:"devicePath,omitempty"`
	// ReadOnly says the volume was published read-only (the claim's or
	// inline volume's readOnly): mount it read-only in every container.
	ReadOnly bool `json:"readOnly"`
	// SELinuxContext is the SELinux context the volume was mounted with
	// (the context= mount option of its stage and publish): the pod's
	// containers run with the same label, or cannot use it. Empty when it
	// was mounted without one (no SELinux host, or a driver whose
	// CSIDriver has no seLinuxMount): the runtime relabels or runs as
	// it would for any other volume.
	SELinuxContext string `json:"seLinuxContext,omitempty"`
	// SupplementalGroup is the group the volume's PersistentVolume asks
	// its users to have (its pv.beta.kubernetes.io/gid annotation): every
	// container of the pod gets it as a supplemental group. Nil when none.
	// PodVolumes.SupplementalGroups and GetExtraSupplementalGroupsForPod
	// gather them per pod.
	SupplementalGroup *int64 `json:"supplementalGroup,omitempty"`
	// Driver, Handle and PVName say which volume it is; PVName is empty for
	// CSI inline volumes.
	Driver string `json:"driver"`
	Handle string `json:"handle"`
	PVName string `json:"pvName,omitempty"`
}

// PodVolumes is what the volume manager knows of one pod's volumes.
type PodVolumes struct {
	// UID, Namespace and Name identify the pod.
	UID       types.UID `json:"uid"`
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	// State is Ready (every volume the containers use is published),
	// Pending (some is not: Reason and Message say which and why),
	// TearingDown (the pod left the desired state; Volumes are still
	// published and are being unpublished) or AwaitingRuntime (the pod
	// left the desired state without its runtime's word that its
	// containers stopped: its volumes stay until ContainersStopped or a
	// RunningPods report without it; Message says why).
	State PodVolumesState `json:"state"`
	// Reason and Message are the pod condition's reason and message while
	// the pod is Pending, and why the pod awaits its runtime.
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Volumes are the pod's published volumes, sorted by name.
	Volumes []MountedVolume `json:"volumes"`
	// SupplementalGroups are the groups the pod's published volumes ask
	// for (their SupplementalGroup), sorted, each once: what the kubelet
	// adds to the supplemental groups of every container of the pod. A
	// runtime leaves out those the pod's securityContext.supplementalGroups
	// already has, as GetExtraSupplementalGroupsForPod does.
	SupplementalGroups []int64 `json:"supplementalGroups,omitempty"`
}

// PodVolumesState is the state of a pod's volumes.
type PodVolumesState string

// The states of a pod's volumes.
const (
	PodVolumesReady       PodVolumesState = "Ready"
	PodVolumesPending     PodVolumesState = "Pending"
	PodVolumesTearingDown PodVolumesState = "TearingDown"
	// PodVolumesAwaitingRuntime: the pod left the desired state (gone
	// from the API server, or found only on disk at start) and its volumes
	// stay mounted until its runtime says its containers stopped.
	PodVolumesAwaitingRuntime PodVolumesState = "AwaitingRuntime"
	// PodVolumesGone: the agent holds nothing of the pod (HTTP API only).
	PodVolumesGone PodVolumesState = "Gone"
)

// VolumesNotReadyError is returned by WaitForAttachAndMount when its
// context ends before the pod's volumes are published: Reason and Message
// are the per-step reason the pod condition carries.
type VolumesNotReadyError struct {
	// Pod is namespace/name of the pod.
	Pod string
	// Reason is the condition reason (e.g. WaitingForAttach,
	// NodeStageFailed), Message what blocks.
	Reason, Message string
	// Err is the context's error.
	Err error
}

func (e *VolumesNotReadyError) Error() string {
	return fmt.Sprintf("volumes of pod %s not ready: %s: %s", e.Pod, e.Reason, e.Message)
}

// Unwrap returns the context's error.
func (e *VolumesNotReadyError) Unwrap() error { return e.Err }

// ReasonAwaitingRuntime is the Reason of a pod in PodVolumesAwaitingRuntime.
const ReasonAwaitingRuntime = "AwaitingRuntime"

// ReasonPodNotKnown is the Reason of a VolumesNotReadyError for a pod the
// volume manager has not seen (yet): not bound to its node, or its
// claims not yet cached.
const ReasonPodNotKnown = "PodNotKnown"

// WaitForAttachAndMount returns nil once every volume the pod's containers
// use is attached and published, or a *VolumesNotReadyError with the step
// that holds it back when ctx ends first; bound ctx (the kubelet waits two
// minutes, then retries). It is woken by the lifecycle's events, never by
// polling. A pod whose containers use no CSI volume is ready at once.
func (vm *VolumeManager) WaitForAttachAndMount(ctx context.Context, pod *corev1.Pod) error {
	for {
		changed, release := vm.waiters.next(pod.UID)
		s, known := vm.waiters.lastStatus(pod.UID)
		if known && s.Ready {
			release()
			return nil
		}
		select {
		case <-ctx.Done():
			release()
			err := &VolumesNotReadyError{Pod: pod.Namespace + "/" + pod.Name, Reason: s.Reason, Message: s.Message, Err: context.Cause(ctx)}
			if !known {
				err.Reason = ReasonPodNotKnown
				err.Message = fmt.Sprintf("node %s has not resolved the pod's volumes yet (pod not bound to the node, or its claims and volumes not found yet)", vm.cfg.NodeName)
			}
			return err
		case <-changed:
			release()
		}
	}
}

// GetMountedVolumesForPod returns the pod's published volumes by the pod's
// name for them (pod.spec.volumes[].name); volumes still in progress are
// left out.
func (vm *VolumeManager) GetMountedVolumesForPod(uid types.UID) map[string]MountedVolume {
	out := map[string]MountedVolume{}
	for _, v := range vm.mountedVolumes(uid) {
		out[v.Name] = v
	}
	return out
}

// mountedVolumes returns the pod's published volumes sorted by name.
func (vm *VolumeManager) mountedVolumes(uid types.UID) []MountedVolume {
	desired, _ := vm.manager.DesiredPod(uid)
	uses := map[volume.Name]dsw.Use{}
	for _, u := range desired.Uses {
		uses[u.Name] = u
	}
	out := []MountedVolume{}
	for _, p := range vm.manager.PodVolumes(uid) {
		if p.State != volume.Published {
			continue
		}
		use, ok := uses[p.Key.Volume]
		if !ok {
			continue // left the desired state: being torn down
		}
		mv := MountedVolume{
			Name: use.Volume.SpecName, AccessType: use.Source.AccessType.String(), ReadOnly: use.Volume.ReadOnly,
			Driver: use.Source.Driver, Handle: use.Source.Handle, PVName: use.Source.PVName,
			SELinuxContext: p.Presentation.SELinuxContext,
		}
		if gid := use.Source.GID; gid != nil {
			mv.SupplementalGroup = new(*gid)
		}
		switch {
		case use.Source.AccessType != volume.Block:
			mv.HostPath = p.TargetPath
		case p.Presentation.DevicePath != "":
			mv.DevicePath = p.Presentation.DevicePath
		default:
			mv.DevicePath = p.TargetPath
		}
		out = append(out, mv)
	}
	slices.SortFunc(out, func(a, b MountedVolume) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// GetExtraSupplementalGroupsForPod returns the groups the pod's published
// volumes ask for (MountedVolume.SupplementalGroup) that the pod's
// securityContext.supplementalGroups does not already have, sorted: what
// a runtime adds to the supplemental groups of each of the pod's
// containers, as the kubelet's volume manager of the same name.
func (vm *VolumeManager) GetExtraSupplementalGroupsForPod(pod *corev1.Pod) []int64 {
	var own []int64
	if sc := pod.Spec.SecurityContext; sc != nil {
		own = sc.SupplementalGroups
	}
	out := []int64{}
	for _, g := range supplementalGroups(vm.mountedVolumes(pod.UID)) {
		if !slices.Contains(own, g) {
			out = append(out, g)
		}
	}
	return out
}

// supplementalGroups returns the groups of vols, sorted, each once.
func supplementalGroups(vols []MountedVolume) []int64 {
	var out []int64
	for _, v := range vols {
		if v.SupplementalGroup != nil {
			out = append(out, *v.SupplementalGroup)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// ContainersStopped tells the volume manager that the pod's containers
// have stopped and will not run again, so that its volumes may be torn
// down. With Config.WaitForContainersStopped it is what lets the volumes
// of a pod marked for deletion or gone from the API server go (besides the
// pod's terminal phase and RunningPods); a runtime calls it after its
// containers are gone, then WaitForUnmount. It never blocks.
//
// The signal counts whatever the API server says: for a pod force-deleted
// from it, and for a pod whose volumes were found on disk at start. It is
// the embedding runtime's own word and is not checked; a live pod it names
// leaves the desired state. Its HTTP form (POST
// /api/v1/pods/{namespace}/{name}/containers-stopped) is taken only for a
// pod being deleted, terminal or gone, under its own namespace and name.
func (vm *VolumeManager) ContainersStopped(uid types.UID) { vm.manager.ContainersStopped(uid) }

// RunningPods gives the volume manager the UIDs of every pod whose
// containers the runtime still runs (an empty list: none): the kubelet's
// "ask the runtime" step before it unmounts. With
// Config.WaitForContainersStopped, a pod that is gone from the API server
// (force-deleted, garbage collected) keeps its volumes until the runtime
// says its containers stopped (ContainersStopped) or a report that came
// after the pod left has no such pod; a pod found only on disk at start
// goes with any report without it. A runtime that never reports, nor
// signals, keeps such volumes mounted for ever: PodVolumes says so
// (PodVolumesAwaitingRuntime) and csi_volmgr_pods_awaiting_runtime counts
// them. Report periodically (virtual-kubelet's GetPods; vkubelet does it)
// and after containers stop. Without WaitForContainersStopped it does
// nothing. It never blocks.
func (vm *VolumeManager) RunningPods(uids []types.UID) { vm.manager.RunningPods(uids) }

// BeginRunningPods is RunningPods for a runtime whose list takes time (a
// remote provider's GetPods): call it right before listing, and the
// returned function with the list. The report then counts as of the call,
// so it does not release a pod that left the API server — and may have
// started — while the list was being taken. RunningPods counts as of its
// own call.
func (vm *VolumeManager) BeginRunningPods() func(uids []types.UID) {
	return vm.manager.BeginRunningPods()
}

// WaitForUnmount returns nil once none of the pod's volumes is published
// any more and the desired state wants none for it, or ctx's error. It is
// woken by the lifecycle's events, never by polling.
func (vm *VolumeManager) WaitForUnmount(ctx context.Context, pod *corev1.Pod) error {
	for {
		changed, release := vm.waiters.next(pod.UID)
		remaining := vm.volumesHeld(pod.UID)
		if remaining == 0 {
			release()
			return nil
		}
		select {
		case <-ctx.Done():
			release()
			return fmt.Errorf("waiting for the %d volumes of pod %s/%s to be unmounted: %w", remaining, pod.Namespace, pod.Name, context.Cause(ctx))
		case <-changed:
			release()
		}
	}
}

// volumesHeld counts the pod's volumes that are published (or may be) or
// still wanted.
func (vm *VolumeManager) volumesHeld(uid types.UID) int {
	held := len(vm.manager.PodVolumes(uid))
	if d, ok := vm.manager.DesiredPod(uid); ok {
		held = max(held, len(d.Uses))
	}
	return held
}

// PodVolumes returns what the volume manager knows of the pod's volumes;
// false when it holds nothing of the pod.
func (vm *VolumeManager) PodVolumes(uid types.UID) (PodVolumes, bool) {
	s, desired := vm.waiters.lastStatus(uid)
	held := vm.manager.PodVolumes(uid)
	if !desired && len(held) == 0 {
		return PodVolumes{}, false
	}
	p := PodVolumes{UID: uid, Volumes: vm.mountedVolumes(uid)}
	p.SupplementalGroups = supplementalGroups(p.Volumes)
	switch {
	case !desired:
		p.State = PodVolumesTearingDown
		if why, awaiting := vm.manager.AwaitingRuntime(uid); awaiting {
			p.State, p.Reason, p.Message = PodVolumesAwaitingRuntime, ReasonAwaitingRuntime, why
		}
		if info, ok := vm.waiters.name(uid); ok {
			p.Namespace, p.Name = info.Namespace, info.Name
		}
	case s.Ready:
		p.State, p.Namespace, p.Name = PodVolumesReady, s.Pod.Namespace, s.Pod.Name
	default:
		p.State, p.Namespace, p.Name = PodVolumesPending, s.Pod.Namespace, s.Pod.Name
		p.Reason, p.Message = s.Reason, s.Message
	}
	return p, true
}
