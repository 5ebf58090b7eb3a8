package chaos

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Stats counts what a run did. Its methods are safe for concurrent use.
type Stats struct {
	cfg Config

	mu        sync.Mutex
	started   time.Time
	kills     map[string]int
	nemeses   map[string]int
	converge  map[string][]time.Duration
	notConv   map[string]int
	outages   int
	outageKil int
	downtime  time.Duration
	plugKills map[string]int
	hangs     int
	codes     map[string]int
	diskFulls int
	attaches  int
	detaches  int
	// The errors of the run: each is a failure of the run.
	nemErrs     map[string]int
	unparsed    int
	journalErrs int
	samplerErrs int
}

func newStats(cfg Config) *Stats {
	return &Stats{cfg: cfg, started: time.Now(), kills: map[string]int{}, nemeses: map[string]int{},
		converge: map[string][]time.Duration{}, notConv: map[string]int{}, plugKills: map[string]int{}, codes: map[string]int{},
		nemErrs: map[string]int{}}
}

func (s *Stats) kill(point string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kills[point]++
}

func (s *Stats) totalKills() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, k := range s.kills {
		n += k
	}
	return n
}

func (s *Stats) nemesis(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nemeses[name]++
}

func (s *Stats) converged(name string, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.converge[name] = append(s.converge[name], d)
}

func (s *Stats) notConverged(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notConv[name]++
}

func (s *Stats) nemesisError(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nemErrs[name]++
}

func (s *Stats) journalError(unparsed int, readErr bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unparsed += unparsed
	if readErr {
		s.journalErrs++
	}
}

func (s *Stats) samplerError() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.samplerErrs++
}

func (s *Stats) outage(d time.Duration, withKill bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.outages++
	s.downtime += d
	if withKill {
		s.outageKil++
	}
}

func (s *Stats) pluginKill(role string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.plugKills[role]++
}

func (s *Stats) hang() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hangs++
}

func (s *Stats) faultCode(code string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.codes[code]++
}

func (s *Stats) diskFull() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.diskFulls++
}

func (s *Stats) setAttach(attaches, detaches int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.attaches, s.detaches = attaches, detaches
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// progress is one line of how far the run is.
func (s *Stats) progress(h *Harness) string {
	all, _ := h.checker.Ops()
	h.pods.mu.Lock()
	created := h.pods.created
	h.pods.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("%v: %d node ops, %d pods, %d kills, %d outages, %d plugin kills, %d violations",
		time.Since(s.started).Round(time.Second), sum(all), created, sum(s.kills), s.outages, sum(s.plugKills), len(h.checker.Violations()))
}

// Report is the outcome of a run.
type Report struct {
	Seed       uint64
	Command    string
	Started    time.Time
	Workload   time.Duration
	Total      time.Duration
	Pods       int
	Ops, OKOps map[string]int
	Kills      map[string]int
	Nemeses    map[string]int
	Converge   map[string][]time.Duration
	NotConv    map[string]int
	Outages    int
	OutageKill int
	Downtime   time.Duration
	PlugKills  map[string]int
	Hangs      int
	Codes      map[string]int
	FaultsSeen map[string]int
	DiskFulls  int
	ENOSPC     int
	// Unmounts counts the mount points below the root the mount-table watch saw leave.
	Unmounts int
	// Gone counts the watches the agent had to relist after a 410 Gone (too old resource version).
	Gone       int
	Attaches   int
	Detaches   int
	Violations []Violation
	// The errors of the run, each a failure: nemeses that failed, by nemesis; journal lines that
	// did not parse and journal reads that failed; samples (pods' conditions, mount table) that
	// failed; the drain's error; and the nemeses after which the node did not converge (NotConv).
	NemesisErrors map[string]int
	UnparsedLines int
	JournalErrors int
	SamplerErrors int
	DrainError    string
	LogDir        string
	// Interrupted says the run was stopped early: no drain, no final checks.
	Interrupted bool
}

// Passed says whether the run found no violation and had no error.
func (r *Report) Passed() bool {
	return len(r.Violations) == 0 && len(r.Failures()) == 0 && !r.Interrupted
}

// Failures lists the errors of the run that make it fail besides the violations.
func (r *Report) Failures() []string {
	var out []string
	if n := sum(r.NemesisErrors); n > 0 {
		out = append(out, fmt.Sprintf("%d nemesis errors (%s)", n, countList(r.NemesisErrors)))
	}
	if n := sum(r.NotConv); n > 0 {
		out = append(out, fmt.Sprintf("%d nemeses not converged (%s)", n, countList(r.NotConv)))
	}
	if r.UnparsedLines > 0 {
		out = append(out, fmt.Sprintf("%d unparsed journal lines", r.UnparsedLines))
	}
	if r.JournalErrors > 0 {
		out = append(out, fmt.Sprintf("%d failed journal reads", r.JournalErrors))
	}
	if r.SamplerErrors > 0 {
		out = append(out, fmt.Sprintf("%d sampler errors", r.SamplerErrors))
	}
	if r.DrainError != "" {
		out = append(out, "drain: "+r.DrainError)
	}
	return out
}

// percentile returns the p-th percentile (0..100) of ds, nearest rank.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// Write prints the report as Markdown.
func (r *Report) Write(w io.Writer) {
	p := func(format string, args ...any) { _, _ = fmt.Fprintf(w, format+"\n", args...) }
	p("### Chaos run, seed %d", r.Seed)
	p("")
	p("`%s` — started %s, workload %v, total %v; logs in `%s`.", r.Command, r.Started.Format(time.RFC3339),
		r.Workload.Round(time.Second), r.Total.Round(time.Second), r.LogDir)
	if r.Interrupted {
		p("")
		p("**Interrupted**: no drain and no final checks; the figures are those of the workload phase so far.")
	}
	p("")
	p("| figure | value |")
	p("|---|---|")
	p("| node operations by the agent (NodeStage/Unstage/Publish/UnpublishVolume calls) | %d (%d OK) |", sum(r.Ops), sum(r.OKOps))
	for _, m := range nodeSteps {
		p("| &nbsp;&nbsp;%s | %d (%d OK) |", m, r.Ops[m], r.OKOps[m])
	}
	p("| attaches / detaches (emulated attach/detach controller) | %d / %d |", r.Attaches, r.Detaches)
	p("| pods created and deleted | %d |", r.Pods)
	p("| agent kills (SIGKILL) | %d |", sum(r.Kills))
	for _, k := range sortedCountKeys(r.Kills) {
		p("| &nbsp;&nbsp;%s | %d |", k, r.Kills[k])
	}
	p("| API server outages (5–30 s) / with an agent kill inside | %d / %d (%v down in all) |", r.Outages, r.OutageKill, r.Downtime.Round(time.Second))
	p("| watches relisted after 410 Gone (too old resource version), from the agent's log | %d |", r.Gone)
	p("| plugin crashes (SIGKILL and restart) | %d (%s) |", sum(r.PlugKills), countList(r.PlugKills))
	p("| plugin hangs past the CSI timeout | %d |", r.Hangs)
	p("| error-code faults set / fired | %d / %d |", sum(r.Codes), faultsFired(r.FaultsSeen))
	p("| &nbsp;&nbsp;codes set | %s |", countList(r.Codes))
	p("| unmounts below the root seen by the mount-table watch | %d |", r.Unmounts)
	p("| disk-full episodes on the root (tmpfs) / ENOSPC lines in the agent's log | %d / %d |", r.DiskFulls, r.ENOSPC)
	p("")
	p("| error of the run (each fails it) | count |")
	p("|---|---|")
	p("| nemesis errors | %d (%s) |", sum(r.NemesisErrors), countList(r.NemesisErrors))
	p("| nemeses not converged within the timeout | %d (%s) |", sum(r.NotConv), countList(r.NotConv))
	p("| unparsed journal lines | %d |", r.UnparsedLines)
	p("| failed journal reads | %d |", r.JournalErrors)
	p("| sampler errors (mount table, watch) | %d |", r.SamplerErrors)
	drain := "none"
	if r.DrainError != "" {
		drain = strings.ReplaceAll(r.DrainError, "|", "\\|")
	}
	p("| drain (every pod deleted, the node converged) | %s |", drain)
	p("")
	p("| invariant | violations |")
	p("|---|---|")
	byInv := map[Invariant]int{}
	for _, v := range r.Violations {
		byInv[v.Invariant]++
	}
	for _, inv := range Invariants {
		p("| %s | %d |", inv, byInv[inv])
	}
	p("")
	p("| nemesis | runs | converged p50 | p99 | max | not converged |")
	p("|---|---|---|---|---|---|")
	for _, name := range sortedCountKeys(r.Nemeses) {
		ds := r.Converge[name]
		p("| %s | %d | %v | %v | %v | %d |", name, r.Nemeses[name], percentile(ds, 50).Round(100*time.Millisecond),
			percentile(ds, 99).Round(100*time.Millisecond), percentile(ds, 100).Round(100*time.Millisecond), r.NotConv[name])
	}
	if len(r.Violations) > 0 {
		p("")
		p("Violations:")
		p("")
		for _, v := range r.Violations {
			detail := v.Detail
			if len(detail) > 2000 {
				detail = detail[:2000] + "…"
			}
			p("- %s %s: %s", v.Time.Format("15:04:05.000"), v.Invariant, strings.ReplaceAll(detail, "\n", "\n  "))
		}
	}
}

func faultsFired(m map[string]int) int {
	n := 0
	for k, v := range m {
		if strings.HasPrefix(k, "error ") {
			n += v
		}
	}
	return n
}

func sortedCountKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func countList(m map[string]int) string {
	var parts []string
	for _, k := range sortedCountKeys(m) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	if len(parts) == 0 {
		return "—"
	}
	return strings.Join(parts, ", ")
}
