package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/csi-volmgr/csi-volmgr/test/drivers/driverresult"
)

// The markers of docs/drivers.md between which the table is rendered.
const (
	BeginMarker = "<!-- BEGIN drivers-table -->"
	EndMarker   = "<!-- END drivers-table -->"
)

// Render is the Markdown of the results: a summary table of every driver, then per driver its
// steps (every check scenario and lifecycle step, with the reason of each failure and skip), the
// node plugin's flags, the settings of its install and the notes.
func Render(rs []driverresult.Result) string {
	var b strings.Builder
	b.WriteString("<!-- Rendered by `go run ./hack/driverstable` from docs/drivers/results/*.json (make drivers); do not edit. -->\n\n")
	if len(rs) == 0 {
		b.WriteString("No driver has been run yet: `make drivers` writes docs/drivers/results/ and renders this table.\n")
		return b.String()
	}
	b.WriteString("| driver | kind | built from | `csi-volmgr check` | lifecycle on kube-apiserver | seconds | run |\n")
	b.WriteString("|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "| [%s](#%s) (`%s`) | %s | `%s@%s` | %s | %s | %.0f | %s |\n",
			cell(r.Name), anchor(r.Name), cell(r.Driver), cell(r.Kind), cell(r.Module), cell(r.Version),
			counts(r.Checks), counts(r.Lifecycle), r.Seconds, cell(runOf(r)))
	}
	for _, r := range rs {
		fmt.Fprintf(&b, "\n### %s\n\n", r.Name)
		fmt.Fprintf(&b, "`%s`, %s, built from `%s@%s`; csi-volmgr `%s`, %s, %s; %.0f s in all.\n\n",
			r.Driver, r.Kind, r.Module, r.Version, r.Commit, r.Date, r.Machine, r.Seconds)
		if len(r.Checks)+len(r.Lifecycle) > 0 {
			b.WriteString("| part | step | result | seconds | why (failures and skips) |\n|---|---|---|---|---|\n")
			for _, part := range []struct {
				name  string
				steps []driverresult.Step
			}{{"check", r.Checks}, {"lifecycle", r.Lifecycle}} {
				for _, s := range part.steps {
					fmt.Fprintf(&b, "| %s | %s | %s | %.1f | %s |\n", part.name, cell(s.Name), mark(s.Result), s.Seconds, cell(s.Reason))
				}
			}
			b.WriteString("\n")
		}
		b.WriteString("Node plugin flags beside csi-volmgr:\n\n```\n")
		for _, f := range r.NodePluginFlags {
			b.WriteString(f + "\n")
		}
		b.WriteString("```\n")
		list(&b, "Settings of the driver's install", r.Settings)
		list(&b, "Notes", r.Notes)
	}
	return b.String()
}

func list(b *strings.Builder, title string, items []string) {
	if len(items) == 0 {
		return
	}
	fmt.Fprintf(b, "\n%s:\n\n", title)
	for _, s := range items {
		b.WriteString("- " + strings.ReplaceAll(strings.TrimSpace(s), "\n", "\n  ") + "\n")
	}
}

func counts(steps []driverresult.Step) string {
	if len(steps) == 0 {
		return "not run"
	}
	p, f, s := driverresult.Counts(steps)
	return fmt.Sprintf("%d passed, %d failed, %d skipped", p, f, s)
}

func runOf(r driverresult.Result) string {
	return fmt.Sprintf("`%s`, %s, %s", r.Commit, r.Date, r.Machine)
}

func mark(result string) string {
	switch result {
	case driverresult.Pass:
		return "pass"
	case driverresult.Fail:
		return "**FAIL**"
	default:
		return result
	}
}

// cell makes s safe inside a Markdown table cell.
func cell(s string) string {
	s = strings.ReplaceAll(strings.TrimSpace(s), "|", "\\|")
	return strings.Join(strings.Fields(s), " ")
}

// anchor is the GitHub heading anchor of a driver's section.
func anchor(name string) string {
	var b strings.Builder
	for _, c := range strings.ToLower(name) {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
			b.WriteRune(c)
		case c == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

// Splice puts table between the markers of doc, which must each appear once, in order.
func Splice(doc, table string) (string, error) {
	if strings.Count(doc, BeginMarker) != 1 || strings.Count(doc, EndMarker) != 1 {
		return "", fmt.Errorf("want %q and %q once each", BeginMarker, EndMarker)
	}
	begin := strings.Index(doc, BeginMarker) + len(BeginMarker)
	end := strings.Index(doc, EndMarker)
	if end < begin {
		return "", errors.New("the END marker comes before the BEGIN marker")
	}
	return doc[:begin] + "\n" + table + doc[end:], nil
}

// firstDifference shows the first line where have and want differ.
func firstDifference(have, want string) string {
	h, w := strings.Split(have, "\n"), strings.Split(want, "\n")
	for i := 0; i < len(h) || i < len(w); i++ {
		var hl, wl string
		if i < len(h) {
			hl = h[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if hl != wl {
			return fmt.Sprintf("line %d:\n  committed: %s\n  rendered:  %s", i+1, hl, wl)
		}
	}
	return ""
}
