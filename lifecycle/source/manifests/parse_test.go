package manifests

import (
	"errors"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
)

func TestParseFileErrorsNameFileAndLine(t *testing.T) {
	const good = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: ok\nspec:\n  containers:\n  - name: c\n    image: i\n"
	tests := map[string]struct {
		data     string
		wantLine int
		wantText string
	}{
		"YAML syntax error in the second document": {
			// lines 1-8 are good, 9 is "---", 13 is "  name: [unclosed"
			data:     good + "---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: [unclosed\n",
			wantLine: 13,
			wantText: "not valid YAML",
		},
		"unknown field is reported on its own line": {
			data:     good + "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n  - name: c\n    volumMounts: []\n",
			wantLine: 17,
			wantText: `unknown field "spec.containers[0].volumMounts"`,
		},
		"wrong type is reported on the field's line": {
			data:     "# a comment\napiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers: 5\n",
			wantLine: 7,
			wantText: "cannot unmarshal number",
		},
		"unsupported kind is reported on the document's first line": {
			data:     good + "---\n\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: d\n",
			wantLine: 10,
			wantText: "apps/v1 Deployment is not supported here",
		},
		"document without kind": {
			data:     "metadata:\n  name: x\n",
			wantLine: 1,
			wantText: "no apiVersion or kind",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			objs, err := parseFile("/m/pod.yaml", []byte(tc.data))
			if err == nil {
				t.Fatalf("parseFile succeeded with %d objects, want an error", len(objs))
			}
			var pe *ParseError
			if !errors.As(err, &pe) || !errors.Is(err, ErrInvalidManifest) {
				t.Fatalf("error %v (%T) is not a *ParseError wrapping ErrInvalidManifest", err, err)
			}
			if pe.File != "/m/pod.yaml" || pe.Line != tc.wantLine {
				t.Errorf("error at %s:%d, want /m/pod.yaml:%d (%v)", pe.File, pe.Line, tc.wantLine, err)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.wantText) {
				t.Errorf("error %q does not say %q", msg, tc.wantText)
			}
			if strings.Contains(msg, "\n") {
				t.Errorf("error %q is not one line", msg)
			}
			prefix := "/m/pod.yaml:"
			if !strings.HasPrefix(msg, prefix) {
				t.Errorf("error %q does not start with %q", msg, prefix)
			}
		})
	}
}

func TestParseFileReadsEveryDocument(t *testing.T) {
	data := `# leading comment
---
apiVersion: v1
kind: Pod
metadata:
  name: p
spec:
  containers:
  - name: c
    image: i
---
# an empty document
---
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata:
  name: d.example.com
spec:
  attachRequired: false
--- # separator with a comment
{"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv"}, "spec": {"csi": {"driver": "d", "volumeHandle": "h"}}}
`
	objs, err := parseFile("/m/all.yaml", []byte(data))
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 3 {
		t.Fatalf("got %d objects, want 3", len(objs))
	}
	if pod, ok := objs[0].obj.(*corev1.Pod); !ok || pod.Name != "p" || objs[0].line != 3 {
		t.Errorf("first object is %T at line %d, want Pod p at line 3", objs[0].obj, objs[0].line)
	}
	if d, ok := objs[1].obj.(*storagev1.CSIDriver); !ok || d.Spec.AttachRequired == nil || *d.Spec.AttachRequired {
		t.Errorf("second object is %#v, want CSIDriver with attachRequired=false", objs[1].obj)
	}
	if pv, ok := objs[2].obj.(*corev1.PersistentVolume); !ok || pv.Spec.CSI.VolumeHandle != "h" || objs[2].line != 21 {
		t.Errorf("third object is %T at line %d, want PersistentVolume pv at line 21", objs[2].obj, objs[2].line)
	}
}

func TestIsManifestName(t *testing.T) {
	for name, want := range map[string]bool{
		"pod.yaml": true, "pod.yml": true, "pod.json": true,
		".pod.yaml.swp": false, ".hidden.yaml": false, "pod.yaml~": false, "README.md": false, "..data": false,
	} {
		if got := isManifestName(name); got != want {
			t.Errorf("isManifestName(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestSplitDocumentsLines: the file line each document starts on is right
// however the documents are separated: runs of separators, separators
// with comments, CRLF line ends, lines longer than the reader's buffer, a
// last line without its newline.
func TestSplitDocumentsLines(t *testing.T) {
	long := "# " + strings.Repeat("x", 3*4096) + "\n"
	tests := map[string]struct {
		data      string
		wantLines []int
	}{
		"one document":                    {"a: 1\nb: 2\n", []int{1}},
		"no final newline":                {"a: 1\n---\nb: 2", []int{1, 3}},
		"leading separator":               {"---\na: 1\n", []int{2}},
		"runs of separators":              {"---\n---\na: 1\n---\n--- # c\n---\nb: 2\n---\n", []int{3, 7}},
		"CRLF":                            {"a: 1\r\nb: 2\r\n---\r\nc: 3\r\n", []int{1, 4}},
		"lines longer than the buffer":    {long + "a: 1\n---\n" + long + long + "b: 2\n---\nc: 3\n", []int{1, 4, 8}},
		"blank and comment-only document": {"# c\n\n---\na: 1\n", []int{1, 4}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			docs, err := splitDocuments([]byte(tc.data))
			if err != nil {
				t.Fatal(err)
			}
			var got []int
			for _, d := range docs {
				got = append(got, d.line)
			}
			if !slices.Equal(got, tc.wantLines) {
				t.Errorf("documents start on lines %v, want %v", got, tc.wantLines)
			}
		})
	}
}

// TestParseFileBadSeparator: a separator line with more than a comment
// after "---" is an error on its line, as kubectl's reader makes it, not
// a separator whose rest is dropped.
func TestParseFileBadSeparator(t *testing.T) {
	const pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n  - name: c\n    image: i\n"
	_, err := parseFile("/m/pod.yaml", []byte(pod+"--- {kind: Secret}\n"+pod))
	var pe *ParseError
	if !errors.As(err, &pe) || pe.Line != 9 || !strings.Contains(err.Error(), "invalid Yaml document separator") {
		t.Fatalf("parseFile = %v, want a ParseError on line 9 about the separator", err)
	}
}
