package agent_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestConfigFile runs the agent binary with --config (issue 25): the
// file's settings shape the Node it registers (pods, cpu, labels, taints),
// while the flags agenttest gives (--node-name, --root-dir, --kubeconfig)
// override the file's.
func TestConfigFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(`apiVersion: config.csi-volmgr.io/v1alpha1
kind: CSIVolmgrConfiguration
nodeName: overridden-by-the-flag
rootDir: /overridden/by/the/flag
nodePods: 7
nodeCPU: "4"
nodeLabels:
  example.com/site: edge-1
nodeTaints:
  - key: example.com/edge
    effect: NoSchedule
`), 0o600); err != nil {
		t.Fatal(err)
	}
	n := newNode(t, nodeOptions{registerNode: true, extraArgs: []string{"--config", path}})
	n.startAgent(t)
	node, err := n.f.Client.CoreV1().Nodes().Get(t.Context(), n.f.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the Node the agent registers (--node-name over the file's nodeName): %v", err)
	}
	if pods, cpu := node.Status.Allocatable[corev1.ResourcePods], node.Status.Capacity[corev1.ResourceCPU]; pods.Value() != 7 || cpu.Value() != 4 {
		t.Errorf("Node allocatable pods %s, capacity cpu %s, want the file's 7 and 4", pods.String(), cpu.String())
	}
	if node.Labels["example.com/site"] != "edge-1" {
		t.Errorf("Node labels %v lack the file's example.com/site=edge-1", node.Labels)
	}
	if !slices.ContainsFunc(node.Spec.Taints, func(taint corev1.Taint) bool { return taint.Key == "example.com/edge" }) ||
		slices.ContainsFunc(node.Spec.Taints, func(taint corev1.Taint) bool { return taint.Key == "csi-volmgr.io/virtual" }) {
		t.Errorf("Node taints %v, want the file's example.com/edge instead of the default", node.Spec.Taints)
	}
}
