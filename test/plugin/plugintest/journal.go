package plugintest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/csi-volmgr/csi-volmgr/test/plugin"
)

// faultGeneration makes every SetFaults distinct, so that "times" counters restart each time.
var faultGeneration atomic.Uint64

// ReadJournal returns every journal entry so far, of this and earlier processes of the plugin.
// Use plugin.Calls to pair begin and end entries.
func (p *Plugin) ReadJournal() ([]plugin.Entry, error) {
	entries, err := plugin.ReadJournal(p.JournalPath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return entries, err
}

// WaitForJournal re-reads the journal until done returns true for its entries, and returns them.
// It fails when ctx ends first, returning the entries it saw last.
func (p *Plugin) WaitForJournal(ctx context.Context, done func([]plugin.Entry) bool) ([]plugin.Entry, error) {
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for {
		entries, err := p.ReadJournal()
		if err != nil {
			return entries, err
		}
		if done(entries) {
			return entries, nil
		}
		select {
		case <-ctx.Done():
			return entries, fmt.Errorf("wait for journal: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// SetFaults replaces the plugin's fault rules (and clears every other knob of the control file);
// calls that begin after it returns see them. Each call resets the rules' "times" counters.
func (p *Plugin) SetFaults(rules ...plugin.FaultRule) error {
	return p.SetControl(plugin.FaultConfig{Rules: rules})
}

// SetControl replaces the whole control file: fault rules, volume health, volume limit. Calls that
// begin after it returns see it. Each call resets the rules' "times" counters.
func (p *Plugin) SetControl(c plugin.FaultConfig) error {
	c.Generation = strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + strconv.FormatUint(faultGeneration.Add(1), 10)
	return plugin.WriteFaultConfig(p.ControlFile, c)
}

// ClearFaults removes all fault rules.
func (p *Plugin) ClearFaults() error {
	return p.SetFaults()
}
