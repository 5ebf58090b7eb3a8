package volumemanager_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
)

// The block of docs/performance.md that renderFlood writes, between
// these markers; its first line names the result file.
const (
	floodDoc      = "../docs/performance.md"
	floodBegin    = "<!-- flood:begin -->"
	floodEnd      = "<!-- flood:end -->"
	floodUpdate   = "FLOOD_DOCS_UPDATE"
	floodRendered = "<!-- rendered by TestFloodDocs (volumemanager/flooddocs_test.go) from %s; do not edit -->"
)

// TestFloodDocs checks that docs/performance.md's flood figures are the
// rendering of the result file they name (committed under docs/bench/);
// with FLOOD_DOCS_UPDATE=docs/bench/<file>.json it renders that file into
// the page instead.
func TestFloodDocs(t *testing.T) {
	doc, err := os.ReadFile(floodDoc)
	if err != nil {
		t.Fatal(err)
	}
	before, rest, ok := strings.Cut(string(doc), floodBegin+"\n")
	block, after, ok2 := strings.Cut(rest, floodEnd)
	if !ok || !ok2 {
		t.Fatalf("%s has no %s ... %s block", floodDoc, floodBegin, floodEnd)
	}
	file := os.Getenv(floodUpdate)
	if file == "" {
		var rendered string
		if _, err := fmt.Sscanf(strings.SplitN(block, "\n", 2)[0], strings.ReplaceAll(floodRendered, " from %s; do not edit -->", " from %s"), &file); err != nil {
			t.Fatalf("the block's first line names no result file: %v", err)
		}
		file = strings.TrimSuffix(file, ";")
		if rendered, err = renderFloodFile(file); err != nil {
			t.Fatal(err)
		}
		if rendered != block {
			t.Errorf("%s's flood figures are not the rendering of %s; run %s=%s go test -run '^TestFloodDocs$' ./volumemanager/", floodDoc, file, floodUpdate, file)
		}
		return
	}
	rendered, err := renderFloodFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(floodDoc, []byte(before+floodBegin+"\n"+rendered+floodEnd+after), 0o644); err != nil {
		t.Fatal(err)
	}
}

// renderFloodFile renders the result file at path (relative to the
// repository's root) as the block of docs/performance.md.
func renderFloodFile(path string) (string, error) {
	b, err := os.ReadFile("../" + path)
	if err != nil {
		return "", err
	}
	var res FloodResult
	if err := json.Unmarshal(b, &res); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	var w strings.Builder
	fmt.Fprintf(&w, floodRendered+"\n\n", path)
	fmt.Fprintf(&w, "Commit `%s`, %s; %s; %d CPUs; load average %s before, %s after.\n", res.Commit, res.Date, res.Machine, res.CPUs, res.LoadBefore, res.LoadAfter)
	fmt.Fprintf(&w, "Each agent: %d bursts of %d pods without the flood and %d with it, alternately; the flood: %d clients sending made-up bearer tokens to `/api/v1/pods`, %d requests a second in all, from 127.0.0.1, and %d connections held idle from 127.0.0.2 (opened again 100 ms after the agent closes one).\n\n",
		res.Bursts, res.Pods, res.Bursts, res.Flooders, res.FloodRate, res.IdleConns)
	w.WriteString("| agent | bursts without the flood (s) | bursts with it (s) | ratio of the medians | heap in use, before → after (MiB) | the flood's answers | TokenReviews while it ran |\n")
	w.WriteString("|---|---|---|---:|---:|---|---:|\n")
	for _, m := range res.Runs {
		what := map[string]string{
			"bounded":   "with the bounds (this change)",
			"unbounded": "without them (reviews on the volumes' budget, no failure or connection limit: before)",
		}[m.Mode]
		var answers []string
		for _, k := range slices.Sorted(maps.Keys(m.FloodRequests)) {
			answers = append(answers, fmt.Sprintf("%s: %d", k, m.FloodRequests[k]))
		}
		fmt.Fprintf(&w, "| %s | %s | %s | %.2f | %.1f → %.1f | %s | %d in %.0f s |\n", what, seconds(m.QuietSeconds), seconds(m.FloodSeconds),
			m.Ratio, m.HeapBeforeMiB, m.HeapAfterMiB, strings.Join(answers, ", "), m.TokenReviews, m.FloodWindowSeconds)
	}
	fmt.Fprintf(&w, "\nThe command:\n\n```sh\n%s\n```\n", res.Command)
	return w.String(), nil
}

func seconds(xs []float64) string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = fmt.Sprintf("%.2f", x)
	}
	return strings.Join(out, ", ")
}
