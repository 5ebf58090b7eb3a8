// Command benchrender renders the performance table and the charts from a
// results file of `make bench-kubelet` (package benchresults), so that no
// figure in the documentation is typed by hand:
//
//	benchrender -in docs/bench/<date>-<commit>.json -md docs/performance.md -svg docs/bench
//
// The table replaces what stands between the lines
// "<!-- benchrender:begin -->" and "<!-- benchrender:end -->" of each -md
// file ("<!-- benchrender:NAME:begin -->" … with -name NAME), the results
// file named above it (-source, default -in); -headline renders the short
// table README shows instead; each chart of
// benchresults.Charts with data goes to <svg dir>/<chart>.svg.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/csi-volmgr/csi-volmgr/test/kubelet/benchresults"
)

// markers are the lines around the rendered part of a Markdown file.
func markers(name string) (begin, end string) {
	if name != "" {
		name += ":"
	}
	return "<!-- benchrender:" + name + "begin -->", "<!-- benchrender:" + name + "end -->"
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "benchrender:", err)
		os.Exit(1)
	}
}

type mdFiles []string

func (m *mdFiles) String() string     { return strings.Join(*m, ",") }
func (m *mdFiles) Set(s string) error { *m = append(*m, s); return nil }

func run(args []string) error {
	fs := flag.NewFlagSet("benchrender", flag.ContinueOnError)
	in := fs.String("in", "", "results file (results.json of make bench-kubelet, committed as docs/bench/<date>-<commit>.json)")
	svgDir := fs.String("svg", "", "directory of the charts; empty: none")
	source := fs.String("source", "", "the results file as the rendered text names it (default: -in)")
	name := fs.String("name", "", "the markers' name: <!-- benchrender:NAME:begin --> (default: <!-- benchrender:begin -->)")
	headline := fs.Bool("headline", false, "render the short headline table (README) instead of the whole table")
	var md mdFiles
	fs.Var(&md, "md", "Markdown file whose marked part gets the table (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *in == "" {
		return errors.New("-in is required")
	}
	f, err := benchresults.Read(*in)
	if err != nil {
		return err
	}
	if *source == "" {
		*source = *in
	}
	table := f.Markdown()
	if *headline {
		table = f.Headline()
	}
	for _, path := range md {
		if err := renderInto(path, *source, *name, table); err != nil {
			return err
		}
	}
	if *svgDir != "" {
		if err := os.MkdirAll(*svgDir, 0o755); err != nil {
			return err
		}
		for _, c := range benchresults.Charts {
			svg, ok := f.SVG(c)
			if !ok {
				continue
			}
			if err := os.WriteFile(filepath.Join(*svgDir, c.Name+".svg"), []byte(svg), 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// renderInto replaces the marked part of the Markdown file at path with
// table (rendered from source).
func renderInto(path, source, name, table string) error {
	beginMarker, endMarker := markers(name)
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	text := string(data)
	i := strings.Index(text, beginMarker)
	j := strings.Index(text, endMarker)
	if i < 0 || j < i {
		return fmt.Errorf("%s: no %q … %q", path, beginMarker, endMarker)
	}
	body := fmt.Sprintf("%s\n<!-- rendered by test/kubelet/cmd/benchrender from %s; do not edit -->\n\n%s\n",
		beginMarker, filepath.ToSlash(source), table)
	return os.WriteFile(path, []byte(text[:i]+body+text[j:]), 0o644)
}
