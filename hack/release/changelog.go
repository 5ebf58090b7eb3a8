package main

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// repoURL is where the CHANGELOG's version links point.
const repoURL = "https://github.com/csi-volmgr/csi-volmgr"

// versionRE is a release version: v, then semantic version numbers, an
// optional pre-release (v0.2.0-rc.1). No build metadata: a tag names it.
var versionRE = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$`)

// checkVersion says whether v is a version make release takes.
func checkVersion(v string) error {
	if !versionRE.MatchString(v) {
		return fmt.Errorf("version %q is not vMAJOR.MINOR.PATCH[-PRERELEASE]", v)
	}
	return nil
}

// releaseChangelog moves the body of the [Unreleased] section of a Keep a
// Changelog file under a new section "## [X.Y.Z] - date" right below it,
// leaving [Unreleased] empty, and updates the link references at the end:
// [Unreleased] compares the new tag with HEAD, [X.Y.Z] names the tag. A
// section of the same version marked "not yet tagged" (the history written
// before the first release) is folded into the new one, below its entries.
// It fails, changing nothing, when the version already has a released
// section, when there is no [Unreleased] section, or when it is empty.
// What stands between the lines untaggedBegin and untaggedEnd (a note that
// no version is tagged yet) is removed with them.
func releaseChangelog(text, version, date string) (string, error) {
	if err := checkVersion(version); err != nil {
		return "", err
	}
	text, err := dropUntaggedNote(text)
	if err != nil {
		return "", err
	}
	num := strings.TrimPrefix(version, "v")
	lines := strings.SplitAfter(text, "\n")
	sections := headings(lines)
	unreleased, ok := sections["unreleased"]
	if !ok {
		return "", errors.New("CHANGELOG has no \"## [Unreleased]\" section")
	}
	if s, ok := sections[num]; ok && !strings.Contains(strings.ToLower(lines[s.start]), "not yet tagged") {
		return "", fmt.Errorf("CHANGELOG already has a section for %s: %s", num, strings.TrimSpace(lines[s.start]))
	}
	body := strings.Join(lines[unreleased.start+1:unreleased.end], "")
	if strings.TrimSpace(body) == "" {
		return "", errors.New("the [Unreleased] section is empty: nothing to release")
	}
	newSection := strings.TrimRight(body, "\n") + "\n"
	newSection = strings.TrimLeft(newSection, "\n")
	rest := lines[unreleased.end:]
	if s, ok := sections[num]; ok {
		// The untagged history of this version: its heading goes, its text
		// follows the released entries.
		pre := strings.Trim(strings.Join(lines[s.start+1:s.end], ""), "\n")
		if pre != "" {
			newSection += "\n" + pre + "\n"
		}
		rest = append(append([]string(nil), lines[unreleased.end:s.start]...), lines[s.end:]...)
	}
	var out strings.Builder
	out.WriteString(strings.Join(lines[:unreleased.start+1], ""))
	fmt.Fprintf(&out, "\n## [%s] - %s\n\n%s", num, date, newSection)
	if len(rest) > 0 {
		out.WriteString("\n")
	}
	out.WriteString(strings.Join(rest, ""))
	return setLinks(out.String(), num), nil
}

// The lines around the CHANGELOG's note that no version is tagged yet,
// which the first release removes.
const (
	untaggedBegin = "<!-- release:untagged:begin"
	untaggedEnd   = "<!-- release:untagged:end -->"
)

// dropUntaggedNote removes the lines from the one starting with
// untaggedBegin to the one that is untaggedEnd, and one blank line after.
func dropUntaggedNote(text string) (string, error) {
	begin := strings.Index(text, "\n"+untaggedBegin)
	if begin < 0 {
		if strings.Contains(text, untaggedEnd) {
			return "", errors.New("CHANGELOG has the end of the untagged note without its beginning")
		}
		return text, nil
	}
	end := strings.Index(text[begin:], "\n"+untaggedEnd+"\n")
	if end < 0 {
		return "", errors.New("CHANGELOG has the beginning of the untagged note without its end")
	}
	rest := text[begin+end+len(untaggedEnd)+2:]
	return text[:begin+1] + strings.TrimPrefix(rest, "\n"), nil
}

// section is a "## " heading's line and the line where the next one (or
// the link references, or the end) begins.
type section struct{ start, end int }

var headingRE = regexp.MustCompile(`^## \[([^\]]+)\]`)

// headings finds the "## [name]" sections, keyed by lower-case name.
func headings(lines []string) map[string]section {
	out := map[string]section{}
	var open string
	for i, l := range lines {
		m := headingRE.FindStringSubmatch(l)
		isLinks := linkRE.MatchString(l)
		if m == nil && !isLinks && !strings.HasPrefix(l, "## ") {
			continue
		}
		if open != "" {
			s := out[open]
			s.end = i
			out[open] = s
			open = ""
		}
		if m != nil {
			open = strings.ToLower(m[1])
			out[open] = section{start: i, end: len(lines)}
		}
	}
	return out
}

// linkRE is a link reference definition at the end of the file.
var linkRE = regexp.MustCompile(`^\[[^\]]+\]: `)

// setLinks points [Unreleased] at the comparison of the new tag with HEAD
// and adds [X.Y.Z] for the tag (replacing one that named no tag).
func setLinks(text, num string) string {
	lines := strings.SplitAfter(text, "\n")
	unreleased := "[Unreleased]: " + repoURL + "/compare/v" + num + "...HEAD\n"
	tagged := "[" + num + "]: " + repoURL + "/releases/tag/v" + num + "\n"
	var out []string
	placed := false
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "[Unreleased]: "):
			out = append(out, unreleased, tagged)
			placed = true
		case strings.HasPrefix(l, "["+num+"]: "):
			// Replaced by tagged.
		default:
			out = append(out, l)
		}
	}
	if !placed {
		if len(out) > 0 && !strings.HasSuffix(out[len(out)-1], "\n") {
			out = append(out, "\n")
		}
		out = append(out, "\n", unreleased, tagged)
	}
	return strings.Join(out, "")
}
