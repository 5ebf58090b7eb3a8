package volumemanager_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// tcpProxy forwards connections to target until Close, which also cuts
// the connections it forwards: the agent's API server becomes unreachable.
type tcpProxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

func startProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	return startProxyOn(t, "127.0.0.1:0", target)
}

// startProxyOn is startProxy listening on addr.
func startProxyOn(t *testing.T, addr, target string) *tcpProxy {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{l: l, target: target}
	p.wg.Go(p.serve)
	t.Cleanup(p.Close)
	return p
}

func (p *tcpProxy) serve() {
	for {
		in, err := p.l.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = in.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, in, out)
		p.mu.Unlock()
		p.wg.Go(func() { _, _ = io.Copy(out, in); _ = out.Close() })
		p.wg.Go(func() { _, _ = io.Copy(in, out); _ = in.Close() })
	}
}

// Close stops accepting and cuts every forwarded connection.
func (p *tcpProxy) Close() {
	_ = p.l.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// TestLivenessFailsWhenThePodWatchKeepsFailing: the agent's API server
// becomes unreachable; /livez and /healthz keep answering 200 until the pod
// watch has failed for longer than the bound, then fail with the named
// check pod-watch (the others still pass), as a kubelet's liveness probe
// reads it.
func TestLivenessFailsWhenThePodWatchKeepsFailing(t *testing.T) {
	t.Parallel()
	f := k8stest.New(t)
	f.CreateNode(t)
	apiServer, err := url.Parse(f.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	proxy := startProxy(t, apiServer.Host)
	cfg := *f.Config
	cfg.Host = "https://" + proxy.l.Addr().String()
	client, err := kubernetes.NewForConfig(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	const bound = 3 * time.Second
	n := startClusterNode(t, f, func(c *volumemanager.Config) {
		c.KubeClient = client
		c.Tuning.PodWatchLivenessBound = bound
	})
	api := httptest.NewServer(n.vm.Handler())
	t.Cleanup(api.Close)
	get := func(path string) (int, string) {
		resp, err := http.Get(api.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	waitFor := func(what string, timeout time.Duration, cond func() bool) {
		t.Helper()
		err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, timeout, true,
			func(context.Context) (bool, error) { return cond(), nil })
		if err != nil {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
	}
	waitFor("the agent ready", time.Minute, n.vm.Ready)
	for _, path := range []string{volumemanager.LivezPath, volumemanager.HealthzPath} {
		if code, body := get(path); code != http.StatusOK {
			t.Fatalf("%s with a working API server: %d %s", path, code, body)
		}
	}

	cut := time.Now()
	proxy.Close()
	// Within the bound the check still passes: an outage of the API server
	// is no reason to restart.
	if code, body := get(volumemanager.LivezPath + "/pod-watch"); code != http.StatusOK && time.Since(cut) < bound {
		t.Fatalf("/livez/pod-watch right after the API server became unreachable: %d %s", code, body)
	}
	waitFor("/livez to fail", 2*time.Minute, func() bool { code, _ := get(volumemanager.LivezPath); return code != http.StatusOK })
	if took := time.Since(cut); took < bound {
		t.Errorf("/livez failed %v after the cut, before the bound %v", took, bound)
	}
	code, body := get(volumemanager.HealthzPath + "?verbose")
	if code != http.StatusInternalServerError || !strings.Contains(body, "[-]pod-watch failed") || !strings.Contains(body, "[+]lifecycle-steps ok") {
		t.Errorf("/healthz?verbose after the pod watch failed past the bound: %d\n%s", code, body)
	}
	if code, _ := get(volumemanager.LivezPath + "/lifecycle-steps"); code != http.StatusOK {
		t.Errorf("/livez/lifecycle-steps: %d, want 200: no step is wedged", code)
	}
}
