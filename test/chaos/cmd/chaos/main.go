// Command chaos runs the chaos harness of package chaos once (make chaos): the real agent
// binary, a real kube-apiserver and the CSI test plugins, a workload of pods with volumes, and
// nemeses at random moments, with the invariants checked throughout and at the end. It prints
// the seed first and the figures last, writes them as Markdown to -report, and exits with
// status 1 when an invariant was violated or the run had an error (a nemesis that failed, a
// journal line that did not parse, a sample that failed, a drain or a convergence that did not
// complete). Run it as root from the repository.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/csi-volmgr/csi-volmgr/test/chaos"
)

func main() {
	os.Exit(run())
}

func run() int {
	var cfg chaos.Config
	seed := flag.Uint64("seed", 0, "seed of every random choice; 0 picks one from the clock (printed, so that a run can be replayed)")
	flag.DurationVar(&cfg.Duration, "duration", 10*time.Minute, "bound of the workload phase (the drain and the checks follow)")
	flag.IntVar(&cfg.Ops, "ops", 0, "end the workload phase once the agent made this many node operations and -kills kills (0: run for -duration)")
	flag.IntVar(&cfg.Kills, "kills", 0, "see -ops")
	flag.IntVar(&cfg.LivePods, "live-pods", chaos.DefaultLivePods, "pods the workload keeps alive at once")
	flag.DurationVar(&cfg.ShortestPodLife, "pod-lifetime-min", chaos.DefaultShortestPodLife, "shortest life of a pod")
	flag.DurationVar(&cfg.LongestPodLife, "pod-lifetime-max", chaos.DefaultLongestPodLife, "longest life of a pod")
	flag.DurationVar(&cfg.CSITimeout, "csi-timeout", 5*time.Second, "the agent's --csi-timeout")
	flag.DurationVar(&cfg.ReadyBound, "ready-bound", chaos.DefaultReadyBound, "how long a live pod may be without VolumesReady=True, in healthy time")
	flag.DurationVar(&cfg.OutageRecovery, "outage-recovery", 0, "time after an API server outage that is not yet healthy time (the agent's informers back off up to 30 s, jittered to 60 s, then once more after the 410 Gone of the restarted API server)")
	flag.DurationVar(&cfg.ReadyGrace, "ready-grace", chaos.DefaultReadyGrace, "how long a live pod may be VolumesReady=True with a target not mounted, in healthy time")
	flag.DurationVar(&cfg.ConvergeTimeout, "converge-timeout", 5*time.Minute, "bound of the wait for convergence after each nemesis and at the end")
	flag.IntVar(&cfg.AgentVerbosity, "v", 4, "the agent's log verbosity")
	nemeses := flag.String("nemeses", "", "comma-separated nemeses to run (default all): "+strings.Join(chaos.NemesisNames(), ", "))
	logDir := flag.String("logs", "", "directory for the logs and journals (default: a new directory under the temporary directory)")
	reportFile := flag.String("report", "", "also write the report (Markdown) to this file")
	flag.Parse()

	cfg.Seed = *seed
	if cfg.Seed == 0 {
		cfg.Seed = uint64(time.Now().UnixNano()) % 1_000_000_007
	}
	if *nemeses != "" {
		cfg.Nemeses = strings.Split(*nemeses, ",")
	}
	cfg.Log = os.Stdout
	if *logDir == "" {
		dir, err := os.MkdirTemp("", fmt.Sprintf("chaos-%d-", cfg.Seed))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		*logDir = dir
	}
	fmt.Printf("chaos: seed %d (replay with -seed=%d); logs in %s\n", cfg.Seed, cfg.Seed, *logDir)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	h, err := chaos.New(ctx, cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos: set-up: %v\n", err)
		return 2
	}
	rep, runErr := h.Run(ctx, *logDir)
	closeErr := h.Close()
	if rep != nil {
		rep.Command = "chaos " + strings.Join(os.Args[1:], " ")
		if !strings.Contains(rep.Command, "-seed") {
			rep.Command += fmt.Sprintf(" -seed=%d", cfg.Seed)
		}
		fmt.Println()
		rep.Write(os.Stdout)
		if *reportFile != "" {
			if err := os.MkdirAll(filepath.Dir(*reportFile), 0o755); err == nil {
				if f, err := os.Create(*reportFile); err == nil {
					rep.Write(f)
					_ = f.Close()
				}
			}
		}
	}
	if runErr != nil {
		fmt.Fprintf(os.Stderr, "chaos: %v\n", runErr)
	}
	if closeErr != nil {
		fmt.Fprintf(os.Stderr, "chaos: clean-up: %v\n", closeErr)
	}
	switch {
	case rep == nil:
		return 2
	case rep.Interrupted:
		fmt.Printf("chaos: interrupted, %d violations so far (seed %d)\n", len(rep.Violations), cfg.Seed)
		return 1
	case !rep.Passed():
		fmt.Printf("chaos: FAILED: %d violations", len(rep.Violations))
		for _, f := range rep.Failures() {
			fmt.Printf("; %s", f)
		}
		fmt.Printf(" (seed %d)\n", cfg.Seed)
		return 1
	}
	fmt.Printf("chaos: no violation (seed %d)\n", cfg.Seed)
	return 0
}
