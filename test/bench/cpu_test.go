package bench_test

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// clockTick is the unit of utime and stime in /proc/<pid>/stat (USER_HZ,
// 100 on Linux).
const clockTick = 10 * time.Millisecond

// cpuTimes is the CPU time (user + system) used so far by this process
// (the agent and the benchmark's clients) and by its child processes
// (kube-apiserver, etcd, the test plugin), keyed by command name, and the
// busy time of the whole machine under machineKey.
type cpuTimes map[string]time.Duration

// cpuNow reads the CPU times. Children that exited are not counted.
func cpuNow() cpuTimes {
	out := cpuTimes{}
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err == nil {
		out["bench (agent + clients)"] = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	self := os.Getpid()
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ... utime(14) stime(15): comm may hold
		// spaces, so split after its closing parenthesis.
		s := string(data)
		open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || closing < open {
			continue
		}
		fields := strings.Fields(s[closing+1:])
		if len(fields) < 13 {
			continue
		}
		if ppid, _ := strconv.Atoi(fields[1]); ppid != self {
			continue
		}
		// utime, stime, and cutime, cstime: the plugin's mount(8) runs.
		var ticks int64
		for _, f := range fields[11:15] {
			n, _ := strconv.ParseInt(f, 10, 64)
			ticks += n
		}
		out[s[open+1:closing]] += time.Duration(ticks) * clockTick
	}
	out[machineKey] = machineBusy()
	return out
}

// machineKey holds the busy time of every CPU of the machine.
const machineKey = "machine"

// machineBusy is the non-idle CPU time of the whole machine (/proc/stat).
func machineBusy() time.Duration {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	var ticks int64
	for i, f := range fields[1:] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		if i >= 8 { // guest times are already in user
			break
		}
		n, _ := strconv.ParseInt(f, 10, 64)
		ticks += n
	}
	return time.Duration(ticks) * clockTick
}

// since renders the CPU time used since before, per process, with the
// share of the wall time elapsed.
func (c cpuTimes) since(before cpuTimes, wall time.Duration) string {
	names := make([]string, 0, len(c))
	for n := range c {
		if n != machineKey {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	var sb strings.Builder
	var ours time.Duration
	row := func(name string, d time.Duration) {
		fmt.Fprintf(&sb, "\n  %-26s %8.2fs  %5.2f cores", name, d.Seconds(), d.Seconds()/wall.Seconds())
	}
	for _, n := range names {
		d := c[n] - before[n]
		ours += d
		row(n, d)
	}
	row("all of the above", ours)
	row("rest of the machine", c[machineKey]-before[machineKey]-ours)
	fmt.Fprintf(&sb, "\n  (wall %v, %d cores)", wall.Round(time.Millisecond), runtime.NumCPU())
	return sb.String()
}

// EnvProfileDir names an environment variable: when it is set, each
// benchmark writes a CPU profile of every measured window (from the first
// pod created, or the driver registered, to the last pod ready; and the
// ideal run) to <dir>/<benchmark>-<window>.cpu. go test's -cpuprofile, by
// contrast, covers setup and teardown too. The two cannot run at once.
const EnvProfileDir = "CSI_VOLMGR_BENCH_PROFILE_DIR"

// profileWindow starts a CPU profile of one window if EnvProfileDir is
// set, and returns the function that stops it.
func profileWindow(b *testing.B, window string) func() {
	b.Helper()
	dir := os.Getenv(EnvProfileDir)
	if dir == "" {
		return func() {}
	}
	name := strings.NewReplacer("/", "_", " ", "_").Replace(b.Name()) + "-" + window + ".cpu"
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		b.Fatalf("creating the window profile: %v", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		b.Fatalf("starting the window profile (not together with -cpuprofile): %v", err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			b.Errorf("writing %s: %v", f.Name(), err)
		}
	}
}
