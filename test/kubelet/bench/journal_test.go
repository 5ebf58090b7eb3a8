package bench_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/csi-volmgr/csi-volmgr/test/plugin"
)

// journalTail reads the plugin's journal as it grows, pairs begin and end
// entries into calls and indexes the finished calls by volume ID: what
// either agent did, on the plugin's clock, at no cost to either agent.
type journalTail struct {
	// mu guards the fields below.
	mu      sync.Mutex
	f       *os.File
	partial []byte
	open    map[callKey]plugin.Entry
	// byVolume holds the finished calls of each volume in end order.
	byVolume map[string][]finishedCall
}

type callKey struct {
	pid int
	seq uint64
}

// finishedCall is one CSI call that returned.
type finishedCall struct {
	method     string
	begin, end time.Time
	code       string
}

func (c finishedCall) ok() bool { return c.code == "OK" }

func openJournalTail(path string) (*journalTail, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening the plugin journal: %w", err)
	}
	return &journalTail{f: f, open: map[callKey]plugin.Entry{}, byVolume: map[string][]finishedCall{}}, nil
}

func (t *journalTail) close() error { return t.f.Close() }

// poll reads what was appended since the last poll and returns how many
// calls finished meanwhile.
func (t *journalTail) poll() (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	buf := make([]byte, 64<<10)
	finished := 0
	for {
		n, err := t.f.Read(buf)
		t.partial = append(t.partial, buf[:n]...)
		for {
			i := bytes.IndexByte(t.partial, '\n')
			if i < 0 {
				break
			}
			var e plugin.Entry
			if jerr := json.Unmarshal(t.partial[:i], &e); jerr != nil {
				return finished, fmt.Errorf("plugin journal: %w", jerr)
			}
			t.partial = t.partial[i+1:]
			if t.add(e) {
				finished++
			}
		}
		if errors.Is(err, io.EOF) || n == 0 {
			return finished, nil
		}
		if err != nil {
			return finished, err
		}
	}
}

// add takes one entry and reports whether it finished a call.
func (t *journalTail) add(e plugin.Entry) bool {
	if e.Seq == 0 {
		return false
	}
	k := callKey{e.PID, e.Seq}
	switch e.Event {
	case plugin.EventBegin:
		t.open[k] = e
	case plugin.EventEnd:
		b, ok := t.open[k]
		if !ok {
			return false
		}
		delete(t.open, k)
		t.byVolume[b.VolumeID] = append(t.byVolume[b.VolumeID], finishedCall{
			method: b.Method, begin: b.Time, end: e.Time, code: e.Code,
		})
		return true
	}
	return false
}

// calls returns the finished calls of a volume that began at or after
// since, of the given methods.
func (t *journalTail) calls(volumeID string, since time.Time, methods ...string) []finishedCall {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []finishedCall
	for _, c := range t.byVolume[volumeID] {
		if c.begin.Before(since) {
			continue
		}
		for _, m := range methods {
			if c.method == m {
				out = append(out, c)
				break
			}
		}
	}
	return out
}

// lastOK reports whether a call of method on the volume that began at or
// after since succeeded.
func (t *journalTail) lastOK(volumeID, method string, since time.Time) bool {
	for _, c := range t.calls(volumeID, since, method) {
		if c.ok() {
			return true
		}
	}
	return false
}
