package doccheck

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// root is the repository, seen from this package.
const root = "../.."

var (
	// inlineLink matches [text](target) and ![alt](target), target without
	// spaces, an optional "title" after it.
	inlineLink = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	// refLink matches a reference definition: [label]: target.
	refLink = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s+(\S+)`)
	// codeSpan matches inline code.
	codeSpan = regexp.MustCompile("`+[^`]+`+")
	// makeTarget matches `make TARGET` in code.
	makeTarget = regexp.MustCompile(`(?:^|[\s;&|(])make((?:\s+[A-Za-z_][A-Za-z0-9_]*=\S*)*)\s+([a-z][a-z0-9_-]*)`)
	// heading matches an ATX heading.
	heading = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	// makeRule matches a rule's targets in the Makefile.
	makeRule = regexp.MustCompile(`^([A-Za-z0-9_][A-Za-z0-9_ -]*):`)
)

// markdownFile is what the checks need of one Markdown file.
type markdownFile struct {
	path string // relative to root, slash-separated
	// prose are the lines outside fenced code, with code spans removed;
	// code are the fenced lines and the code spans.
	prose, code []string
	anchors     map[string]bool
}

// TestMarkdownLinks: every relative link of every tracked Markdown file
// leads to a file or directory of the repository, and its #anchor, if
// any, to a heading of the Markdown file it names.
func TestMarkdownLinks(t *testing.T) {
	files := readMarkdown(t)
	byPath := map[string]*markdownFile{}
	for _, f := range files {
		byPath[f.path] = f
	}
	checked := 0
	for _, f := range files {
		for _, line := range f.prose {
			var targets []string
			for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
				targets = append(targets, m[1])
			}
			if m := refLink.FindStringSubmatch(line); m != nil {
				targets = append(targets, m[1])
			}
			for _, target := range targets {
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				if err := checkLink(f, target, byPath); err != "" {
					t.Errorf("%s: link %s: %s", f.path, target, err)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative link found: the check reads nothing")
	}
}

func checkLink(f *markdownFile, target string, byPath map[string]*markdownFile) string {
	path, anchor, _ := strings.Cut(target, "#")
	dest := f
	if path != "" {
		rel := filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(f.path), path)))
		if strings.HasPrefix(rel, "../") {
			return "leads out of the repository"
		}
		if _, err := os.Stat(filepath.Join(root, rel)); err != nil {
			return "no such file or directory"
		}
		dest = byPath[rel]
	}
	if anchor == "" || dest == nil {
		return ""
	}
	if !dest.anchors[anchor] {
		return "no heading with anchor #" + anchor + " in " + dest.path
	}
	return ""
}

// TestMakeTargetsInMarkdown: every `make TARGET` written in code (a fenced
// block or a code span) of a tracked Markdown file is a target of the
// Makefile.
func TestMakeTargetsInMarkdown(t *testing.T) {
	targets := makefileTargets(t)
	checked := 0
	for _, f := range readMarkdown(t) {
		for _, line := range f.code {
			for _, m := range makeTarget.FindAllStringSubmatch(line, -1) {
				checked++
				if !targets[m[2]] {
					t.Errorf("%s: `make %s`: the Makefile has no target %s", f.path, m[2], m[2])
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no make target found: the check reads nothing")
	}
}

func makefileTargets(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		m := makeRule.FindStringSubmatch(line)
		if m == nil || strings.Contains(line, ":=") {
			continue
		}
		for _, name := range strings.Fields(m[1]) {
			targets[name] = true
		}
	}
	return targets
}

// readMarkdown reads every Markdown file git tracks (or would: new files
// not ignored count too).
func readMarkdown(t *testing.T) []*markdownFile {
	t.Helper()
	cmd := exec.Command("git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	var files []*markdownFile
	for _, path := range strings.Fields(string(out)) {
		b, err := os.ReadFile(filepath.Join(root, path))
		if os.IsNotExist(err) {
			continue // deleted in the worktree
		}
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, parseMarkdown(path, b))
	}
	return files
}

func parseMarkdown(path string, b []byte) *markdownFile {
	f := &markdownFile{path: path, anchors: map[string]bool{}}
	seen := map[string]int{}
	fence := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
				continue
			}
			f.code = append(f.code, line)
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		f.code = append(f.code, codeSpan.FindAllString(line, -1)...)
		if m := heading.FindStringSubmatch(line); m != nil {
			slug := slugify(m[1])
			if n := seen[slug]; n > 0 {
				f.anchors[slug+"-"+itoa(n)] = true
			} else {
				f.anchors[slug] = true
			}
			seen[slug]++
		}
		f.prose = append(f.prose, codeSpan.ReplaceAllString(line, "code"))
	}
	return f
}

// slugify is GitHub's anchor of a heading: lower case, letters, digits,
// hyphens and underscores kept, spaces made hyphens, the rest dropped.
func slugify(h string) string {
	h = inlineLink.ReplaceAllStringFunc(h, func(s string) string {
		return s[strings.Index(s, "[")+1 : strings.Index(s, "]")]
	})
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func itoa(n int) string {
	const digits = "0123456789"
	if n < 10 {
		return digits[n : n+1]
	}
	return itoa(n/10) + digits[n%10:n%10+1]
}
