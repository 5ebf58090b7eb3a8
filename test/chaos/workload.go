package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// volume kinds of the pool.
const (
	kindSharedFS = "shared filesystem (RWX, staged)"
	kindFS       = "filesystem (RWO, staged)"
	kindBlock    = "block (RWO, staged)"
	kindAttach   = "filesystem (RWO, attach required, staged)"
	kindDirect   = "filesystem (RWX, not staged)"
	kindInline   = "CSI inline"
)

// poolSizes is how many persistent volumes of each kind the run creates.
var poolSizes = []struct {
	kind string
	n    int
}{
	// Enough single-pod volumes for the live pods (about 0.6 of a pod's volumes are
	// single-pod), so that pods do not fall back on the shared ones and volumes keep being staged
	// and unstaged.
	{kindSharedFS, 4}, {kindFS, 20}, {kindBlock, 8}, {kindAttach, 16}, {kindDirect, 3},
}

// poolVolume is a persistent volume of the run, with its PV and claim.
type poolVolume struct {
	key            VolKey
	kind           string
	role           string
	shared, block  bool
	pvName, claim  string
	stagingPath    string
	stages, attach bool
}

// volumePool holds the persistent volumes and which live pods use them.
type volumePool struct {
	all    []*poolVolume
	byKind map[string][]*poolVolume
	byKey  map[VolKey]*poolVolume

	mu sync.Mutex
	// users counts the live pods (not being deleted) that use each volume.
	users map[VolKey]int
}

func (h *Harness) createVolumes(ctx context.Context, rng *rand.Rand) (*volumePool, error) {
	pool := &volumePool{byKind: map[string][]*poolVolume{}, byKey: map[VolKey]*poolVolume{}, users: map[VolKey]int{}}
	for _, ps := range poolSizes {
		for i := range ps.n {
			v := &poolVolume{kind: ps.kind, shared: ps.kind == kindSharedFS || ps.kind == kindDirect, block: ps.kind == kindBlock}
			switch ps.kind {
			case kindAttach:
				v.role = roleAttach
			case kindDirect:
				v.role = roleDirect
			default:
				v.role = roleStage
			}
			dp := h.plugins[v.role]
			v.stages, v.attach = dp.caps.StageUnstage, dp.caps.ControllerPublish
			name := fmt.Sprintf("%s-%d-%d", v.role, len(pool.all), rng.IntN(1000))
			handle, err := dp.createVolume(ctx, name, v.block)
			if err != nil {
				return nil, err
			}
			v.key = VolKey{Driver: dp.name, Handle: handle}
			v.pvName, v.claim = "pv-"+name, "pvc-"+name
			_ = i
			if err := h.createClaim(ctx, v); err != nil {
				return nil, err
			}
			if v.stages {
				v.stagingPath = h.stagingPath(v)
			}
			h.checker.AddVolume(Vol{Key: v.key, Stages: v.stages, StagingPath: v.stagingPath})
			pool.all = append(pool.all, v)
			pool.byKind[v.kind] = append(pool.byKind[v.kind], v)
			pool.byKey[v.key] = v
		}
	}
	return pool, nil
}

// take picks up to n distinct volumes for a new pod and counts it as their user: shared
// volumes always, single-user volumes only when no live pod uses them.
func (p *volumePool) take(rng *rand.Rand, n int) []*poolVolume {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*poolVolume
	for range n * 4 {
		if len(out) == n {
			break
		}
		kinds := []string{kindSharedFS, kindFS, kindBlock, kindAttach, kindDirect}
		vols := p.byKind[kinds[rng.IntN(len(kinds))]]
		v := vols[rng.IntN(len(vols))]
		if slices.Contains(out, v) || (!v.shared && p.users[v.key] > 0) {
			continue
		}
		out = append(out, v)
		p.users[v.key]++
	}
	return out
}

// release counts a pod that is being deleted out of its volumes' users.
func (p *volumePool) release(vols []*poolVolume) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, v := range vols {
		p.users[v.key]--
	}
}

// wanted says whether a live pod uses the volume.
func (p *volumePool) wanted(k VolKey) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.users[k] > 0
}

// workloadPod is a pod the workload made.
type workloadPod struct {
	name    string
	uid     types.UID
	vols    []*poolVolume
	inline  []string // spec names of CSI inline volumes
	targets []string
	// drivers are the drivers of the pod's volumes: a fault on one keeps the pod's time from
	// being healthy.
	drivers  []string
	created  time.Time
	deleteAt time.Time
	graceful bool
	// deleteIssued is set when the workload starts deleting the pod, lastDelete at each attempt;
	// gone when the API server no longer has it.
	deleteIssued, lastDelete time.Time
	gone                     bool
}

// redeleteAfter is how long a pod being deleted may stay before the delete is sent again.
const redeleteAfter = 5 * time.Second

// podSet holds the workload's pods.
type podSet struct {
	mu   sync.Mutex
	byID map[types.UID]*workloadPod
	// pending are pods whose create request failed in a way that may have created them.
	pending []*workloadPod
	next    int
	created int
	deleted int
}

func newPodSet() *podSet { return &podSet{byID: map[types.UID]*workloadPod{}} }

// snapshot returns the pods the API server has or had, not yet gone.
func (s *podSet) snapshot() []*workloadPod {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*workloadPod, 0, len(s.byID))
	for _, p := range s.byID {
		if !p.gone {
			cp := *p
			out = append(out, &cp)
		}
	}
	return out
}

// live counts the pods not being deleted.
func (s *podSet) live() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.pending)
	for _, p := range s.byID {
		if p.deleteIssued.IsZero() {
			n++
		}
	}
	return n
}

// runWorkload creates pods until LivePods are live and deletes each when its lifetime ends,
// until ctx ends or stop is closed.
func (h *Harness) runWorkload(ctx context.Context, stop <-chan struct{}) {
	rng := rand.New(rand.NewPCG(h.cfg.Seed, 2))
	tick := time.NewTicker(150 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-stop:
			return
		case <-tick.C:
		}
		if h.apiDown.Load() {
			continue
		}
		h.resolvePending(ctx)
		now := time.Now()
		for _, p := range h.pods.snapshot() {
			switch {
			case p.deleteIssued.IsZero() && now.After(p.deleteAt):
				h.deletePod(ctx, p.uid)
			case !p.deleteIssued.IsZero() && now.Sub(p.lastDelete) > redeleteAfter:
				// Again, in case the request was lost in an outage.
				h.deletePod(ctx, p.uid)
			}
		}
		for h.pods.live() < h.cfg.LivePods && ctx.Err() == nil && !h.apiDown.Load() {
			if !h.createPod(ctx, rng) {
				break
			}
		}
	}
}

// podVolumeCounts weighs how many volumes a pod has.
var podVolumeCounts = []int{1, 1, 1, 2, 2, 3}

// createPod creates one pod with random volumes. It returns false when the API server did not
// take it.
func (h *Harness) createPod(ctx context.Context, rng *rand.Rand) bool {
	h.pods.mu.Lock()
	h.pods.next++
	name := fmt.Sprintf("p%05d", h.pods.next)
	h.pods.mu.Unlock()
	vols := h.vols.take(rng, podVolumeCounts[rng.IntN(len(podVolumeCounts))])
	var inline []string
	if rng.IntN(4) == 0 {
		inline = append(inline, "inline-0")
	}
	if len(vols) == 0 && len(inline) == 0 {
		inline = append(inline, "inline-0")
	}
	p := &workloadPod{
		name: name, vols: vols, inline: inline,
		deleteAt: time.Now().Add(h.cfg.ShortestPodLife + time.Duration(rng.Int64N(int64(h.cfg.LongestPodLife-h.cfg.ShortestPodLife)+1))),
		graceful: rng.IntN(2) == 0,
	}
	pod := podObject(p)
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	created, err := h.client.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		if apierrors.IsAlreadyExists(err) || apierrors.IsInvalid(err) || apierrors.IsForbidden(err) {
			h.vols.release(vols)
			h.logf("chaos: creating pod %s: %v", name, err)
			return false
		}
		// The request may have reached the API server: find out later.
		h.pods.mu.Lock()
		h.pods.pending = append(h.pods.pending, p)
		h.pods.mu.Unlock()
		return false
	}
	h.registerPod(p, created)
	return true
}

// resolvePending finds out whether pods whose create request failed exist.
func (h *Harness) resolvePending(ctx context.Context) {
	h.pods.mu.Lock()
	pending := h.pods.pending
	h.pods.pending = nil
	h.pods.mu.Unlock()
	for i, p := range pending {
		gctx, cancel := context.WithTimeout(ctx, apiTimeout)
		got, err := h.client.CoreV1().Pods(namespace).Get(gctx, p.name, metav1.GetOptions{})
		cancel()
		switch {
		case err == nil:
			h.registerPod(p, got)
		case apierrors.IsNotFound(err):
			h.vols.release(p.vols)
		default:
			h.pods.mu.Lock()
			h.pods.pending = append(h.pods.pending, pending[i:]...)
			h.pods.mu.Unlock()
			return
		}
	}
}

// registerPod records a pod the API server has.
func (h *Harness) registerPod(p *workloadPod, pod *corev1.Pod) {
	p.uid, p.created = pod.UID, time.Now()
	cp := Pod{UID: p.uid, Name: p.name, Created: p.created}
	for _, v := range p.vols {
		access := volume.Filesystem
		if v.block {
			access = volume.Block
		}
		pub, err := h.layout.Publishing(p.uid, v.pvName, access)
		if err != nil {
			panic(fmt.Sprintf("chaos: target of %s in %s: %v", v.pvName, p.name, err))
		}
		p.targets = append(p.targets, pub.Target)
		p.addDriver(v.key.Driver)
		sub, err := h.layout.SubPaths(p.uid, v.pvName)
		if err != nil {
			panic(fmt.Sprintf("chaos: subPaths of %s in %s: %v", v.pvName, p.name, err))
		}
		cp.Volumes = append(cp.Volumes, PodVolume{Vol: v.key, Target: pub.Target, MapFile: pub.MapFile, SubPaths: sub})
	}
	for _, spec := range p.inline {
		key := VolKey{Driver: driverName(roleDirect), Handle: volume.InlineHandle(p.uid, spec)}
		h.checker.AddVolume(Vol{Key: key})
		pub, err := h.layout.Publishing(p.uid, spec, volume.Filesystem)
		if err != nil {
			panic(fmt.Sprintf("chaos: target of %s in %s: %v", spec, p.name, err))
		}
		p.targets = append(p.targets, pub.Target)
		p.addDriver(key.Driver)
		sub, err := h.layout.SubPaths(p.uid, spec)
		if err != nil {
			panic(fmt.Sprintf("chaos: subPaths of %s in %s: %v", spec, p.name, err))
		}
		cp.Volumes = append(cp.Volumes, PodVolume{Vol: key, Target: pub.Target, SubPaths: sub})
	}
	h.checker.AddPod(cp)
	h.pods.mu.Lock()
	h.pods.byID[p.uid] = p
	h.pods.created++
	h.pods.mu.Unlock()
}

func (p *workloadPod) addDriver(d string) {
	if !slices.Contains(p.drivers, d) {
		p.drivers = append(p.drivers, d)
	}
}

// podObject is the pod of p: one container that mounts the filesystem volumes and maps the
// block volumes.
func podObject(p *workloadPod) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: namespace},
		Spec: corev1.PodSpec{
			NodeName:   nodeName,
			Containers: []corev1.Container{{Name: "c", Image: "busybox"}},
		},
	}
	c := &pod.Spec.Containers[0]
	for i, v := range p.vols {
		spec := fmt.Sprintf("v%d", i)
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: spec, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: v.claim}}})
		if v.block {
			c.VolumeDevices = append(c.VolumeDevices, corev1.VolumeDevice{Name: spec, DevicePath: "/dev/" + spec})
		} else {
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: spec, MountPath: "/" + spec})
		}
	}
	for _, spec := range p.inline {
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: spec, VolumeSource: corev1.VolumeSource{
			CSI: &corev1.CSIVolumeSource{Driver: driverName(roleDirect)}}})
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: spec, MountPath: "/" + spec})
	}
	return pod
}

// deletePod deletes a pod: at once (grace period 0, as after its containers stopped) or
// gracefully, which the agent (--register-node) completes once the volumes are torn down. The
// pod stops being live from the first attempt on; a failed attempt is repeated by the workload.
// The sampler sees when the pod is gone.
func (h *Harness) deletePod(ctx context.Context, uid types.UID) {
	h.pods.mu.Lock()
	p := h.pods.byID[uid]
	first := p.deleteIssued.IsZero()
	now := time.Now()
	if first {
		p.deleteIssued = now
		h.checker.DeleteIssued(uid, now)
	}
	p.lastDelete = now
	name, graceful := p.name, p.graceful
	h.pods.mu.Unlock()
	if first {
		h.vols.release(p.vols)
	}
	opts := metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}
	if !graceful {
		opts.GracePeriodSeconds = ptr.To[int64](0)
	}
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	_ = h.client.CoreV1().Pods(namespace).Delete(ctx, name, opts)
}

// markGone records the pods the API server no longer has.
func (h *Harness) markGone(present map[types.UID]bool) {
	h.pods.mu.Lock()
	defer h.pods.mu.Unlock()
	for uid, p := range h.pods.byID {
		if !p.gone && !p.deleteIssued.IsZero() && !present[uid] {
			p.gone = true
			h.pods.deleted++
		}
	}
}
