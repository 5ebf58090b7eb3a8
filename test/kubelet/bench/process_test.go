package bench_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

const (
	// processStartTimeout bounds the wait for a started agent to serve
	// /healthz and then /readyz.
	processStartTimeout = 2 * time.Minute
	// processStopTimeout bounds the wait for an agent to exit after SIGTERM.
	processStopTimeout = 45 * time.Second
	// requestTimeout bounds one request to an agent's HTTP endpoint.
	requestTimeout = 30 * time.Second
	// clockTick is the unit of the times in /proc/<pid>/stat (USER_HZ).
	clockTick = 10 * time.Millisecond
)

// process is one agent process, either agent: a binary started with
// flags, serving /healthz, /readyz and /metrics on httpAddr. The same code
// starts, stops and measures both agents.
type process struct {
	binary, logFile, httpAddr string
	args                      []string
	// socket, if set, serves every path but /healthz, /readyz and
	// /metrics (see agentKind.socket).
	socket string

	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
}

// start runs the process and waits until it serves /readyz.
func (p *process) start(ctx context.Context) error {
	logFile, err := os.OpenFile(p.logFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer func() { _ = logFile.Close() }()
	_, _ = fmt.Fprintf(logFile, "=== start: %s %s\n", p.binary, strings.Join(p.args, " "))
	cmd := exec.Command(p.binary, p.args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Do not outlive the benchmark.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("run %s: %w", p.binary, err)
	}
	p.cmd, p.exited = cmd, make(chan struct{})
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	ctx, cancel := context.WithTimeout(ctx, processStartTimeout)
	defer cancel()
	var last string
	for {
		code, body, err := p.get(ctx, "/readyz")
		if err == nil && code == http.StatusOK {
			return nil
		}
		last = fmt.Sprintf("%d %s %v", code, bytes.TrimSpace(body), err)
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited during start: %w; see %s", p.binary, p.waitErr, p.logFile)
		case <-ctx.Done():
			return fmt.Errorf("%s not ready within %v (last /readyz: %s); see %s", p.binary, processStartTimeout, last, p.logFile)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// running reports whether the process was started and has not exited.
func (p *process) running() bool {
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM and waits for a clean exit.
func (p *process) stop() error {
	if !p.running() {
		return nil
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-p.exited:
	case <-time.After(processStopTimeout):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("%s did not exit within %v of SIGTERM; see %s", p.binary, processStopTimeout, p.logFile)
	}
	if p.waitErr != nil {
		return fmt.Errorf("%s exited: %w; see %s", p.binary, p.waitErr, p.logFile)
	}
	return nil
}

// kill sends SIGKILL and waits for the process to go, as a crash would.
func (p *process) kill() error {
	if !p.running() {
		return nil
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	<-p.exited
	return nil
}

// pid is the process ID.
func (p *process) pid() int { return p.cmd.Process.Pid }

// cpu is the process's CPU time so far, user and system, of all its
// threads and of the children it waited for (/proc/<pid>/stat).
func (p *process) cpu() (time.Duration, error) { return cpuOf(p.pid()) }

// cpuOf is process pid's CPU time so far (see process.cpu).
func cpuOf(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// pid (comm) state ppid ...: comm may hold spaces; utime is field 14.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	fields := strings.Fields(s[i+1:])
	if len(fields) < 15 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	var ticks int64
	for _, f := range fields[11:15] { // utime stime cutime cstime
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, err
		}
		ticks += n
	}
	return time.Duration(ticks) * clockTick, nil
}

// rss is the process's resident set size in bytes (/proc/<pid>/status).
func (p *process) rss() (uint64, error) { return pidRSS(p.pid()) }

// pidRSS is process pid's resident set size in bytes.
func pidRSS(pid int) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kib, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kib << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// get asks the process for path: on its socket if it has one, except for
// the health checks and metrics of its TCP endpoint.
func (p *process) get(ctx context.Context, path string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	url, client := "http://"+p.httpAddr+path, http.DefaultClient
	if p.socket != "" && !slices.Contains([]string{"/healthz", "/readyz", "/metrics"}, path) {
		url, client = "http://csi-volmgr"+path, &http.Client{Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", p.socket)
			},
		}}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

// metrics scrapes /metrics and returns the samples of the named families,
// summed over their series (histograms: _sum and _count).
func (p *process) metrics(ctx context.Context, names ...string) (map[string]float64, error) {
	code, body, err := p.get(ctx, "/metrics")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %d", code)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("parsing /metrics: %w", err)
	}
	out := map[string]float64{}
	for _, name := range names {
		f, ok := families[name]
		if !ok {
			continue
		}
		for _, m := range f.GetMetric() {
			switch {
			case m.GetGauge() != nil:
				out[name] += m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				out[name] += m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				out[name+"_sum"] += m.GetHistogram().GetSampleSum()
				out[name+"_count"] += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out, nil
}

// freeAddress returns a 127.0.0.1 address whose port was free a moment ago.
func freeAddress() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := l.Addr().String()
	return addr, l.Close()
}
