package main

import (
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/csi-volmgr/csi-volmgr/cmd/csi-volmgr/app"
)

// flagsReference lists every command of csi-volmgr with its flags, from
// the command tree the binary runs.
func flagsReference() ([]byte, error) {
	d := newDoc("Command-line reference", `
Every command of `+"`csi-volmgr`"+` and its flags, from the cobra command tree
(`+"`cmd/csi-volmgr/app`"+`). Defaults are those of the binary; `+"`<hostname>`"+`
stands for the host's name. Guides: [operations](../operations.md),
[runtimes](../runtimes.md).`)
	root := app.NewRootCommand(io.Discard)
	host, _ := os.Hostname()
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden {
			return
		}
		d.printf("\n## `%s`\n\n%s.\n", c.CommandPath(), strings.TrimSuffix(c.Short, "."))
		if c.Runnable() {
			d.printf("\nUsage: `%s`\n", c.UseLine())
		}
		var rows [][]string
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if f.Hidden {
				return
			}
			name := "--" + f.Name
			if f.Shorthand != "" {
				name = "-" + f.Shorthand + ", " + name
			}
			def := f.DefValue
			if host != "" && def == host {
				def = "<hostname>"
			}
			rows = append(rows, []string{code(name), f.Value.Type(), code(def), f.Usage})
		})
		if len(rows) > 0 {
			d.table([]string{"flag", "type", "default", "description"}, rows)
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	return d.Bytes(), nil
}
