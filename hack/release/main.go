// Command release does the file edits of make release (Makefile, docs/operations.md "Upgrades
// and rollbacks"), each a plain text transformation tested on its own:
//
//	release check-version vX.Y.Z
//	release changelog -file CHANGELOG.md -version vX.Y.Z -date YYYY-MM-DD [-dry-run]
//	release set-previous -file hack/release/previous -commit <hash> -version vX.Y.Z [-dry-run]
//	release previous -file hack/release/previous commit|version
//
// changelog moves CHANGELOG's [Unreleased] entries under the version; set-previous records the
// release's commit as the previous release, which make test-upgrade starts from; previous
// prints one field of that file. With -dry-run the new content is printed, not written.
// It imports nothing of the project (depguard rule build-tools-stand-alone).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: release check-version|changelog|set-previous|previous [flags]")
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	file := fs.String("file", "", "the file to read and rewrite")
	version := fs.String("version", "", "the release version, vX.Y.Z")
	date := fs.String("date", time.Now().UTC().Format(time.DateOnly), "the release date (UTC), YYYY-MM-DD")
	commit := fs.String("commit", "", "the release's full commit hash")
	dryRun := fs.Bool("dry-run", false, "print the new content instead of writing it")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	switch args[0] {
	case "check-version":
		if fs.NArg() != 1 {
			return fmt.Errorf("check-version takes one version")
		}
		return checkVersion(fs.Arg(0))
	case "changelog":
		if _, err := time.Parse(time.DateOnly, *date); err != nil {
			return fmt.Errorf("-date: %w", err)
		}
		old, err := os.ReadFile(*file)
		if err != nil {
			return err
		}
		text, err := releaseChangelog(string(old), *version, *date)
		if err != nil {
			return fmt.Errorf("%s: %w", *file, err)
		}
		return write(*file, text, *dryRun, stdout)
	case "set-previous":
		p := Previous{Commit: *commit, Version: *version}
		if err := p.Validate(); err != nil {
			return err
		}
		return write(*file, p.Format(), *dryRun, stdout)
	case "previous":
		data, err := os.ReadFile(*file)
		if err != nil {
			return err
		}
		p, err := ParsePrevious(string(data))
		if err != nil {
			return fmt.Errorf("%s: %w", *file, err)
		}
		switch fs.Arg(0) {
		case "commit":
			_, err = fmt.Fprintln(stdout, p.Commit)
		case "version":
			_, err = fmt.Fprintln(stdout, p.Version)
		default:
			err = fmt.Errorf("previous takes commit or version")
		}
		return err
	}
	return fmt.Errorf("unknown command %q", args[0])
}

// write replaces file with text through a temporary file renamed over it,
// or prints text with dryRun.
func write(file, text string, dryRun bool, stdout io.Writer) error {
	if dryRun {
		_, err := fmt.Fprintf(stdout, "--- %s would be:\n%s", file, text)
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+".tmp-*")
	if err != nil {
		return err
	}
	_, err = tmp.WriteString(text)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), file)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
	}
	return err
}
