package main

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// reasonConst is one constant of the code that names a reason or a state.
type reasonConst struct {
	pkg, name, value, doc string
}

var (
	eventName  = regexp.MustCompile(`^[Ee]vent[A-Z]`)
	reasonName = regexp.MustCompile(`^[Rr]eason[A-Z]|Reason$`)
)

// stateTypes are the types whose constants are states a user reads.
var stateTypes = map[string]bool{"PodVolumesState": true}

// reasonSections say where the reasons of each package go, in order. A
// package that defines reasons and is not here fails the generator: say
// in which section its reasons belong.
var reasonSections = []struct {
	pkg, title, intro string
}{
	{"lifecycle/status", "Pod condition `csi-volmgr.io/VolumesReady`",
		"The reason of the condition the agent writes on each pod it serves: False with one of these while a volume is not ready, True with none (or `VolumeUnhealthy`) once every volume is published. What to do about each: [operations](../operations.md#troubleshooting-by-condition-reason)."},
	{"volumemanager", "Pod API and Go API",
		"The `state` of a pod in `GET /api/v1/pods` and `csi-volmgr status` (`volumemanager.PodVolumesState`), the reasons the agent gives besides the condition's, and the Ready condition of a Node the agent registers (`--register-node`)."},
	{"lifecycle/runtimepods", "Why a pod is AwaitingRuntime",
		"The message of a pod held for its runtime (`--wait-for-containers-stopped`): the pod left the desired state, and its volumes stay mounted until the runtime says its containers stopped or reports running pods without it."},
	{"lifecycle/mountcheck", "Why a mount is broken",
		"The words the mount check uses, in its log lines, in the pod's error (`NodePublishFailed` while the mount is set up again) and in the `VolumeMountRecovered` Event, for a staging or publish path it found broken after a driver registered again."},
}

// reasonsReference lists the condition reasons, Event reasons and states
// defined as constants in the module's Go code below root.
func reasonsReference(root string) ([]byte, error) {
	consts, err := readReasonConsts(root)
	if err != nil {
		return nil, err
	}
	d := newDoc("Reasons reference", `
Every reason the agent writes — pod condition reasons, Event reasons, the states and reasons of its
API — from the constants in the code. Troubleshooting by reason: [operations](../operations.md).`)
	known := map[string]bool{}
	for _, s := range reasonSections {
		known[s.pkg] = true
	}
	var events []reasonConst
	byPkg := map[string][]reasonConst{}
	for _, c := range consts {
		if eventName.MatchString(c.name) {
			events = append(events, c)
			continue
		}
		if !known[c.pkg] {
			return nil, fmt.Errorf("package %s defines %s: add it to reasonSections", c.pkg, c.name)
		}
		byPkg[c.pkg] = append(byPkg[c.pkg], c)
	}
	for _, s := range reasonSections {
		d.printf("\n## %s\n\n%s\n", s.title, s.intro)
		var rows [][]string
		for _, c := range byPkg[s.pkg] {
			rows = append(rows, []string{code(c.value), code(c.name), c.doc})
		}
		d.table([]string{"value", "constant", "meaning"}, rows)
	}
	d.printf("\n## Events\n\n%s\n", "The reasons of the Events the agent records (source component `csi-volmgr`), the kubelet's where it has one. Each is one row, with every constant that names it.")
	values := map[string][]reasonConst{}
	for _, c := range events {
		values[c.value] = append(values[c.value], c)
	}
	var rows [][]string
	for _, v := range sortedKeys(values) {
		var names, docs []string
		for _, c := range values[v] {
			names = append(names, code(c.pkg+"."+c.name))
			if c.doc != "" {
				docs = append(docs, c.doc)
			}
		}
		rows = append(rows, []string{code(v), strings.Join(names, ", "), strings.Join(docs, " ")})
	}
	d.table([]string{"reason", "constant", "meaning"}, rows)
	return d.Bytes(), nil
}

// readReasonConsts parses the module's production Go files (not tests,
// test/, examples/, hack/ or nested modules) for string constants named
// Reason*, *Reason or Event*, or of a type in stateTypes, in source order.
func readReasonConsts(root string) ([]reasonConst, error) {
	var out []reasonConst
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if e.IsDir() {
			if rel == "." {
				return nil
			}
			name := e.Name()
			if strings.HasPrefix(name, ".") || name == "testdata" || name == "bin" ||
				slices.Contains([]string{"test", "examples", "hack", "deploy"}, rel) {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		found, err := fileReasons(filepath.ToSlash(filepath.Dir(rel)), f)
		out = append(out, found...)
		return err
	})
	return out, err
}

func fileReasons(pkg string, f *ast.File) ([]reasonConst, error) {
	var out []reasonConst
	for _, decl := range f.Decls {
		gen, ok := decl.(*ast.GenDecl)
		if !ok || gen.Tok != token.CONST {
			continue
		}
		for _, spec := range gen.Specs {
			vs := spec.(*ast.ValueSpec)
			typ := ""
			if id, ok := vs.Type.(*ast.Ident); ok {
				typ = id.Name
			}
			for i, name := range vs.Names {
				if !eventName.MatchString(name.Name) && !reasonName.MatchString(name.Name) && !stateTypes[typ] {
					continue
				}
				if i >= len(vs.Values) {
					return nil, fmt.Errorf("%s.%s has no value of its own", pkg, name.Name)
				}
				value, err := stringValue(vs.Values[i])
				if err != nil {
					return nil, fmt.Errorf("%s.%s: %w", pkg, name.Name, err)
				}
				doc := vs.Doc
				if doc == nil {
					doc = vs.Comment
				}
				if doc == nil {
					doc = gen.Doc
				}
				out = append(out, reasonConst{pkg: pkg, name: name.Name, value: value, doc: docText(name.Name, doc)})
			}
		}
	}
	return out, nil
}

// stringValue evaluates a string literal or a sum of them.
func stringValue(e ast.Expr) (string, error) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind == token.STRING {
			return strconv.Unquote(e.Value)
		}
	case *ast.BinaryExpr:
		if e.Op == token.ADD {
			x, err := stringValue(e.X)
			if err != nil {
				return "", err
			}
			y, err := stringValue(e.Y)
			return x + y, err
		}
	case *ast.ParenExpr:
		return stringValue(e.X)
	}
	return "", errors.New("not a string literal")
}

// docText is a constant's comment (or its group's) on one line, without
// a leading "Name: ".
func docText(name string, g *ast.CommentGroup) string {
	if g == nil {
		return ""
	}
	s := strings.Join(strings.Fields(g.Text()), " ")
	return strings.TrimPrefix(s, name+": ")
}
