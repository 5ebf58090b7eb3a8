// Package benchresults is the file `make bench-kubelet` writes
// (results.json: the commit, the machine, the settings and every sample of
// every run) and what is rendered from it: the Markdown table of
// docs/performance.md and the SVG charts (cmd/benchrender). The bench
// (package bench) writes it; nothing in it is typed by hand.
//
// A sample is one figure of one run of one column; a column is an agent at
// an API budget with its flags (e.g. csi-volmgr at the kubelet's 50/100).
// A row of the table is every sample of one section and key: per column
// the median of its runs and their spread (min–max), and the ratio of the
// reference column's median (the kubelet's) to each other column's.
package benchresults

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
	"time"
)

// SchemaVersion is the version of File's layout.
const SchemaVersion = 1

// File is results.json.
type File struct {
	Schema int `json:"schema"`
	// Commit is the git commit the agents were built from; TreeState is
	// "clean" or "dirty" (uncommitted changes to tracked files).
	Commit    string    `json:"commit"`
	TreeState string    `json:"treeState"`
	Started   time.Time `json:"started"`
	Finished  time.Time `json:"finished"`
	Machine   Machine   `json:"machine"`
	// Settings are the knobs of this run (runs per row, budgets, windows,
	// the KUBELET_BENCH_* environment), by name.
	Settings map[string]string `json:"settings"`
	// Columns are the agents and budgets compared, in table order; the
	// first one with Reference set is the ratios' numerator.
	Columns []Column `json:"columns"`
	Samples []Sample `json:"samples"`
	// Notes are lines under the table (floors, extrapolations).
	Notes []string `json:"notes,omitempty"`
}

// Machine is what the machine gave the run: its floors.
type Machine struct {
	NProc       int    `json:"nproc"`
	CPUModel    string `json:"cpuModel"`
	MemTotalKiB uint64 `json:"memTotalKiB"`
	Kernel      string `json:"kernel"`
	GoVersion   string `json:"goVersion"`
	// LoadBefore and LoadAfter are /proc/loadavg's first three fields
	// when the run began and when it ended (so far).
	LoadBefore string `json:"loadBefore"`
	LoadAfter  string `json:"loadAfter"`
}

// Column is one agent at one API budget.
type Column struct {
	// ID names it in samples, e.g. "kubelet", "csi-volmgr@50/100".
	ID string `json:"id"`
	// Agent is "kubelet" or "csi-volmgr"; Budget the API budget as
	// "QPS/burst", with "(defaults)" when it is the agent's own default.
	Agent  string `json:"agent"`
	Budget string `json:"budget"`
	// Args are its flags beyond the ones every column gets (kubeconfig,
	// node, directories, endpoint, -v).
	Args      []string `json:"args"`
	Reference bool     `json:"reference,omitempty"`
}

// Sample is one figure measured once.
type Sample struct {
	// Section heads the row's table; Pods is its N (0: none), which orders
	// the sections (see Sections).
	Section string `json:"section"`
	Pods    int    `json:"pods"`
	// Figure says what it is, with its unit; Key is its short name.
	Figure string `json:"figure"`
	Key    string `json:"key"`
	Column string `json:"column"`
	// Run counts from 0; Position is the column's place in the run's
	// order (the order alternates between runs).
	Run      int `json:"run"`
	Position int `json:"position"`
	// Value is nil when the figure is missing; Note says why (e.g. "did
	// not finish").
	Value *float64 `json:"value,omitempty"`
	Note  string   `json:"note,omitempty"`
	// At is when the column's run of the section ended; Load the load
	// average then.
	At   time.Time `json:"at"`
	Load string    `json:"load,omitempty"`
}

// Read reads a results file.
func Read(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f File
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if f.Schema != SchemaVersion {
		return nil, fmt.Errorf("%s: schema %d, want %d", path, f.Schema, SchemaVersion)
	}
	return &f, nil
}

// Write writes f to path (indented JSON).
func (f *File) Write(path string) error {
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// Cell is one column's runs of one row.
type Cell struct {
	// N is how many runs gave a value; Runs how many ran.
	N, Runs          int
	Median, Min, Max float64
	// Note is the first run's note when a run gave no value.
	Note string
}

// Row is one figure of one section, every column.
type Row struct {
	Section, Figure, Key string
	Pods                 int
	Cells                map[string]Cell
}

// Rows aggregates the samples into rows, in the order of their first
// sample within each section, the sections ordered as Sections orders
// them.
func (f *File) Rows() []Row {
	type key struct{ section, key string }
	var order []key
	vals := map[key]map[string][]Sample{}
	pods := map[string]int{}
	figure := map[key]string{}
	for _, s := range f.Samples {
		k := key{s.Section, s.Key}
		if vals[k] == nil {
			vals[k] = map[string][]Sample{}
			order = append(order, k)
			figure[k] = s.Figure
		}
		vals[k][s.Column] = append(vals[k][s.Column], s)
		pods[s.Section] = s.Pods
	}
	rank := map[string]int{}
	for i, s := range f.Sections() {
		rank[s] = i
	}
	slices.SortStableFunc(order, func(a, b key) int { return cmp.Compare(rank[a.section], rank[b.section]) })
	rows := make([]Row, 0, len(order))
	for _, k := range order {
		row := Row{Section: k.section, Key: k.key, Figure: figure[k], Pods: pods[k.section], Cells: map[string]Cell{}}
		for col, ss := range vals[k] {
			row.Cells[col] = aggregate(ss)
		}
		rows = append(rows, row)
	}
	return rows
}

// Sections are the sections in table order: those at 110 pods (the
// kubelet's max-pods) first, then 30, then the others by their pod count,
// those without one last; ties in the order of their first sample.
func (f *File) Sections() []string {
	var out []string
	pods := map[string]int{}
	for _, s := range f.Samples {
		if _, ok := pods[s.Section]; !ok {
			out = append(out, s.Section)
		}
		pods[s.Section] = s.Pods
	}
	rank := func(n int) int {
		switch {
		case n == 110:
			return -2
		case n == 30:
			return -1
		case n <= 0:
			return math.MaxInt
		}
		return n
	}
	sort.SliceStable(out, func(i, j int) bool { return rank(pods[out[i]]) < rank(pods[out[j]]) })
	return out
}

// standing are the keys of figures that cannot be below zero: what the API
// server holds for the agents. A negative sample means that what the
// figure subtracts (the API server's heap before) was not settled: it is
// shown as missing, with that reason, never as a value.
var standing = map[string]bool{"apiserver_heap_gib": true}

// notStanding is the note of a negative sample of a standing figure.
const notStanding = "not measured: negative (the API server's heap was not settled)"

func aggregate(ss []Sample) Cell {
	c := Cell{Runs: len(ss)}
	var vs []float64
	for _, s := range ss {
		switch {
		case s.Value != nil && standing[s.Key] && *s.Value < 0:
			if c.Note == "" {
				c.Note = notStanding
			}
		case s.Value != nil && !math.IsNaN(*s.Value):
			vs = append(vs, *s.Value)
		case c.Note == "":
			c.Note = s.Note
		}
	}
	c.N = len(vs)
	if c.N == 0 {
		if c.Note == "" {
			c.Note = "n/a"
		}
		return c
	}
	slices.Sort(vs)
	c.Min, c.Max = vs[0], vs[len(vs)-1]
	if len(vs)%2 == 1 {
		c.Median = vs[len(vs)/2]
	} else {
		c.Median = (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
	}
	return c
}

// Reference is the ratios' numerator column: the first with Reference set.
func (f *File) Reference() (Column, bool) {
	for _, c := range f.Columns {
		if c.Reference {
			return c, true
		}
	}
	return Column{}, false
}

// Median is the median of a key's samples of one column, over every
// section that has the key (the last such section's), for figures derived
// from others (extrapolations).
func (f *File) Median(key, column string) (float64, bool) {
	var found *Row
	for _, r := range f.Rows() {
		if r.Key == key {
			if c, ok := r.Cells[column]; ok && c.N > 0 {
				found = &r
			}
		}
	}
	if found == nil {
		return 0, false
	}
	return found.Cells[column].Median, true
}

func slicesSort(s []string) { slices.Sort(s) }
