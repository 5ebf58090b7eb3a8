// Command docgen writes the references under docs/reference from the code:
// flags.md (the cobra command tree), metrics.md (the collectors the agent
// registers), http.md (volumemanager.Endpoints) and reasons.md (the
// condition and Event reasons the code defines). `make docs` runs it;
// TestReferencesAreCurrent fails when the checked-in files differ from its
// output.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
)

func main() {
	out := flag.String("out", "docs/reference", "Directory the references are written to.")
	root := flag.String("root", ".", "Root of the module, whose Go sources the reasons are read from.")
	flag.Parse()
	files, err := generate(context.Background(), *root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "docgen:", err)
		os.Exit(1)
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "docgen:", err)
		os.Exit(1)
	}
	for _, name := range sortedKeys(files) {
		if err := os.WriteFile(filepath.Join(*out, name), files[name], 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "docgen:", err)
			os.Exit(1)
		}
	}
}
