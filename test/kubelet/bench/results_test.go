package bench_test

import (
	"encoding/json"
	"fmt"
	"image/color"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// EnvResults names an environment variable with the directory the
// benchmarks write their results into (make bench-kubelet: bench-results/
// of the repository; default: bench-results beside the module).
const EnvResults = "KUBELET_BENCH_RESULTS"

// book keeps every row the benchmarks of this run printed, and after each
// table rewrites the results directory: table.md (every row, kubelet /
// csi-volmgr / ratio, in the order measured), results.json, and the charts
// latency-vs-n.svg and cpu-vs-n.svg. A run that stops half-way leaves what
// it measured so far.
var book = &resultsBook{}

type resultsBook struct {
	// mu guards the fields below.
	mu    sync.Mutex
	rows  []resultRow
	notes []string
}

// resultRow is one printed row.
type resultRow struct {
	Section string   `json:"section"`
	Figure  string   `json:"figure"`
	Key     string   `json:"key"`
	Kubelet *float64 `json:"kubelet,omitempty"`
	Volmgr  *float64 `json:"csiVolmgr,omitempty"`
	// Notes say why a value is missing (e.g. "did not finish").
	KubeletNote string   `json:"kubeletNote,omitempty"`
	VolmgrNote  string   `json:"csiVolmgrNote,omitempty"`
	Ratio       *float64 `json:"ratio,omitempty"`
}

type chartPoint struct{ n, v float64 }

// add records the rows of one table.
func (r *resultsBook) add(section string, results [][]figure) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, f := range firstResults(results) {
		row := resultRow{Section: section, Figure: strings.TrimSpace(f.name), Key: f.key}
		var vals [2]figure
		for i := range agents {
			v, ok := find(results[i], f.key)
			v.missing = v.missing || !ok
			vals[i] = v
			if !ok {
				continue
			}
			val := v.value
			switch {
			case v.missing && i == 0:
				row.KubeletNote = v.note
			case v.missing:
				row.VolmgrNote = v.note
			case i == 0:
				row.Kubelet = &val
			default:
				row.Volmgr = &val
			}
		}
		if q, ok := ratio(vals[0], vals[1]); ok {
			row.Ratio = &q
		}
		r.rows = append(r.rows, row)
	}
	r.writeLocked()
}

// note adds a line under the table (floors, extrapolations).
func (r *resultsBook) note(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
	r.writeLocked()
}

// value returns a figure recorded earlier in this run, by key and agent.
func (r *resultsBook) value(key string, kubeletSide bool) (float64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, row := range slices.Backward(r.rows) {
		if row.Key != key {
			continue
		}
		v := row.Volmgr
		if kubeletSide {
			v = row.Kubelet
		}
		if v != nil {
			return *v, true
		}
	}
	return 0, false
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
	var sb strings.Builder
	fmt.Fprintf(&sb, "# csi-volmgr beside the kubelet's volume manager\n\n")
	fmt.Fprintf(&sb, "Written %s by `make bench-kubelet`; load average at the end: %s.\n\n", time.Now().UTC().Format(time.RFC3339), loadAverage())
	section := ""
	for _, row := range r.rows {
		if row.Section != section {
			section = row.Section
			fmt.Fprintf(&sb, "\n### %s\n\n| figure | kubelet | csi-volmgr | kubelet ÷ csi-volmgr |\n|---|---:|---:|---:|\n", section)
		}
		fmt.Fprintf(&sb, "| %s | %s | %s | %s |\n", row.Figure, cell(row.Kubelet, row.KubeletNote), cell(row.Volmgr, row.VolmgrNote), ratioCell(row.Ratio))
	}
	if len(r.notes) > 0 {
		sb.WriteString("\n### Notes\n\n")
		for _, n := range r.notes {
			fmt.Fprintf(&sb, "- %s\n", n)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "table.md"), []byte(sb.String()), 0o644); err != nil {
		fmt.Printf("bench-results: %v\n", err)
	}
	data, _ := json.MarshalIndent(struct {
		Rows  []resultRow `json:"rows"`
		Notes []string    `json:"notes"`
	}{r.rows, r.notes}, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "results.json"), data, 0o644); err != nil {
		fmt.Printf("bench-results: %v\n", err)
	}
	for chart, series := range chartSeries(r.rows) {
		for _, ext := range []string{".svg", ".png"} {
			if err := writeChart(filepath.Join(dir, chart+ext), chart, series); err != nil {
				fmt.Printf("bench-results: %s: %v\n", chart, err)
			}
		}
	}
}

// load reads the rows and notes of results.json, for a book that has none
// (BenchmarkZZSummary run on its own redraws the charts of an earlier run).
func (r *resultsBook) load() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	data, err := os.ReadFile(filepath.Join(resultsDir(), "results.json"))
	if err != nil {
		return err
	}
	var saved struct {
		Rows  []resultRow `json:"rows"`
		Notes []string    `json:"notes"`
	}
	if err := json.Unmarshal(data, &saved); err != nil {
		return err
	}
	r.rows, r.notes = saved.Rows, saved.Notes
	r.writeLocked()
	return nil
}

// chartSeries derives the charts' points from the rows: per agent, the
// serial added latency p50 and the burst p99 against the pod count, and
// the idle CPU after each against the volume count. The count is the
// number a section's name starts with ("1000 pods created …", "burst: 1000
// pods …").
func chartSeries(rows []resultRow) map[string]map[string][]chartPoint {
	out := map[string]map[string][]chartPoint{}
	add := func(chart, label string, n, v float64) {
		if out[chart] == nil {
			out[chart] = map[string][]chartPoint{}
		}
		out[chart][label] = append(out[chart][label], chartPoint{n, v})
	}
	for _, row := range rows {
		burst := strings.HasPrefix(row.Section, "burst: ")
		n, err := strconv.Atoi(strings.Fields(strings.TrimPrefix(row.Section, "burst: ") + " x")[0])
		if err != nil {
			continue
		}
		for _, side := range []struct {
			name string
			v    *float64
		}{{kubelet.name, row.Kubelet}, {volmgr.name, row.Volmgr}} {
			if side.v == nil {
				continue
			}
			switch {
			case row.Key == "added_p50_ms" && !burst:
				add("latency-vs-n", side.name+" serial, added p50", float64(n), *side.v)
			case row.Key == "burst_p99_s" && burst:
				add("latency-vs-n", side.name+" burst, p99", float64(n), *side.v*1e3)
			case row.Key == "idle_cpu_s_per_min" && burst:
				add("cpu-vs-n", side.name+" idle after burst", float64(n), *side.v)
			case row.Key == "idle_cpu_s_per_min":
				add("cpu-vs-n", side.name+" idle after serial", float64(n), *side.v)
			}
		}
	}
	return out
}

func cell(v *float64, note string) string {
	switch {
	case v != nil:
		return formatValue(*v)
	case note != "":
		return note
	}
	return "n/a"
}

func ratioCell(v *float64) string {
	if v == nil {
		return ""
	}
	return formatValue(*v) + "×"
}

func formatValue(v float64) string {
	switch a := math.Abs(v); {
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 0.01 || a == 0:
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.3g", v)
}

// The charts the results directory holds: their titles and axes.
var charts = map[string]struct{ title, x, y string }{
	"latency-vs-n": {"Pod created → volumes published: serial, added p50; burst, p99", "pods N", "ms (log)"},
	"cpu-vs-n":     {"Idle CPU with N volumes published", "volumes N", "CPU s per minute (log)"},
}

// writeChart draws one chart: a line per agent and series, log-log. A
// chart without a positive point is not drawn.
func writeChart(path, name string, series map[string][]chartPoint) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("drawing: %v", r)
		}
	}()
	c, ok := charts[name]
	if !ok {
		c.title, c.x, c.y = name, "N", ""
	}
	p := plot.New()
	p.Title.Text = c.title
	p.X.Label.Text, p.Y.Label.Text = c.x, c.y
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
	p.Legend.Top = true
	p.Legend.Left = true
	drawn := false
	minX, maxX, minY, maxY := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, label := range slices.Sorted(maps.Keys(series)) {
		pts := slices.Clone(series[label])
		pts = slices.DeleteFunc(pts, func(p chartPoint) bool { return p.n <= 0 || p.v <= 0 })
		if len(pts) == 0 {
			continue
		}
		slices.SortFunc(pts, func(a, b chartPoint) int { return int(math.Copysign(1, a.n-b.n)) })
		xys := make(plotter.XYs, len(pts))
		for j, pt := range pts {
			xys[j].X, xys[j].Y = pt.n, pt.v
			minX, maxX = math.Min(minX, pt.n), math.Max(maxX, pt.n)
			minY, maxY = math.Min(minY, pt.v), math.Max(maxY, pt.v)
		}
		line, points, err := plotter.NewLinePoints(xys)
		if err != nil {
			return err
		}
		color := volmgrColor
		if strings.HasPrefix(label, kubelet.name) {
			color = kubeletColor
		}
		line.Color, points.Color = color, color
		if strings.Contains(label, "burst") {
			line.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		p.Add(line, points)
		p.Legend.Add(label, line, points)
		drawn = true
	}
	if !drawn {
		return nil
	}
	// Explicit ranges, a factor of two around the points: a log axis over
	// a single value would start at or below zero.
	p.X.Min, p.X.Max = minX/2, maxX*2
	p.Y.Min, p.Y.Max = minY/2, maxY*2
	return p.Save(7*vg.Inch, 4.5*vg.Inch, path)
}

// The agents' colors in the charts.
var (
	kubeletColor = color.RGBA{R: 0xc0, G: 0x39, B: 0x2b, A: 0xff}
	volmgrColor  = color.RGBA{R: 0x1f, G: 0x5f, B: 0xbf, A: 0xff}
)

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
