package chaos

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/csi-volmgr/csi-volmgr/test/plugin"
)

// tail reads a plugin's journal incrementally: each Read returns the entries appended since the
// last one. A last line without its newline is kept for the next Read.
type tail struct {
	path    string
	offset  int64
	partial []byte
}

func newTail(path string) *tail { return &tail{path: path} }

// Read returns the complete entries appended since the last Read, and the complete lines that
// are not entries (each an error of the run; the lines after them are read all the same).
func (t *tail) Read() ([]plugin.Entry, []string, error) {
	f, err := os.Open(t.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("open journal: %w", err)
	}
	defer func() { _ = f.Close() }()
	if _, err := f.Seek(t.offset, io.SeekStart); err != nil {
		return nil, nil, fmt.Errorf("seek journal: %w", err)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, nil, fmt.Errorf("read journal: %w", err)
	}
	t.offset += int64(len(data))
	data = append(t.partial, data...)
	var out []plugin.Entry
	var bad []string
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break
		}
		var e plugin.Entry
		if err := json.Unmarshal(data[:i], &e); err != nil {
			bad = append(bad, fmt.Sprintf("journal %s: %v: %q", t.path, err, data[:i]))
		} else {
			out = append(out, e)
		}
		data = data[i+1:]
	}
	t.partial = append([]byte(nil), data...)
	return out, bad, nil
}
