package main

import (
	"bufio"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Previous is what hack/release/previous says: the commit of the previous
// release and the version it stands for. make test-upgrade starts from
// Commit; make release writes it.
type Previous struct {
	// Commit is a full 40-digit commit hash.
	Commit string
	// Version is the release version (vX.Y.Z), or, while no release is
	// tagged, a name for the commit (v0.0.0-<date>-<short hash>).
	Version string
}

var commitRE = regexp.MustCompile(`^[0-9a-f]{40}$`)

// pseudoVersionRE names a commit that is no release, as a Go pseudo-version.
var pseudoVersionRE = regexp.MustCompile(`^v0\.0\.0-[0-9]{14}-[0-9a-f]{12}$`)

// Validate checks both fields.
func (p Previous) Validate() error {
	if !commitRE.MatchString(p.Commit) {
		return fmt.Errorf("commit %q is not a full 40-digit lower-case hash", p.Commit)
	}
	if checkVersion(p.Version) != nil && !pseudoVersionRE.MatchString(p.Version) {
		return fmt.Errorf("version %q is neither vX.Y.Z nor a pseudo-version v0.0.0-<yyyymmddhhmmss>-<12 hex digits>", p.Version)
	}
	return nil
}

// previousHeader is the comment at the top of the file, which says what it
// is to a reader who opens it.
const previousHeader = `# The previous release of csi-volmgr: the commit make test-upgrade builds the
# old agent from, and the version it stands for. make release VERSION=vX.Y.Z
# rewrites it after tagging (docs/operations.md, "Upgrades and rollbacks").
# Until the first release is tagged it names a commit of main whose CI passed.
`

// Format renders p as the file's content.
func (p Previous) Format() string {
	return previousHeader + "commit " + p.Commit + "\nversion " + p.Version + "\n"
}

// ParsePrevious reads the file's content: "commit <hash>" and "version
// <version>" lines, comments (#) and blank lines; anything else, a missing
// or repeated key, or an invalid value is an error.
func ParsePrevious(text string) (Previous, error) {
	var p Previous
	seen := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, value, ok := strings.Cut(line, " ")
		value = strings.TrimSpace(value)
		if !ok || value == "" || seen[key] {
			return Previous{}, fmt.Errorf("line %d: %q: want one \"commit <hash>\" and one \"version <version>\"", n, line)
		}
		seen[key] = true
		switch key {
		case "commit":
			p.Commit = value
		case "version":
			p.Version = value
		default:
			return Previous{}, fmt.Errorf("line %d: unknown key %q", n, key)
		}
	}
	if err := sc.Err(); err != nil {
		return Previous{}, err
	}
	if !seen["commit"] || !seen["version"] {
		return Previous{}, errors.New("want one \"commit <hash>\" and one \"version <version>\" line")
	}
	return p, p.Validate()
}
