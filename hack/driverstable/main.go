// Command driverstable renders the compatibility table of docs/drivers.md from the committed
// results of `make drivers` (docs/drivers/results/*.json, written by the tests under test/drivers
// through test/drivers/driverresult). It replaces what lies between the markers
// `<!-- BEGIN drivers-table -->` and `<!-- END drivers-table -->` and prints the table. With
// -check it writes nothing and fails when docs/drivers.md differs from what the results render;
// TestDocMatchesResults runs that check in make test.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/csi-volmgr/csi-volmgr/test/drivers/driverresult"
)

func main() {
	results := flag.String("results", "docs/drivers/results", "Directory of the drivers' results (<name>.json).")
	doc := flag.String("doc", "docs/drivers.md", "Markdown file whose drivers-table markers receive the table.")
	check := flag.Bool("check", false, "Write nothing; fail when the file differs from what the results render.")
	quiet := flag.Bool("quiet", false, "Do not print the table.")
	flag.Parse()
	var out io.Writer = os.Stdout
	if *quiet {
		out = io.Discard
	}
	if err := run(*results, *doc, *check, out); err != nil {
		fmt.Fprintln(os.Stderr, "driverstable:", err)
		os.Exit(1)
	}
}

// run renders the results of dir into doc (or, with check, compares them) and prints the table.
func run(dir, doc string, check bool, out io.Writer) error {
	rs, err := driverresult.Load(dir)
	if err != nil {
		return err
	}
	have, err := os.ReadFile(doc)
	if err != nil {
		return err
	}
	table := Render(rs)
	want, err := Splice(string(have), table)
	if err != nil {
		return fmt.Errorf("%s: %w", doc, err)
	}
	if check {
		if want != string(have) {
			return fmt.Errorf("%s is stale: its drivers table is not what %s renders; run `go run ./hack/driverstable` (or make drivers) and commit it\n%s",
				doc, dir, firstDifference(string(have), want))
		}
		return nil
	}
	if want != string(have) {
		if err := os.WriteFile(doc, []byte(want), 0o644); err != nil {
			return err
		}
	}
	_, err = io.WriteString(out, table)
	return err
}
