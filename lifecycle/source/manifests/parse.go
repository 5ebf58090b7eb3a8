package manifests

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

// ErrInvalidManifest is wrapped by every *ParseError.
var ErrInvalidManifest = errors.New("invalid manifest")

// ParseError is a manifest file that cannot be used: which file, which
// line (1-based, the best guess for errors found after the YAML was read),
// and why. Its text is one line: "<file>:<line>: <reason>".
type ParseError struct {
	// File is the manifest file's path.
	File string
	// Line is the line the problem is on, or the first line of the
	// document that has it.
	Line int
	// Err is the reason.
	Err error
}

// Error implements error.
func (e *ParseError) Error() string {
	return fmt.Sprintf("%s:%d: %s", e.File, e.Line, oneLine(e.Err.Error()))
}

// Unwrap makes errors.Is(err, ErrInvalidManifest) hold and keeps the reason.
func (e *ParseError) Unwrap() []error { return []error{ErrInvalidManifest, e.Err} }

// The kinds a manifest may hold.
var supportedKinds = map[schema.GroupVersionKind]bool{
	corev1.SchemeGroupVersion.WithKind("Pod"):                   true,
	corev1.SchemeGroupVersion.WithKind("PersistentVolumeClaim"): true,
	corev1.SchemeGroupVersion.WithKind("PersistentVolume"):      true,
	corev1.SchemeGroupVersion.WithKind("Secret"):                true,
	storagev1.SchemeGroupVersion.WithKind("CSIDriver"):          true,
}

// supportedList names the supported kinds for error messages.
const supportedList = "v1 Pod, PersistentVolumeClaim, PersistentVolume, Secret and storage.k8s.io/v1 CSIDriver"

// decoder decodes the supported kinds strictly: an unknown or duplicate
// field is an error, as with kubectl apply --validate=strict.
var decoder = serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()

// object is one object read from a manifest, with where it came from.
type object struct {
	obj  runtime.Object
	file string
	line int
}

// document is one YAML document of a file and the file line it starts on.
type document struct {
	line int
	data []byte
}

// isManifestName says whether a file name in the directory is a manifest:
// *.yaml, *.yml or *.json, and not a dot-file (editors' swap files, atomic
// writers' temporary files).
func isManifestName(name string) bool {
	if strings.HasPrefix(name, ".") {
		return false
	}
	for _, ext := range []string{".yaml", ".yml", ".json"} {
		if strings.HasSuffix(name, ext) {
			return true
		}
	}
	return false
}

// parseFile reads every object of one manifest file. Any document that
// cannot be used fails the whole file with a *ParseError, so that a file is
// taken either completely or not at all.
func parseFile(file string, data []byte) ([]object, error) {
	docs, err := splitDocuments(data)
	if err != nil {
		var pe *ParseError
		if errors.As(err, &pe) {
			pe.File = file
		}
		return nil, err
	}
	var out []object
	for _, doc := range docs {
		if isBlank(doc.data) {
			continue
		}
		obj, err := parseDocument(doc)
		if err != nil {
			var pe *ParseError
			if errors.As(err, &pe) {
				pe.File = file
				return nil, pe
			}
			return nil, &ParseError{File: file, Line: doc.line, Err: err}
		}
		out = append(out, object{obj: obj, file: file, line: doc.line})
	}
	return out, nil
}

// splitDocuments splits a YAML stream into its documents with
// apimachinery's YAML reader (the one kubectl reads manifests with). The
// reader returns every line it takes in a document, but for the separator
// that ends one, so a document starts on the line after those taken
// before it; a document that starts with a separator (the file's first,
// or one after a run of them) starts on the line after that. A separator
// line with more than a comment after "---" is an error on that line. The
// documents' lines end in "\n", whatever ended them in the file.
func splitDocuments(data []byte) ([]document, error) {
	feed := &lineFeeder{data: data}
	r := utilyaml.NewYAMLReader(bufio.NewReader(feed))
	var docs []document
	for {
		line := feed.lines + 1
		data, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, &ParseError{Line: max(feed.lines, 1), Err: fmt.Errorf("not valid YAML: %w", err)}
		}
		if bytes.HasPrefix(data, []byte(separator)) {
			_, data, _ = bytes.Cut(data, []byte("\n"))
			line++
		}
		if len(data) == 0 {
			continue // a separator after a separator
		}
		docs = append(docs, document{line: line, data: bytes.Clone(data)})
	}
}

// separator starts the lines the YAML reader splits documents at.
const separator = "---"

// lineFeeder hands its data to a bufio.Reader at most one line per Read,
// so that the lines it has handed out are the lines read from the
// bufio.Reader: bufio reads on only when it holds no whole line.
type lineFeeder struct {
	data []byte
	pos  int
	// lines counts the lines handed out whole (the last one may lack its
	// "\n").
	lines int
}

// Read implements io.Reader.
func (f *lineFeeder) Read(p []byte) (int, error) {
	if f.pos == len(f.data) {
		return 0, io.EOF
	}
	end := len(f.data)
	if i := bytes.IndexByte(f.data[f.pos:], '\n'); i >= 0 {
		end = f.pos + i + 1
	}
	n := copy(p, f.data[f.pos:end])
	f.pos += n
	if f.pos == end {
		f.lines++
	}
	return n, nil
}

// isBlank says whether a document has nothing but blank lines and comments.
func isBlank(data []byte) bool {
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) > 0 && line[0] != '#' {
			return false
		}
	}
	return true
}

var yamlLine = regexp.MustCompile(`^(?:error converting YAML to JSON: )?yaml: line (\d+): (.*)$`)

// parseDocument decodes one non-blank document into a supported object.
func parseDocument(doc document) (runtime.Object, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc.data, &tm); err != nil {
		return nil, yamlError(doc, err)
	}
	if tm.Kind == "" || tm.APIVersion == "" {
		return nil, &ParseError{Line: doc.line, Err: errors.New("document has no apiVersion or kind")}
	}
	gvk := schema.FromAPIVersionAndKind(tm.APIVersion, tm.Kind)
	if !supportedKinds[gvk] {
		return nil, &ParseError{Line: doc.line, Err: fmt.Errorf("%s %s is not supported here (only %s)", tm.APIVersion, tm.Kind, supportedList)}
	}
	obj, _, err := decoder.Decode(doc.data, nil, nil)
	if err != nil {
		if runtime.IsStrictDecodingError(err) {
			return nil, &ParseError{Line: locate(doc, strictField(err)), Err: fmt.Errorf("%s: %w", tm.Kind, err)}
		}
		if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
			return nil, yamlError(doc, err)
		}
		return nil, &ParseError{Line: locate(doc, typeErrorField(err)), Err: fmt.Errorf("%s: %w", tm.Kind, err)}
	}
	return obj, nil
}

// yamlError turns a YAML syntax error, whose line counts from the start of
// the document, into a ParseError on the file's line.
func yamlError(doc document, err error) error {
	m := yamlLine.FindStringSubmatch(err.Error())
	if m == nil {
		return &ParseError{Line: doc.line, Err: fmt.Errorf("not valid YAML: %w", err)}
	}
	n, _ := strconv.Atoi(m[1])
	// The YAML parser counts a line past the last one for an error at the
	// end of the input: point at the last line there is.
	lines := bytes.Count(bytes.TrimSuffix(doc.data, []byte("\n")), []byte("\n")) + 1
	return &ParseError{Line: doc.line + min(max(n, 1), lines) - 1, Err: fmt.Errorf("not valid YAML: %s", m[2])}
}

var (
	// strictFieldRE finds the field of `unknown field "spec.containers[0].volumMounts"`.
	strictFieldRE = regexp.MustCompile(`(?:unknown|duplicate) field "([^"]+)"`)
	// typeFieldRE finds the field of "... into Go struct field PodSpec.spec.containers of type ...".
	typeFieldRE = regexp.MustCompile(`Go struct field \S*?\.(\S+) of type`)
	indexRE     = regexp.MustCompile(`\[\d+\]`)
)

func strictField(err error) string {
	if m := strictFieldRE.FindStringSubmatch(err.Error()); m != nil {
		return lastElement(m[1])
	}
	return ""
}

func typeErrorField(err error) string {
	if m := typeFieldRE.FindStringSubmatch(err.Error()); m != nil {
		return lastElement(m[1])
	}
	return ""
}

// lastElement returns "volumMounts" for "spec.containers[0].volumMounts".
func lastElement(path string) string {
	path = indexRE.ReplaceAllString(path, "")
	if i := strings.LastIndex(path, "."); i >= 0 {
		return path[i+1:]
	}
	return path
}

// locate returns the file line of the first "field:" key in the document,
// or the document's first line when field is empty or not found: the
// decoder reports fields by path, not by line.
func locate(doc document, field string) int {
	if field == "" {
		return doc.line
	}
	re, err := regexp.Compile(`^\s*(?:-\s+)?"?` + regexp.QuoteMeta(field) + `"?\s*:`)
	if err != nil {
		return doc.line
	}
	for i, line := range bytes.Split(doc.data, []byte("\n")) {
		if re.Match(line) {
			return doc.line + i
		}
	}
	return doc.line
}

// oneLine folds an error text onto one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
