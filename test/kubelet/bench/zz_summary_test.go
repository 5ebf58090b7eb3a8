package bench_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkZZSummary runs last (benchmarks run in the order of their
// files) and prints the whole table of this run, as the results directory
// holds it (results.json, table.md rendered from it, the charts as SVG).
// Run on its own it renders them again from the last run's results.json.
func BenchmarkZZSummary(b *testing.B) {
	if book.empty() {
		if err := book.load(); err != nil {
			b.Skipf("no results: %v", err)
		}
	}
	for range b.N {
		data, err := os.ReadFile(filepath.Join(resultsDir(), "table.md"))
		if err != nil {
			b.Skipf("no results yet: %v", err)
		}
		abs, _ := filepath.Abs(resultsDir())
		fmt.Printf("\n%s\n(written to %s)\n", data, abs)
	}
}
