package drivertest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/csi-volmgr/csi-volmgr/test/agent/agenttest"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// AgentAsNode returns an agent, not started, that acts as system:node:<node>
// as the shipped installs run it (--node-identity --register-node, and
// extraArgs): the Node's client certificate from env is in its --cert-dir,
// where the CSR bootstrap would have left it (test/identity runs that
// bootstrap itself).
func AgentAsNode(t *testing.T, env *k8stest.Env, node string, verbosity int, extraArgs ...string) (*agenttest.Agent, error) {
	t.Helper()
	nodeCfg, err := env.NodeConfig(node)
	if err != nil {
		return nil, err
	}
	a := agenttest.New(t, agenttest.Options{
		KubeConfig: CertKubeconfig(t, env.Config, nodeCfg),
		NodeName:   node,
		Verbosity:  verbosity,
		ExtraArgs:  append([]string{"--node-identity", "--register-node"}, extraArgs...),
	})
	pki := filepath.Join(a.RootDir, "pki")
	if err := os.MkdirAll(pki, 0o700); err != nil {
		return nil, err
	}
	pem := append(append([]byte{}, nodeCfg.CertData...), nodeCfg.KeyData...)
	if err := os.WriteFile(filepath.Join(pki, "csi-volmgr-client-current.pem"), pem, 0o600); err != nil {
		return nil, err
	}
	return a, nil
}

// DriverInCSINode is the condition that node's CSINode lists driver with
// the node ID nodeID: the agent registered it.
func DriverInCSINode(c kubernetes.Interface, node, driver, nodeID string) wait.ConditionWithContextFunc {
	return func(ctx context.Context) (bool, error) {
		cn, err := c.StorageV1().CSINodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, d := range cn.Spec.Drivers {
			if d.Name == driver {
				return d.NodeID == nodeID, nil
			}
		}
		return false, nil
	}
}

// NothingLeft checks what the agent leaves once its pods are gone: no mount
// below its root, and — once poll saw it — no volume in its status (an
// entry goes once the volume worker forgets it, after the populator
// settled).
func NothingLeft(a *agenttest.Agent, poll func(what string, cond wait.ConditionWithContextFunc) error) error {
	left, err := agenttest.MountsBelow(a.RootDir)
	if err != nil {
		return err
	}
	if len(left) > 0 {
		return fmt.Errorf("mounts left below the agent's root: %v", left)
	}
	var vols []volumemanager.VolumeStatus
	if err := poll("the agent to report no volume", func(ctx context.Context) (bool, error) {
		vols, err = a.Volumes(ctx)
		return err == nil && len(vols) == 0, err
	}); err != nil {
		return fmt.Errorf("%w: it reports %+v", err, vols)
	}
	return nil
}
