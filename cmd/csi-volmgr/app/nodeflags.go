package app

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	cliflag "k8s.io/component-base/cli/flag"

	"github.com/csi-volmgr/csi-volmgr/cmd/csi-volmgr/app/config"
)

// addNodeFlags registers the flags of the Node that --register-node keeps.
func (o *RunOptions) addNodeFlags(fs *pflag.FlagSet) {
	c := o.CSIVolmgrConfiguration
	fs.IntVar(&c.NodePods, "node-pods", c.NodePods, "With --register-node: the pod capacity and allocatable of the Node, so that the scheduler places pods on it (the kubelet's default maxPods); 0 posts none, and pods reach the Node only by spec.nodeName.")
	fs.StringVar(&c.NodeCPU, "node-cpu", c.NodeCPU, "With --register-node: the cpu capacity and allocatable of the Node, a quantity (8, 500m); empty posts none, and pods with cpu requests are not scheduled to it.")
	fs.StringVar(&c.NodeMemory, "node-memory", c.NodeMemory, "With --register-node: the memory capacity and allocatable of the Node, a quantity (16Gi); empty posts none, and pods with memory requests are not scheduled to it.")
	fs.Var(cliflag.NewMapStringString(&c.NodeLabels), "node-labels", "With --register-node: labels of the Node besides the agent's own (key=value,...), kept by every status update.")
	fs.Var(&taintsValue{taints: &c.NodeTaints}, "node-taints", "With --register-node: taints of the Node (key[=value]:Effect,..., Effect one of NoSchedule, PreferNoSchedule, NoExecute), set when the agent registers or takes the Node, as the kubelet's --register-with-taints. The default keeps every pod that does not tolerate it off a node that may run no containers, as virtual-kubelet's provider taint does; --node-taints= registers the Node without taints.")
}

// nodeCapacity is the capacity of the registered Node of --node-pods,
// --node-cpu and --node-memory; none without --register-node (where
// --node-pods keeps its default, and --node-cpu or --node-memory is an
// error).
func (o *RunOptions) nodeCapacity() (corev1.ResourceList, error) {
	capacity := corev1.ResourceList{}
	var errs []error
	switch {
	case o.NodePods < 0:
		errs = append(errs, fmt.Errorf("--node-pods %d must not be negative", o.NodePods))
	case o.NodePods > 0 && o.RegisterNode:
		capacity[corev1.ResourcePods] = *resource.NewQuantity(int64(o.NodePods), resource.DecimalSI)
	}
	for _, q := range []struct {
		flag, value string
		name        corev1.ResourceName
	}{{"--node-cpu", o.NodeCPU, corev1.ResourceCPU}, {"--node-memory", o.NodeMemory, corev1.ResourceMemory}} {
		if q.value == "" {
			continue
		}
		if !o.RegisterNode {
			errs = append(errs, fmt.Errorf("%s needs --register-node: it shapes the Node the agent registers", q.flag))
			continue
		}
		parsed, err := resource.ParseQuantity(q.value)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s %q: %w", q.flag, q.value, err))
		case parsed.Sign() < 0:
			errs = append(errs, fmt.Errorf("%s %q must not be negative", q.flag, q.value))
		default:
			capacity[q.name] = parsed
		}
	}
	if len(capacity) == 0 {
		return nil, errors.Join(errs...)
	}
	return capacity, errors.Join(errs...)
}

// nodeTaints are the taints of the registered Node: --node-taints with
// --register-node; without it none, unless --node-taints was changed from
// its default (the volume manager then refuses it).
func (o *RunOptions) nodeTaints() []corev1.Taint {
	if o.RegisterNode || !slices.Equal(o.NodeTaints, config.Defaults().NodeTaints) {
		return o.NodeTaints
	}
	return nil
}

// taintsValue is the pflag.Value of --node-taints: key[=value]:Effect
// items separated by commas, as the kubelet's --register-with-taints and
// kubectl taint write them. The first Set replaces the default, later ones
// add to it. The volume manager validates the taints.
type taintsValue struct {
	taints *[]corev1.Taint
	set    bool
}

func (v *taintsValue) String() string {
	if v.taints == nil {
		return ""
	}
	out := make([]string, 0, len(*v.taints))
	for _, t := range *v.taints {
		out = append(out, t.ToString())
	}
	return strings.Join(out, ",")
}

func (v *taintsValue) Set(s string) error {
	var parsed []corev1.Taint
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}
		t, err := parseTaint(item)
		if err != nil {
			return err
		}
		parsed = append(parsed, t)
	}
	if !v.set {
		*v.taints = nil
	}
	*v.taints = append(*v.taints, parsed...)
	v.set = true
	return nil
}

func (v *taintsValue) Type() string { return "taints" }

// parseTaint parses key[=value]:Effect.
func parseTaint(s string) (corev1.Taint, error) {
	kv, effect, ok := strings.Cut(s, ":")
	if !ok || effect == "" {
		return corev1.Taint{}, fmt.Errorf("taint %q: want key[=value]:Effect", s)
	}
	key, value, _ := strings.Cut(kv, "=")
	return corev1.Taint{Key: key, Value: value, Effect: corev1.TaintEffect(effect)}, nil
}
