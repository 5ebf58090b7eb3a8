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
	// LivePods is how many pods the workload keeps alive at once. Default DefaultLivePods.
	LivePods int
	// ShortestPodLife and LongestPodLife bound how long a pod lives before the workload deletes
	// it (uniformly random in between). Defaults DefaultShortestPodLife and DefaultLongestPodLife:
	// well above ReadyBound, so that almost every pod lives long enough for InvNotReady to fire.
	ShortestPodLife, LongestPodLife time.Duration
	// CSITimeout is the agent's --csi-timeout. Default 5s.
	CSITimeout time.Duration
	// ReadyBound is how long a live pod may be without VolumesReady=True, counted from its
	// creation (or from the last time it was seen ready) in healthy time: the agent ready, the
	// API server up and no nemesis fault active on the pod's plugins or the node. Default
	// DefaultReadyBound.
	ReadyBound time.Duration
	// OutageRecovery is how long after an API server outage ends the time is not healthy yet.
	// Default 0: healthy as soon as the API server answers. The agent's informers (client-go
	// reflectors) back off during an outage, up to 30 s jittered up to 60 s; the first watch after
	// the restart ends with 410 Gone (too old resource version) and backs off once more before
	// the relist, so the agent may see the pods created meanwhile up to about two minutes late
	// (42 and 44 s in the runs of this change). A value of 120s accepts that delay instead of
	// reporting it under InvNotReady.
	OutageRecovery time.Duration
	// ReadyGrace is how long a live pod may be VolumesReady=True while one of its targets is not
	// in the mount table, counted in healthy time. Default DefaultReadyGrace.
	ReadyGrace time.Duration
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

// The defaults of Config.
const (
	DefaultLivePods        = 36
	DefaultShortestPodLife = 45 * time.Second
	DefaultLongestPodLife  = 75 * time.Second
	DefaultReadyBound      = 30 * time.Second
	// DefaultReadyGrace absorbs what may legitimately separate a lost mount from the pod's
	// condition: the sample itself (the pods are listed, then the mount table is read, 500 ms
	// apart at most), the agent noticing a plugin that restarted without its mounts (a reconnect,
	// whose first gRPC backoff is 1 s, then its mount check) and the status write. It is counted
	// only in healthy time, so an agent that is down or a plugin that is still faulted does not
	// use it up.
	DefaultReadyGrace = 5 * time.Second
)

func (c *Config) setDefaults() error {
	if c.Duration == 0 {
		c.Duration = 10 * time.Minute
	}
	if c.LivePods == 0 {
		c.LivePods = DefaultLivePods
	}
	if c.ShortestPodLife == 0 {
		c.ShortestPodLife = DefaultShortestPodLife
	}
	if c.LongestPodLife == 0 {
		c.LongestPodLife = max(DefaultLongestPodLife, c.ShortestPodLife)
	}
	if c.CSITimeout == 0 {
		c.CSITimeout = 5 * time.Second
	}
	if c.ReadyBound == 0 {
		c.ReadyBound = DefaultReadyBound
	}
	if c.ReadyGrace == 0 {
		c.ReadyGrace = DefaultReadyGrace
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
	if c.Duration < 0 || c.LivePods < 0 || c.ShortestPodLife < 0 || c.CSITimeout < 0 || c.Ops < 0 || c.Kills < 0 ||
		c.ReadyBound < 0 || c.ReadyGrace < 0 || c.OutageRecovery < 0 {
		return errors.New("chaos: durations and counts must not be negative")
	}
	if c.LongestPodLife < c.ShortestPodLife {
		return errors.New("chaos: the longest pod lifetime is below the shortest")
	}
	for _, n := range c.Nemeses {
		if _, ok := nemesisWeights[n]; !ok {
			return errors.New("chaos: unknown nemesis " + n)
		}
	}
	return nil
}
