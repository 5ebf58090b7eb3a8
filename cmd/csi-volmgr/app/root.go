package app

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/csi-volmgr/csi-volmgr/volumemanager/buildinfo"
)

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
	root.AddCommand(newRunCommand(), newStatusCommand(), newDriversCommand(), newProbeCommand(), newVersionCommand(), newConfigCommand(),
		newCheckCommand(), newCheckStepCommand())
	root.AddCommand(newApproveCommand())
	return root
}

func newVersionCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the csi-volmgr version: git version, commit, tree state, build date, Go version and platform",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			info := buildinfo.Get()
			switch output {
			case "":
				_, err := fmt.Fprintf(cmd.OutOrStdout(), "csi-volmgr %s (commit %s, tree %s, built %s, %s, %s)\n",
					info.GitVersion, orUnknown(info.GitCommit), orUnknown(info.GitTreeState), info.BuildDate, info.GoVersion, info.Platform)
				return err
			case "json":
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(info)
			default:
				return fmt.Errorf("--output %q: want json, or nothing for one line", output)
			}
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "Output format: empty for one line, or json.")
	return cmd
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
