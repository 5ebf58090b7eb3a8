package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/csi-volmgr/csi-volmgr/volumemanager"
	"github.com/csi-volmgr/csi-volmgr/volumemanager/vkubelet"
)

// processProvider is a virtual-kubelet provider that runs every container's
// command as a local process in a mount namespace of its own, with the
// pod's CSI volumes bound at their mountPaths (sandbox.go). It reports
// container states and the pod phase from the processes and stops them on
// delete. It pulls no image, restarts nothing and isolates nothing but the
// mount table: a test runtime and a demo, not a container runtime.
type processProvider struct {
	// self is this binary, started as the sandbox helper.
	self string
	// stateDir holds a directory per pod: container roots and logs.
	stateDir string
	// hostRoot is where the system directories the containers see (usr,
	// etc, bin, lib...) come from.
	hostRoot string
	// nodeName and started are the Node's, for the stats summary.
	nodeName string
	started  time.Time

	// mu guards pods and notify.
	mu     sync.Mutex
	pods   map[types.UID]*podRun
	notify func(*corev1.Pod)
}

// podRun is one pod and its processes.
type podRun struct {
	pod   *corev1.Pod
	procs map[string]*process
	// forgotten marks a pod deleted from the API server while its
	// processes ran: DeletePod drops it once they stopped.
	forgotten bool
}

type process struct {
	cmd  *exec.Cmd
	done chan struct{}
	// started and, once done is closed, finished and exitCode.
	started, finished time.Time
	exitCode          int
}

func newProcessProvider(o options) (*processProvider, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return &processProvider{
		self: self, stateDir: o.stateDir, hostRoot: o.hostRoot, nodeName: o.nodeName, started: time.Now(),
		pods: map[types.UID]*podRun{},
	}, nil
}

// NotifyPods registers the pod status callback.
func (p *processProvider) NotifyPods(_ context.Context, cb func(*corev1.Pod)) {
	p.mu.Lock()
	p.notify = cb
	p.mu.Unlock()
}

// CreatePod starts the pod's containers; the volume manager has published
// their volumes (vkubelet.MountedVolumes) and says which groups they ask
// for (vkubelet.ExtraSupplementalGroups).
func (p *processProvider) CreatePod(ctx context.Context, pod *corev1.Pod) error {
	logger := klog.FromContext(ctx).WithValues("pod", klog.KObj(pod), "podUID", pod.UID)
	mounted, _ := vkubelet.MountedVolumes(ctx)
	groups := vkubelet.ExtraSupplementalGroups(ctx)
	p.mu.Lock()
	if _, ok := p.pods[pod.UID]; ok {
		p.mu.Unlock()
		return nil
	}
	run := &podRun{pod: pod.DeepCopy(), procs: map[string]*process{}}
	p.pods[pod.UID] = run
	p.mu.Unlock()

	for _, c := range pod.Spec.Containers {
		proc, err := p.start(pod, &c, mounted, groups)
		if err != nil {
			logger.Error(err, "Cannot start container", "container", c.Name)
			p.stopAll(ctx, run, 0)
			p.mu.Lock()
			delete(p.pods, pod.UID)
			p.mu.Unlock()
			return err
		}
		logger.Info("Started container", "container", c.Name, "pid", proc.cmd.Process.Pid, "extraGroups", groups)
		p.mu.Lock()
		run.procs[c.Name] = proc
		p.mu.Unlock()
		go func() {
			<-proc.done
			logger.Info("Container exited", "container", c.Name, "exitCode", proc.exitCode)
			p.report(pod.UID)
		}()
	}
	p.report(pod.UID)
	return nil
}

// start starts one container's command through the sandbox helper, as
// the user and groups its security context says, with groups (the ones
// the pod's volumes ask for) among its supplemental groups.
func (p *processProvider) start(pod *corev1.Pod, c *corev1.Container, mounted map[string]volumemanager.MountedVolume, groups []int64) (*process, error) {
	if len(c.Command) == 0 {
		return nil, errdefs.InvalidInputf("container %s: the example runtime runs command, it has no images: command is required", c.Name)
	}
	dir := filepath.Join(p.stateDir, string(pod.UID), c.Name)
	if err := os.MkdirAll(filepath.Join(dir, "root"), 0o750); err != nil {
		return nil, err
	}
	args := []string{sandboxCommand, "--root", filepath.Join(dir, "root"), "--host-root", p.hostRoot}
	args = append(args, identityOf(pod, c, groups).args()...)
	for _, m := range c.VolumeMounts {
		v, ok := mounted[m.Name]
		if !ok || v.HostPath == "" {
			continue // not a CSI volume: the example runtime mounts only those
		}
		src := v.HostPath
		if m.SubPath != "" {
			src = filepath.Join(src, filepath.Clean("/"+m.SubPath))
		}
		args = append(args, "--bind", bind{src: src, dst: m.MountPath, readOnly: m.ReadOnly || v.ReadOnly}.String())
	}
	for _, d := range c.VolumeDevices {
		if v, ok := mounted[d.Name]; ok && v.DevicePath != "" {
			args = append(args, "--device", bind{src: v.DevicePath, dst: d.DevicePath}.String())
		}
	}
	args = append(append(append(args, "--"), c.Command...), c.Args...)
	log, err := os.OpenFile(filepath.Join(dir, "log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd := exec.Command(p.self, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = []string{"HOSTNAME=" + pod.Name}
	for _, e := range c.Env {
		cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	proc := &process{cmd: cmd, done: make(chan struct{}), started: time.Now()}
	go func() {
		_ = cmd.Wait()
		proc.finished, proc.exitCode = time.Now(), cmd.ProcessState.ExitCode()
		close(proc.done)
	}()
	return proc, nil
}

// UpdatePod keeps the new spec; running processes are not changed.
func (p *processProvider) UpdatePod(_ context.Context, pod *corev1.Pod) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if run, ok := p.pods[pod.UID]; ok {
		status := run.pod.Status
		run.pod = pod.DeepCopy()
		run.pod.Status = status
	}
	return nil
}

// DeletePod stops the pod's processes: SIGTERM, SIGKILL after the grace
// period. It returns once they are gone.
func (p *processProvider) DeletePod(ctx context.Context, pod *corev1.Pod) error {
	p.mu.Lock()
	run, ok := p.pods[pod.UID]
	p.mu.Unlock()
	if !ok {
		return errdefs.NotFoundf("pod %s/%s is not running here", pod.Namespace, pod.Name)
	}
	grace := 30 * time.Second
	if pod.DeletionGracePeriodSeconds != nil {
		grace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
	}
	p.stopAll(ctx, run, grace)
	klog.FromContext(ctx).Info("Stopped the pod's containers", "pod", klog.KObj(pod), "podUID", pod.UID)
	_ = os.RemoveAll(filepath.Join(p.stateDir, string(pod.UID)))
	p.report(pod.UID)
	p.mu.Lock()
	if run.forgotten {
		delete(p.pods, pod.UID)
	}
	p.mu.Unlock()
	return nil
}

// stopEverything stops every pod's processes, when the runtime stops: a
// test runtime keeps nothing across restarts.
func (p *processProvider) stopEverything(ctx context.Context) {
	p.mu.Lock()
	runs := make([]*podRun, 0, len(p.pods))
	for _, run := range p.pods {
		runs = append(runs, run)
	}
	p.mu.Unlock()
	for _, run := range runs {
		p.stopAll(ctx, run, 10*time.Second)
	}
}

// stopAll signals every process of the pod and waits until they exited.
func (p *processProvider) stopAll(ctx context.Context, run *podRun, grace time.Duration) {
	p.mu.Lock()
	procs := make([]*process, 0, len(run.procs))
	for _, proc := range run.procs {
		procs = append(procs, proc)
	}
	p.mu.Unlock()
	for _, proc := range procs {
		_ = syscall.Kill(-proc.cmd.Process.Pid, syscall.SIGTERM)
	}
	deadline := time.NewTimer(grace)
	defer deadline.Stop()
	for _, proc := range procs {
		select {
		case <-proc.done:
			continue
		case <-deadline.C:
		case <-ctx.Done():
		}
		_ = syscall.Kill(-proc.cmd.Process.Pid, syscall.SIGKILL)
		<-proc.done
	}
	// The leader's exit is not its group's: a container's other processes
	// (children its command forked) may still run, or not be reaped yet.
	// Its volumes go only once none is left, as a runtime waits for a
	// container's cgroup to empty.
	for _, proc := range procs {
		waitGroupGone(proc.cmd.Process.Pid, grace)
	}
}

// waitGroupGone waits until no process of the process group pgid is left,
// SIGKILLing what remains after grace, for at most twice grace.
func waitGroupGone(pgid int, grace time.Duration) {
	start := time.Now()
	for syscall.Kill(-pgid, 0) == nil {
		if time.Since(start) > grace {
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		}
		if time.Since(start) > 2*grace {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// report computes the pod's status from its processes and notifies the
// pod controller.
func (p *processProvider) report(uid types.UID) {
	p.mu.Lock()
	run, ok := p.pods[uid]
	notify := p.notify
	if !ok {
		p.mu.Unlock()
		return
	}
	pod := run.pod.DeepCopy()
	pod.Status = podStatus(run)
	run.pod.Status = pod.Status
	p.mu.Unlock()
	if notify != nil {
		notify(pod)
	}
}

// podStatus is Running while any process runs; Succeeded when all exited
// with 0, Failed otherwise (nothing is restarted).
func podStatus(run *podRun) corev1.PodStatus {
	st := corev1.PodStatus{Phase: corev1.PodRunning, HostIP: "127.0.0.1", PodIP: "127.0.0.1"}
	if run.pod.Status.StartTime != nil {
		st.StartTime = run.pod.Status.StartTime
	} else {
		now := metav1.Now()
		st.StartTime = &now
	}
	running, failed := 0, false
	for _, c := range run.pod.Spec.Containers {
		cs := corev1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: "none"}
		proc, ok := run.procs[c.Name]
		switch {
		case !ok:
			cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}
		case !proc.exited():
			cs.Ready, cs.Started = true, ptrTo(true)
			cs.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(proc.started)}
			running++
		default:
			cs.State.Terminated = &corev1.ContainerStateTerminated{
				ExitCode: int32(proc.exitCode), StartedAt: metav1.NewTime(proc.started), FinishedAt: metav1.NewTime(proc.finished),
				Reason: map[bool]string{true: "Completed", false: "Error"}[proc.exitCode == 0],
			}
			failed = failed || proc.exitCode != 0
		}
		st.ContainerStatuses = append(st.ContainerStatuses, cs)
	}
	ready := corev1.ConditionFalse
	switch {
	case running == len(run.pod.Spec.Containers):
		ready = corev1.ConditionTrue
	case running == 0 && len(run.procs) == len(run.pod.Spec.Containers) && failed:
		st.Phase = corev1.PodFailed
	case running == 0 && len(run.procs) == len(run.pod.Spec.Containers):
		st.Phase = corev1.PodSucceeded
	}
	now := metav1.Now()
	for _, t := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized} {
		st.Conditions = append(st.Conditions, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now})
	}
	for _, t := range []corev1.PodConditionType{corev1.ContainersReady, corev1.PodReady} {
		st.Conditions = append(st.Conditions, corev1.PodCondition{Type: t, Status: ready, LastTransitionTime: now})
	}
	return st
}

func ptrTo[T any](v T) *T { return &v }

// exited says whether the process is done; finished and exitCode may be
// read once it is.
func (proc *process) exited() bool {
	select {
	case <-proc.done:
		return true
	default:
		return false
	}
}

// GetPod returns a pod this provider runs.
func (p *processProvider) GetPod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, run := range p.pods {
		if run.pod.Namespace == namespace && run.pod.Name == name {
			return run.pod.DeepCopy(), nil
		}
	}
	return nil, errdefs.NotFoundf("pod %s/%s is not running here", namespace, name)
}

// GetPodStatus returns the status of a pod this provider runs.
func (p *processProvider) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	pod, err := p.GetPod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return &pod.Status, nil
}

// GetPods returns every pod this provider runs.
func (p *processProvider) GetPods(context.Context) ([]*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*corev1.Pod, 0, len(p.pods))
	for _, run := range p.pods {
		out = append(out, run.pod.DeepCopy())
	}
	return out, nil
}

// forget drops a deleted pod once its terminal status went out. A pod
// force-deleted while its processes run stays until DeletePod stopped
// them: GetPods keeps listing it, so the volume manager keeps its volumes
// (vkubelet.ReportRunningPods), and the pod controller finds it to delete.
func (p *processProvider) forget(uid types.UID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	run, ok := p.pods[uid]
	if !ok {
		return
	}
	for _, proc := range run.procs {
		if !proc.exited() {
			run.forgotten = true
			return
		}
	}
	delete(p.pods, uid)
}

// GetStatsSummary is the stats summary of the Node and its pods, for
// virtual-kubelet's /stats/summary: which pods and containers run since
// when. The example runtime measures no resource use; the stats of the
// pods' CSI volumes come from the volume manager (vkubelet.WithVolumeStats).
func (p *processProvider) GetStatsSummary(context.Context) (*statsv1alpha1.Summary, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := &statsv1alpha1.Summary{Node: statsv1alpha1.NodeStats{NodeName: p.nodeName, StartTime: metav1.NewTime(p.started)}}
	for _, run := range p.pods {
		ps := statsv1alpha1.PodStats{
			PodRef: statsv1alpha1.PodReference{Namespace: run.pod.Namespace, Name: run.pod.Name, UID: string(run.pod.UID)},
		}
		if st := run.pod.Status.StartTime; st != nil {
			ps.StartTime = *st
		}
		for _, c := range run.pod.Spec.Containers {
			if proc, ok := run.procs[c.Name]; ok {
				ps.Containers = append(ps.Containers, statsv1alpha1.ContainerStats{Name: c.Name, StartTime: metav1.NewTime(proc.started)})
			}
		}
		s.Pods = append(s.Pods, ps)
	}
	slices.SortFunc(s.Pods, func(a, b statsv1alpha1.PodStats) int {
		return strings.Compare(a.PodRef.Namespace+"/"+a.PodRef.Name, b.PodRef.Namespace+"/"+b.PodRef.Name)
	})
	return s, nil
}
