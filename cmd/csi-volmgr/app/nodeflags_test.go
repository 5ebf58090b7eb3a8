package app

import (
	"reflect"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/csi-volmgr/csi-volmgr/cmd/csi-volmgr/app/config"
)

// TestNodeFlags: --register-node alone registers a Node that takes the
// pods that tolerate its default taint (110 pods, no cpu or memory); the
// flags change each part; without --register-node nothing of it reaches
// the volume manager, and a --node-cpu, --node-memory or changed
// --node-taints is refused.
func TestNodeFlags(t *testing.T) {
	pods := func(n int64) resource.Quantity { return *resource.NewQuantity(n, resource.DecimalSI) }
	for name, tc := range map[string]struct {
		args         []string
		wantCapacity corev1.ResourceList
		wantTaints   []corev1.Taint
		wantErr      string
	}{
		"defaults": {
			args:         []string{"--register-node"},
			wantCapacity: corev1.ResourceList{corev1.ResourcePods: pods(110)},
			wantTaints:   []corev1.Taint{config.DefaultNodeTaint},
		},
		"no registration": {},
		"all set": {
			args: []string{"--register-node", "--node-pods=20", "--node-cpu=8", "--node-memory=16Gi",
				"--node-taints=a=b:NoSchedule,c:NoExecute", "--node-taints=d:PreferNoSchedule"},
			wantCapacity: corev1.ResourceList{corev1.ResourcePods: pods(20), corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("16Gi")},
			wantTaints: []corev1.Taint{
				{Key: "a", Value: "b", Effect: corev1.TaintEffectNoSchedule}, {Key: "c", Effect: corev1.TaintEffectNoExecute},
				{Key: "d", Effect: corev1.TaintEffectPreferNoSchedule},
			},
		},
		"no pods, no taints": {args: []string{"--register-node", "--node-pods=0", "--node-taints="}},
		"negative pods":      {args: []string{"--register-node", "--node-pods=-1"}, wantErr: "--node-pods -1 must not be negative"},
		"bad cpu":            {args: []string{"--register-node", "--node-cpu=fast"}, wantErr: `--node-cpu "fast"`},
		"negative memory":    {args: []string{"--register-node", "--node-memory=-1Gi"}, wantErr: `--node-memory "-1Gi" must not be negative`},
		"cpu alone":          {args: []string{"--node-cpu=2"}, wantErr: "--node-cpu needs --register-node"},
		"taints alone": {
			args:       []string{"--node-taints=a:NoSchedule"},
			wantTaints: []corev1.Taint{{Key: "a", Effect: corev1.TaintEffectNoSchedule}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			o, _ := parseRun(t, tc.args...)
			capacity, err := o.nodeCapacity()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("nodeCapacity = %v, want an error with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(capacity, tc.wantCapacity) {
				t.Errorf("capacity %v, want %v", capacity, tc.wantCapacity)
			}
			if got := o.nodeTaints(); !reflect.DeepEqual(got, tc.wantTaints) {
				t.Errorf("taints %v, want %v", got, tc.wantTaints)
			}
		})
	}
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	NewRunOptions().AddFlags(fs)
	for _, bad := range []string{"--node-taints=nokey", "--node-taints=k=v:"} {
		if err := fs.Parse([]string{bad}); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
