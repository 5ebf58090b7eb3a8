package bench_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/csi-volmgr/csi-volmgr/test/kubelet/benchresults"
)

const (
	// EnvResults names an environment variable with the directory the
	// benchmarks write their results into (make bench-kubelet:
	// bench-results/ of the repository; default: bench-results beside the
	// module).
	EnvResults = "KUBELET_BENCH_RESULTS"
	// EnvCommit and EnvTreeState name environment variables with the
	// commit the agents were built from and "clean" or "dirty" (make
	// bench-kubelet sets them; default: asked of git).
	EnvCommit    = "KUBELET_BENCH_COMMIT"
	EnvTreeState = "KUBELET_BENCH_TREE_STATE"
)

// book keeps every sample the benchmarks of this run measured, and after
// each scenario rewrites the results directory: results.json (package
// benchresults: commit, machine, settings, columns, every sample), table.md
// (rendered from it as docs/performance.md's table is) and the charts as
// SVG. A run that stops half-way leaves what it measured so far.
var book = newBook()

type resultsBook struct {
	// mu guards f.
	mu sync.Mutex
	f  benchresults.File
}

func newBook() *resultsBook {
	return &resultsBook{f: benchresults.File{
		Schema:    benchresults.SchemaVersion,
		Commit:    commit(),
		TreeState: treeState(),
		Started:   time.Now().UTC(),
		Machine:   machine(),
		Settings:  settings(),
	}}
}

// add records one run of one column of a section.
func (r *resultsBook) add(section string, pods int, col *column, run, position int, figs []figure) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.addColumnLocked(col)
	at, load := time.Now().UTC(), loadAverage()
	for _, f := range figs {
		s := benchresults.Sample{Section: section, Pods: pods, Figure: strings.TrimSpace(f.name), Key: f.key,
			Column: col.id, Run: run, Position: position, At: at, Load: load}
		if f.missing {
			s.Note = f.note
			if s.Note == "" {
				s.Note = "n/a"
			}
		} else {
			v := f.value
			s.Value = &v
		}
		r.f.Samples = append(r.f.Samples, s)
	}
	r.writeLocked()
}

func (r *resultsBook) addColumnLocked(col *column) {
	for _, c := range r.f.Columns {
		if c.ID == col.id {
			return
		}
	}
	r.f.Columns = append(r.f.Columns, benchresults.Column{ID: col.id, Agent: col.kind.name, Budget: col.budget,
		Args: col.args, Reference: col.reference})
	// Table order: the kubelet, csi-volmgr at its budget, at its own
	// defaults, the other columns.
	rank := map[string]int{colKubelet.id: 0, colVolmgr.id: 1, colVolmgrDefaults.id: 2, colVolmgrWatch.id: 3}
	sort.SliceStable(r.f.Columns, func(i, j int) bool { return rank[r.f.Columns[i].ID] < rank[r.f.Columns[j].ID] })
}

// setting records a knob's effective value (with its default applied).
func (r *resultsBook) setting(name string, value any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f.Settings == nil {
		r.f.Settings = map[string]string{}
	}
	r.f.Settings[name] = fmt.Sprint(value)
}

// note adds a line under the table (floors, extrapolations).
func (r *resultsBook) note(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.f.Notes = append(r.f.Notes, fmt.Sprintf(format, args...))
	r.writeLocked()
}

// value is the median of a figure recorded earlier in this run, by key,
// of the kubelet or of csi-volmgr at the kubelet's budget.
func (r *resultsBook) value(key string, kubeletSide bool) (float64, bool) {
	f := r.snapshot()
	col := colVolmgr.id
	if kubeletSide {
		col = colKubelet.id
	}
	return f.Median(key, col)
}

// snapshot is a copy of the results so far.
func (r *resultsBook) snapshot() *benchresults.File {
	r.mu.Lock()
	defer r.mu.Unlock()
	f := r.f
	f.Samples = append([]benchresults.Sample(nil), r.f.Samples...)
	f.Columns = append([]benchresults.Column(nil), r.f.Columns...)
	f.Notes = append([]string(nil), r.f.Notes...)
	return &f
}

func resultsDir() string {
	if d := os.Getenv(EnvResults); d != "" {
		return d
	}
	return filepath.Join("..", "..", "..", "bench-results")
}

// writeLocked rewrites the results directory; errors are printed, not
// fatal: the figures are on stdout too.
func (r *resultsBook) writeLocked() {
	dir := resultsDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Printf("bench-results: %v\n", err)
		return
	}
	r.f.Finished = time.Now().UTC()
	r.f.Machine.LoadAfter = loadAverage()
	if err := r.f.Write(filepath.Join(dir, "results.json")); err != nil {
		fmt.Printf("bench-results: %v\n", err)
	}
	table := "# csi-volmgr beside the kubelet's volume manager\n\n" + r.f.Markdown()
	if err := os.WriteFile(filepath.Join(dir, "table.md"), []byte(table), 0o644); err != nil {
		fmt.Printf("bench-results: %v\n", err)
	}
	for _, c := range benchresults.Charts {
		if svg, ok := r.f.SVG(c); ok {
			if err := os.WriteFile(filepath.Join(dir, c.Name+".svg"), []byte(svg), 0o644); err != nil {
				fmt.Printf("bench-results: %v\n", err)
			}
		}
	}
}

// load reads results.json of an earlier run, for a book that has none
// (BenchmarkZZSummary run on its own redraws the table and charts).
func (r *resultsBook) load() error {
	f, err := benchresults.Read(filepath.Join(resultsDir(), "results.json"))
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.f = *f
	r.writeLocked()
	return nil
}

// empty reports whether nothing was recorded.
func (r *resultsBook) empty() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.f.Samples) == 0
}

// loadAverage is /proc/loadavg's first three fields.
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func commit() string {
	if c := os.Getenv(EnvCommit); c != "" {
		return c
	}
	out, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

func treeState() string {
	if s := os.Getenv(EnvTreeState); s != "" {
		return s
	}
	out, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output()
	switch {
	case err != nil:
		return "unknown"
	case len(strings.TrimSpace(string(out))) > 0:
		return "dirty"
	}
	return "clean"
}

// machine is the machine's floors: CPUs, CPU model, memory, kernel, and
// the load average as the run begins.
func machine() benchresults.Machine {
	m := benchresults.Machine{NProc: runtime.NumCPU(), GoVersion: runtime.Version(), LoadBefore: loadAverage()}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(data)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		for line := range strings.Lines(string(data)) {
			if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				m.MemTotalKiB, _ = strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			}
		}
	}
	if data, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(data))
	}
	return m
}

// settings are the KUBELET_BENCH_* variables this run was given (the
// defaults of the others are in doc.go), and the runs per row.
func settings() map[string]string {
	out := map[string]string{}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "KUBELET_BENCH_") && k != EnvResults && k != EnvCommit && k != EnvTreeState {
			out[k] = v
		}
	}
	return out
}
