package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const changelog = `# Changelog

Intro.

<!-- release:untagged:begin (make release removes this paragraph) -->
No version has been tagged yet.
<!-- release:untagged:end -->

## [Unreleased]

### Added

- New thing.

### Fixed

- Old bug.

## [0.1.0] — not yet tagged

The work before that:

- First things.

[Unreleased]: https://github.com/csi-volmgr/csi-volmgr/commits/main
[0.1.0]: https://github.com/csi-volmgr/csi-volmgr/commits/main
`

func TestReleaseChangelogFoldsTheUntaggedHistory(t *testing.T) {
	got, err := releaseChangelog(changelog, "v0.1.0", "2026-12-01")
	if err != nil {
		t.Fatal(err)
	}
	want := `# Changelog

Intro.

## [Unreleased]

## [0.1.0] - 2026-12-01

### Added

- New thing.

### Fixed

- Old bug.

The work before that:

- First things.

[Unreleased]: https://github.com/csi-volmgr/csi-volmgr/compare/v0.1.0...HEAD
[0.1.0]: https://github.com/csi-volmgr/csi-volmgr/releases/tag/v0.1.0
`
	if got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

func TestReleaseChangelogAfterAnEarlierRelease(t *testing.T) {
	released, err := releaseChangelog(changelog, "v0.1.0", "2026-12-01")
	if err != nil {
		t.Fatal(err)
	}
	next := strings.Replace(released, "## [Unreleased]\n", "## [Unreleased]\n\n### Fixed\n\n- A later fix.\n", 1)
	got, err := releaseChangelog(next, "v0.1.1", "2026-12-24")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"## [Unreleased]\n\n## [0.1.1] - 2026-12-24\n\n### Fixed\n\n- A later fix.\n\n## [0.1.0] - 2026-12-01\n",
		"[Unreleased]: https://github.com/csi-volmgr/csi-volmgr/compare/v0.1.1...HEAD\n" +
			"[0.1.1]: https://github.com/csi-volmgr/csi-volmgr/releases/tag/v0.1.1\n" +
			"[0.1.0]: https://github.com/csi-volmgr/csi-volmgr/releases/tag/v0.1.0\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
}

func TestUntaggedNoteWithoutItsEnd(t *testing.T) {
	broken := strings.Replace(changelog, untaggedEnd+"\n", "", 1)
	if _, err := releaseChangelog(broken, "v0.1.0", "2026-12-01"); err == nil || !strings.Contains(err.Error(), "without its end") {
		t.Errorf("error %v, want one about the note's end", err)
	}
}

func TestReleaseChangelogRefuses(t *testing.T) {
	released, err := releaseChangelog(changelog, "v0.1.0", "2026-12-01")
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct{ text, version, want string }{
		"bad version":        {changelog, "0.1.0", "not vMAJOR"},
		"build metadata":     {changelog, "v0.1.0+abc", "not vMAJOR"},
		"no unreleased":      {strings.Replace(changelog, "[Unreleased]\n", "[Next]\n", 1), "v0.1.0", "no \"## [Unreleased]\""},
		"nothing to release": {released, "v0.1.1", "empty"},
		"released already": {strings.Replace(released, "## [Unreleased]\n", "## [Unreleased]\n\n- More.\n", 1),
			"v0.1.0", "already has a section"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := releaseChangelog(c.text, c.version, "2026-12-01")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one saying %q", err, c.want)
			}
		})
	}
}

func TestPreviousRoundTripAndRefusals(t *testing.T) {
	p := Previous{Commit: strings.Repeat("ab", 20), Version: "v0.2.0"}
	got, err := ParsePrevious(p.Format())
	if err != nil || got != p {
		t.Fatalf("ParsePrevious(Format()) = %+v, %v; want %+v", got, err, p)
	}
	for name, text := range map[string]string{
		"short hash":     "commit 605f0bf\nversion v0.1.0\n",
		"no version":     "commit " + p.Commit + "\n",
		"twice":          p.Format() + "commit " + p.Commit + "\n",
		"unknown key":    p.Format() + "tag v0.1.0\n",
		"bad version":    "commit " + p.Commit + "\nversion latest\n",
		"upper-case hex": "commit " + strings.ToUpper(p.Commit) + "\nversion v0.1.0\n",
	} {
		if _, err := ParsePrevious(text); err == nil {
			t.Errorf("%s: ParsePrevious accepted %q", name, text)
		}
	}
}

// TestCommittedPreviousRelease: the file make test-upgrade reads parses,
// and, where the history is there, names a commit of it, whose hash and
// commit time a pseudo-version spells.
func TestCommittedPreviousRelease(t *testing.T) {
	data, err := os.ReadFile("previous")
	if err != nil {
		t.Fatal(err)
	}
	p, err := ParsePrevious(string(data))
	if err != nil {
		t.Fatalf("hack/release/previous: %v", err)
	}
	if pseudoVersionRE.MatchString(p.Version) && !strings.HasSuffix(p.Version, "-"+p.Commit[:12]) {
		t.Errorf("pseudo-version %s does not end in the commit's 12 first digits %s", p.Version, p.Commit[:12])
	}
	out, err := exec.Command("git", "rev-parse", "--is-shallow-repository").Output()
	if err != nil || strings.TrimSpace(string(out)) != "false" {
		t.Logf("not a full git clone (%v): the commit is not looked up", err)
		return
	}
	show := exec.Command("git", "show", "-s", "--format=%cd", "--date=format-local:%Y%m%d%H%M%S", p.Commit)
	show.Env = append(os.Environ(), "TZ=UTC")
	out, err = show.Output()
	if err != nil {
		t.Fatalf("commit %s of hack/release/previous is not in this repository: %v", p.Commit, err)
	}
	if when := strings.TrimSpace(string(out)); pseudoVersionRE.MatchString(p.Version) && !strings.Contains(p.Version, "-"+when+"-") {
		t.Errorf("pseudo-version %s does not carry the commit's time %s (UTC)", p.Version, when)
	}
}

func TestCommandWritesOnlyWithoutDryRun(t *testing.T) {
	dir := t.TempDir()
	cl := filepath.Join(dir, "CHANGELOG.md")
	prev := filepath.Join(dir, "previous")
	if err := os.WriteFile(cl, []byte(changelog), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(prev, []byte(Previous{Commit: strings.Repeat("0", 40), Version: "v0.0.1"}.Format()), 0o644); err != nil {
		t.Fatal(err)
	}
	commit := strings.Repeat("1", 40)
	var out bytes.Buffer
	for _, args := range [][]string{
		{"changelog", "-file", cl, "-version", "v0.1.0", "-date", "2026-12-01", "-dry-run"},
		{"set-previous", "-file", prev, "-commit", commit, "-version", "v0.1.0", "-dry-run"},
	} {
		if err := run(args, &out); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
	if !strings.Contains(out.String(), "## [0.1.0] - 2026-12-01") || !strings.Contains(out.String(), "commit "+commit) {
		t.Errorf("dry run printed:\n%s", out.String())
	}
	if data, _ := os.ReadFile(cl); string(data) != changelog {
		t.Errorf("a dry run changed CHANGELOG")
	}
	out.Reset()
	if err := run([]string{"previous", "-file", prev, "commit"}, &out); err != nil || out.String() != strings.Repeat("0", 40)+"\n" {
		t.Errorf("previous commit after a dry run: %q, %v", out.String(), err)
	}

	for _, args := range [][]string{
		{"changelog", "-file", cl, "-version", "v0.1.0", "-date", "2026-12-01"},
		{"set-previous", "-file", prev, "-commit", commit, "-version", "v0.1.0"},
	} {
		if err := run(args, &out); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
	if data, _ := os.ReadFile(cl); !strings.Contains(string(data), "## [0.1.0] - 2026-12-01") {
		t.Errorf("CHANGELOG not released:\n%s", data)
	}
	for field, want := range map[string]string{"commit": commit, "version": "v0.1.0"} {
		out.Reset()
		if err := run([]string{"previous", "-file", prev, field}, &out); err != nil || out.String() != want+"\n" {
			t.Errorf("previous %s = %q, %v; want %s", field, out.String(), err, want)
		}
	}
	if err := run([]string{"set-previous", "-file", prev, "-commit", "abc", "-version", "v0.1.0"}, &out); err == nil {
		t.Error("set-previous took a short hash")
	}
	if err := run([]string{"check-version", "v1.2"}, &out); err == nil {
		t.Error("check-version took v1.2")
	}
}
