package manifests

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// FuzzParseFile: no manifest file makes the loader panic; it is either
// taken whole, as supported objects, or refused with one *ParseError of one
// line that names the file and a line within it.
func FuzzParseFile(f *testing.F) {
	for _, seed := range []string{
		"apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n  - name: c\n    image: i\n",
		"apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: pv\nspec:\n  csi:\n    driver: d\n    volumeHandle: ../../x\n---\n",
		"---\n--- x\napiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: d}\nspec: {attachRequired: true}\n",
		"{\"apiVersion\":\"v1\",\"kind\":\"Secret\",\"metadata\":{\"name\":\"s\"},\"data\":{\"k\":\"djE=\"}}",
		"apiVersion: v1\nkind: Pod\nmetadata:\n  name: [unclosed\n", "kind: Pod\n", "\x00\xff", "a: &a [*a, *a]\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		objs, err := parseFile("m.yaml", data)
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) || !errors.Is(err, ErrInvalidManifest) {
				t.Fatalf("error %v is not a *ParseError wrapping ErrInvalidManifest", err)
			}
			lines := bytes.Count(data, []byte("\n")) + 1
			if pe.File != "m.yaml" || pe.Line < 1 || pe.Line > lines {
				t.Fatalf("ParseError %q: file %q, line %d of %d", err, pe.File, pe.Line, lines)
			}
			if msg := err.Error(); strings.ContainsAny(msg, "\n\r") {
				t.Fatalf("ParseError is not one line: %q", msg)
			}
			if objs != nil {
				t.Fatalf("objects returned with an error: %v", objs)
			}
			return
		}
		for _, o := range objs {
			if !supportedKinds[o.obj.GetObjectKind().GroupVersionKind()] {
				t.Fatalf("parsed an object of unsupported kind %v", o.obj.GetObjectKind().GroupVersionKind())
			}
		}
	})
}
