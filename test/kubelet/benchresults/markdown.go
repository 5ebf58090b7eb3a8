package benchresults

import (
	"fmt"
	"math"
	"strings"
)

// Markdown renders the whole table: a header naming the commit, the
// machine and the settings, then per section a table of every row with a
// column per Column ("median (min–max)" of its runs) and, after each
// column but the reference, the ratio reference ÷ column of the medians.
func (f *File) Markdown() string {
	var sb strings.Builder
	m := f.Machine
	fmt.Fprintf(&sb, "Commit `%s` (%s), %s to %s UTC; %d CPUs (%s), %s memory, kernel %s, %s; load average %s before, %s after.\n",
		short(f.Commit), f.TreeState, f.Started.UTC().Format("2006-01-02 15:04"), f.Finished.UTC().Format("15:04"),
		m.NProc, m.CPUModel, kib(m.MemTotalKiB), m.Kernel, m.GoVersion, m.LoadBefore, m.LoadAfter)
	if len(f.Settings) > 0 {
		sb.WriteString("Settings: ")
		for i, k := range sortedKeys(f.Settings) {
			if i > 0 {
				sb.WriteString(", ")
			}
			fmt.Fprintf(&sb, "`%s=%s`", k, f.Settings[k])
		}
		sb.WriteString(".\n")
	}
	sb.WriteString("\nEach cell: median of the runs (min–max); ratio: the reference column's median ÷ that column's. Columns:\n\n")
	for _, c := range f.Columns {
		ref := ""
		if c.Reference {
			ref = " (reference)"
		}
		args := "no further flags"
		if len(c.Args) > 0 {
			args = "`" + strings.Join(c.Args, " ") + "`"
		}
		fmt.Fprintf(&sb, "- **%s**%s: %s at API budget %s, %s\n", c.ID, ref, c.Agent, c.Budget, args)
	}
	ref, hasRef := f.Reference()
	section := ""
	rows := f.Rows()
	for _, r := range rows {
		if r.Section != section {
			section = r.Section
			cols := f.columnsOf(rows, section)
			fmt.Fprintf(&sb, "\n#### %s\n\n| figure |", section)
			align := "|---|"
			for _, c := range cols {
				fmt.Fprintf(&sb, " %s |", c.ID)
				align += "---:|"
				if hasRef && c.ID != ref.ID && f.has(rows, section, ref.ID) {
					fmt.Fprintf(&sb, " %s ÷ |", ref.ID)
					align += "---:|"
				}
			}
			sb.WriteString("\n" + align + "\n")
		}
		fmt.Fprintf(&sb, "| %s |", r.Figure)
		for _, c := range f.columnsOf(rows, section) {
			cell, ok := r.Cells[c.ID]
			fmt.Fprintf(&sb, " %s |", cellText(cell, ok))
			if hasRef && c.ID != ref.ID && f.has(rows, section, ref.ID) {
				fmt.Fprintf(&sb, " %s |", ratioText(r.Cells[ref.ID], cell, ok))
			}
		}
		sb.WriteString("\n")
	}
	sb.WriteString("\nThe aims of issue 24, from this file:\n\n")
	for _, a := range f.Aims() {
		fmt.Fprintf(&sb, "- %s: %s.\n", a.Text, a.Result)
	}
	if len(f.Notes) > 0 {
		sb.WriteString("\nNotes of the run:\n\n")
		for _, n := range f.Notes {
			fmt.Fprintf(&sb, "- %s\n", n)
		}
	}
	return sb.String()
}

// columnsOf is the columns with a sample in section, in File order.
func (f *File) columnsOf(rows []Row, section string) []Column {
	var out []Column
	for _, c := range f.Columns {
		if f.has(rows, section, c.ID) {
			out = append(out, c)
		}
	}
	return out
}

func (f *File) has(rows []Row, section, column string) bool {
	for _, r := range rows {
		if r.Section == section {
			if _, ok := r.Cells[column]; ok {
				return true
			}
		}
	}
	return false
}

func cellText(c Cell, ok bool) string {
	switch {
	case !ok:
		return ""
	case c.N == 0:
		return c.Note
	}
	s := Format(c.Median)
	if c.Runs > 1 {
		s += " (" + Format(c.Min) + "–" + Format(c.Max) + ")"
	}
	if c.N < c.Runs {
		s += fmt.Sprintf(" [%d of %d runs; %s]", c.N, c.Runs, c.Note)
	}
	return s
}

func ratioText(ref, c Cell, ok bool) string {
	if !ok || ref.N == 0 || c.N == 0 || c.Median == 0 {
		return ""
	}
	return Format(ref.Median/c.Median) + "×"
}

// Format prints a value with three significant digits at most, whole
// numbers from 100 on.
func Format(v float64) string {
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

func short(commit string) string {
	if len(commit) > 12 {
		return commit[:12]
	}
	return commit
}

func kib(k uint64) string {
	return fmt.Sprintf("%.1f GiB", float64(k)/(1<<20))
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slicesSort(keys)
	return keys
}
