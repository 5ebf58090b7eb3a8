package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"strconv"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/check"
)

// checkStepCommand is the hidden command a check runs its volume manager
// processes with: one step, then SIGKILL.
const checkStepCommand = "check-step"

// newCheckCommand is `csi-volmgr check`: the kubelet's lifecycle against a
// CSI node plugin, scenario by scenario (lifecycle/check).
func newCheckCommand() *cobra.Command {
	var (
		cfg                   check.Config
		scenario, junit, out  string
		secretsFile           string
		verbosity             int
		params, volumeContext map[string]string
	)
	cmd := &cobra.Command{
		Use:   "check --endpoint unix:///path/csi.sock",
		Short: "Run the kubelet's volume lifecycle against a CSI node plugin, scenario by scenario, without a cluster; exit non-zero on any failure",
		Long: `check drives a CSI node plugin through the sequences the kubelet makes, with csi-volmgr's own
operations (the kubelet's paths, durable records, uncertain states and timeouts), in a scratch
root it removes afterwards, also after a failure or Ctrl-C. Scenarios: ` + fmt.Sprint(check.Scenarios()) + `.
Volumes are created through the driver's controller service when it offers one, else --volume-handle
is used; what the driver does not offer is skipped with the reason.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out != "table" && out != "json" {
				return fmt.Errorf("--output %q: want table or json", out)
			}
			if scenario != "" {
				re, err := regexp.Compile(scenario)
				if err != nil {
					return fmt.Errorf("--scenario: %w", err)
				}
				cfg.Scenario = re
			}
			cfg.Params, cfg.VolumeContext = params, volumeContext
			if secretsFile != "" {
				secrets, err := readCheckSecrets(secretsFile)
				if err != nil {
					return err
				}
				cfg.Secrets = secrets
			}
			self, err := os.Executable()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			logger := logr.Discard()
			klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
			klog.InitFlags(klogFlags)
			if verbosity > 0 {
				_ = klogFlags.Set("v", strconv.Itoa(verbosity))
				logger = klog.Background().WithName("csi-volmgr-check")
			} else {
				// The gRPC connection's own messages (a lost connection
				// while the driver restarts) go to the global logger.
				_ = klogFlags.Set("logtostderr", "false")
				_ = klogFlags.Set("stderrthreshold", "FATAL")
				klog.SetOutput(io.Discard)
			}
			ctx = klog.NewContext(ctx, logger)
			errOut := cmd.ErrOrStderr()
			// The crash scenarios' volume manager processes log as this
			// one does.
			cfg.Child = func(ctx context.Context) *exec.Cmd {
				child := exec.CommandContext(ctx, self, checkStepCommand, "--verbose="+strconv.Itoa(verbosity))
				if verbosity > 0 {
					child.Stderr = errOut
				}
				return child
			}
			cfg.Progress = func(name string, r *check.Result) {
				if r != nil {
					fmt.Fprintf(errOut, "%-26s %-8s %.2fs\n", name, r.Status, r.Duration.Seconds())
				}
			}
			report, runErr := check.Run(ctx, cfg)
			if report == nil {
				return runErr
			}
			if junit != "" {
				f, err := os.Create(junit)
				if err != nil {
					return err
				}
				err = report.WriteJUnit(f)
				if cerr := f.Close(); err == nil {
					err = cerr
				}
				if err != nil {
					return fmt.Errorf("writing %s: %w", junit, err)
				}
			}
			if out == "json" {
				err = report.WriteJSON(cmd.OutOrStdout())
			} else {
				err = report.WriteTable(cmd.OutOrStdout())
			}
			if err != nil {
				return err
			}
			if runErr != nil {
				return runErr
			}
			if report.Failed() {
				if len(report.Cleanup) > 0 {
					return fmt.Errorf("%d of %d scenarios failed, and the cleanup found %d problems", report.Count(check.Fail), len(report.Results), len(report.Cleanup))
				}
				return fmt.Errorf("%d of %d scenarios failed", report.Count(check.Fail), len(report.Results))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Endpoint, "endpoint", "", "The node plugin's CSI endpoint, unix:///path/csi.sock.")
	f.StringVar(&cfg.ControllerEndpoint, "controller-endpoint", "", "The controller plugin's CSI endpoint; empty means --endpoint. Its controller service creates, attaches, expands and deletes the check's volumes.")
	f.StringVar(&cfg.DriverCommand, "driver-command", "", "A shell command that runs the node plugin: the check starts it, kills (SIGKILL) and restarts it in the driver-restart scenario, and stops it at the end.")
	f.StringToStringVar(&params, "params", nil, "CreateVolume parameters, k=v,k2=v2.")
	f.StringVar(&cfg.VolumeHandle, "volume-handle", "", "A filesystem volume to use when the driver has no controller service to create volumes.")
	f.StringToStringVar(&volumeContext, "volume-context", nil, "The volume context of --volume-handle (with --ephemeral, the inline volume's volumeAttributes), k=v,k2=v2.")
	f.BoolVar(&cfg.ReadOnly, "read-only", false, "With --ephemeral: publish the inline volumes read-only (csi.readOnly: true), as drivers that serve only read-only volumes require; the scenarios check the driver's files instead of writing their own, and skip what needs to write.")
	f.BoolVar(&cfg.Ephemeral, "ephemeral", false, "Check CSI inline (ephemeral) volumes, as the kubelet publishes them for a driver with volumeLifecycleModes Ephemeral and podInfoOnMount: one volume per pod (volume_id csi-<sha256>), never created, attached or staged, published with --volume-context and the pod's information; the scenarios that share, keep, stage or expand a volume are skipped. For drivers that serve only inline volumes.")
	f.StringVar(&secretsFile, "secrets-file", "", "A file of the Secret the check's volumes name as nodeStageSecretRef, nodePublishSecretRef and nodeExpandSecretRef: a YAML or JSON object of string keys and values (a Secret's stringData), for drivers that take their credentials from there. Never logged or reported.")
	f.StringVar(&scenario, "scenario", "", "Run only the scenarios whose name matches this regular expression.")
	f.StringVar(&junit, "junit", "", "Also write the report as JUnit XML to this file.")
	f.StringVarP(&out, "output", "o", "table", "Report format: table or json.")
	f.StringVar(&cfg.ScratchDir, "scratch-dir", "", "Where the scratch root is made (and removed); empty means the system's temporary directory.")
	f.DurationVar(&cfg.Timeout, "timeout", 0, "Timeout of each CSI call; 0 means the kubelet's 2m.")
	f.IntVarP(&verbosity, "verbose", "v", 0, "Log the volume manager's steps to stderr at this klog verbosity (--verbose=N): -v alone means 4, each step and its outcome; 5 adds every CSI call's request and response, secrets redacted.")
	f.Lookup("verbose").NoOptDefVal = "4"
	_ = cmd.MarkFlagRequired("endpoint")
	return cmd
}

// newCheckStepCommand is the volume manager process of check's crash
// scenarios (check.RunChild); not for people.
func newCheckStepCommand() *cobra.Command {
	var verbosity int
	cmd := &cobra.Command{
		Use:    checkStepCommand,
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger := logr.Discard()
			if verbosity > 0 {
				klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
				klog.InitFlags(klogFlags)
				_ = klogFlags.Set("v", strconv.Itoa(verbosity))
				logger = klog.Background().WithName("csi-volmgr-check-step")
			}
			ctx := klog.NewContext(cmd.Context(), logger)
			if code := check.RunChild(ctx, cmd.InOrStdin(), cmd.OutOrStdout()); code != 0 {
				return errors.New("check step failed")
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&verbosity, "verbose", 0, "The check's --verbose.")
	return cmd
}

// readCheckSecrets reads --secrets-file: a YAML or JSON object of string keys
// and values. Its errors name the file, never a value.
func readCheckSecrets(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--secrets-file: %w", err)
	}
	var secrets map[string]string
	if err := yaml.UnmarshalStrict(data, &secrets); err != nil {
		return nil, fmt.Errorf("--secrets-file %s: want an object of string keys and values", path)
	}
	if len(secrets) == 0 {
		return nil, fmt.Errorf("--secrets-file %s: no key", path)
	}
	return secrets, nil
}
