package bench_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkZZSummary runs last (benchmarks run in the order of their
// files) and prints the whole table of this run, as the results directory
// holds it (table.md, results.json, latency-vs-n.svg, cpu-vs-n.svg).
func BenchmarkZZSummary(b *testing.B) {
	for range b.N {
		data, err := os.ReadFile(filepath.Join(resultsDir(), "table.md"))
		if err != nil {
			b.Skipf("no results yet: %v", err)
		}
		abs, _ := filepath.Abs(resultsDir())
		fmt.Printf("\n%s\n(written to %s)\n", data, abs)
	}
}
