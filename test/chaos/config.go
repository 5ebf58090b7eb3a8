package chaos

import (
	"errors"
	"io"
	"time"
)

// Config bounds and tunes one chaos run. The zero value of every field but Seed and Log takes
// its default.
type Config struct {
	// Seed drives every random choice of the workload and of the nemeses; a run with the same
	// seed makes the same choices (their timing follows the machine).
	Seed uint64
	// Duration bounds the workload phase; the drain and the final checks follow. Default 10m.
	Duration time.Duration
	// Ops and Kills end the workload phase early once the agent made at least Ops node calls
	// and was killed at least Kills times; 0 means no such target.
	Ops, Kills int
	// LivePods is how many pods the workload keeps alive at once. Default 12.
	LivePods int
	// PodLifetime bounds how long a pod lives before the workload deletes it. Default 20s.
	PodLifetime time.Duration
	// CSITimeout is the agent's --csi-timeout. Default 5s.
	CSITimeout time.Duration
	// ReadyBound is how long a live pod may have all its volumes mounted without
	// VolumesReady=True, counted in time the agent and the API server are both up. Default 60s.
	ReadyBound time.Duration
	// ConvergeTimeout bounds the wait for convergence after a nemesis (and the drain at the
	// end). Default 5m.
	ConvergeTimeout time.Duration
	// Nemeses restricts the run to the named nemeses (see NemesisNames); empty means all.
	Nemeses []string
	// AgentVerbosity is the agent's -v. Default 4.
	AgentVerbosity int
	// Log receives the progress lines and the report; nil discards them.
	Log io.Writer
}

func (c *Config) setDefaults() error {
	if c.Duration == 0 {
		c.Duration = 10 * time.Minute
	}
	if c.LivePods == 0 {
		c.LivePods = 12
	}
	if c.PodLifetime == 0 {
		c.PodLifetime = 20 * time.Second
	}
	if c.CSITimeout == 0 {
		c.CSITimeout = 5 * time.Second
	}
	if c.ReadyBound == 0 {
		c.ReadyBound = time.Minute
	}
	if c.ConvergeTimeout == 0 {
		c.ConvergeTimeout = 5 * time.Minute
	}
	if c.AgentVerbosity == 0 {
		c.AgentVerbosity = 4
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	if c.Duration < 0 || c.LivePods < 0 || c.PodLifetime < 0 || c.CSITimeout < 0 || c.Ops < 0 || c.Kills < 0 {
		return errors.New("chaos: durations and counts must not be negative")
	}
	for _, n := range c.Nemeses {
		if _, ok := nemesisWeights[n]; !ok {
			return errors.New("chaos: unknown nemesis " + n)
		}
	}
	return nil
}
