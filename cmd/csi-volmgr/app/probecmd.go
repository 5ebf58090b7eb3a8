package app

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// probeChecks are the checks `csi-volmgr probe` asks for, by the name a
// probe gives.
var probeChecks = map[string]string{
	"livez":   volumemanager.LivezPath,
	"healthz": volumemanager.HealthzPath,
	"readyz":  "/readyz",
}

// newProbeCommand is an exec probe for a container whose agent keeps its
// HTTP endpoint off the pod network: it asks the agent's API socket, so the
// kubelet's probes need no TCP port on the pod IP.
func newProbeCommand() *cobra.Command {
	o := &clientOptions{}
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "probe livez|healthz|readyz",
		Short: "Exit 0 when the agent answers the check with 200 over its API socket, non-zero (printing why) otherwise: an exec liveness or readiness probe",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path, ok := probeChecks[args[0]]
			if !ok {
				return fmt.Errorf("unknown check %q: want livez, healthz or readyz", args[0])
			}
			code, body, name, err := o.fetch(cmd.Context(), path+"?verbose", timeout)
			if err != nil {
				return err
			}
			if code != http.StatusOK {
				return fmt.Errorf("%s answered %s with %d: %s", name, args[0], code, strings.TrimSpace(string(body)))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&o.rootDir, "root-dir", "/var/lib/csi-volmgr", "The agent's --root-dir: the probe asks its API socket <root-dir>/"+volumemanager.SocketName+".")
	cmd.Flags().StringVar(&o.socket, "socket", "", "Path of the agent's API socket; empty means <root-dir>/"+volumemanager.SocketName+".")
	cmd.Flags().DurationVar(&timeout, "timeout", 3*time.Second, "How long to wait for the answer.")
	return cmd
}
