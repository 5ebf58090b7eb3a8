package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
)

// FormatVersion is the format of the records this agent writes and the
// newest it reads: the key FormatKey holds it as a decimal string. A
// record without that key is version 0: written by csi-volmgr before
// records were versioned, or by the kubelet; it has the same layout and
// Migrate adds the key in place.
//
// The version is raised only when a change of the layout would make an
// agent of the previous version misread a record (a key renamed, a value's
// meaning changed, a key that must not be ignored). A key an older agent
// may ignore is added without raising it: readers ignore unknown keys, so
// an agent one release back still reads the records of this one (a
// rollback). An agent meeting a record of a newer version refuses it with
// a *FormatError and leaves it as it is.
const FormatVersion = 1

// FormatKey is the key of a record's format version. Unknown to the
// kubelet and to csi-volmgr before versioned records, which ignore it.
const FormatKey = "csiVolmgrFormat"

// ErrNewerFormat is wrapped by the *FormatError a reader returns for a
// record of a format newer than FormatVersion.
var ErrNewerFormat = errors.New("record written in a newer format than this csi-volmgr knows")

// FormatError says which record has a format this agent does not know.
type FormatError struct {
	// Path is the record's file.
	Path string
	// Found is the version the record carries, as written.
	Found string
	// Known is the newest version this agent knows (FormatVersion).
	Known int
}

func (e *FormatError) Error() string {
	return fmt.Sprintf("%s has format version %q, this csi-volmgr knows versions up to %d: it was written by a newer csi-volmgr; "+
		"run that version (or newer) over this root directory, it is left as it is", e.Path, e.Found, e.Known)
}

// Unwrap makes errors.Is(err, ErrNewerFormat) true.
func (e *FormatError) Unwrap() error { return ErrNewerFormat }

// ParseFormat returns the format version a record's value of FormatKey
// names: 0 when absent (present is false), else a non-negative decimal
// integer. Anything else is not a version this agent can know, and is
// reported as newer: a *FormatError.
func ParseFormat(path, value string, present bool) (int, error) {
	if !present {
		return 0, nil
	}
	v, err := strconv.Atoi(value)
	if err != nil || v < 0 || v > FormatVersion || strconv.Itoa(v) != value {
		return 0, &FormatError{Path: path, Found: value, Known: FormatVersion}
	}
	return v, nil
}

// formatOf reads the format version from a decoded record.
func formatOf(path string, raw map[string]json.RawMessage) (int, error) {
	v, ok := raw[FormatKey]
	if !ok {
		return 0, nil
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		// Not a string: not a format this agent wrote or knows.
		return 0, &FormatError{Path: path, Found: string(v), Known: FormatVersion}
	}
	return ParseFormat(path, s, true)
}

// CheckFormat reads the record at path and returns its format version
// without checking anything else: a *FormatError for a newer one, an
// ErrCorrupt for a file that is not a JSON object. It changes nothing.
func CheckFormat(path string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("reading volume record: %w", err)
	}
	raw, err := decodeObject(path, data)
	if err != nil {
		return 0, err
	}
	return formatOf(path, raw)
}

// Migrate brings the record at path to FormatVersion in place: a record of
// version 0 gets FormatKey, every other key and value kept as they are
// (the kubelet's own keys included), written atomically and durably as
// WriteFile does: after a crash the record is either the old one, which
// the next start migrates again, or the new one; a temporary file a crash
// left beside it is never read as the record. A record already at
// FormatVersion is not written; a newer one is a *FormatError and is not
// written either. migrated says it wrote.
func Migrate(path string) (migrated bool, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return false, fmt.Errorf("reading volume record: %w", err)
	}
	raw, err := decodeObject(path, data)
	if err != nil {
		return false, err
	}
	v, err := formatOf(path, raw)
	if err != nil || v == FormatVersion {
		return false, err
	}
	raw[FormatKey] = json.RawMessage(strconv.Quote(strconv.Itoa(FormatVersion)))
	out, err := json.Marshal(raw)
	if err != nil {
		return false, fmt.Errorf("encoding %s: %w", path, err)
	}
	if err := WriteFile(path, append(out, '\n')); err != nil {
		return false, fmt.Errorf("migrating %s to format version %d: %w", path, FormatVersion, err)
	}
	return true, nil
}

// decodeObject decodes a record's JSON object, its values undecoded.
func decodeObject(path string, data []byte) (map[string]json.RawMessage, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrCorrupt, path, err)
	}
	if raw == nil {
		return nil, fmt.Errorf("%w %s: not a JSON object", ErrCorrupt, path)
	}
	return raw, nil
}
