package app

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X .../app.version=...".
var version = "dev"

// Execute runs the csi-volmgr command line and returns the process exit code.
func Execute() int {
	if err := NewRootCommand(os.Stdout).Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "csi-volmgr:", err)
		return 1
	}
	return 0
}

// NewRootCommand builds the csi-volmgr command tree writing its output to out.
func NewRootCommand(out io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "csi-volmgr",
		Short:         "Node agent that runs the kubelet's CSI volume lifecycle for the pods of one node",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(out)
	root.AddCommand(newRunCommand(), newStatusCommand(), newDriversCommand(), newProbeCommand(), newVersionCommand())
	return root
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the csi-volmgr version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), version)
			return err
		},
	}
}
