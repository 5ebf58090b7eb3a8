package agent_test

import (
	"errors"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
)

// gate is a TCP forwarder in front of the API server that holds every
// connection until it is opened: an agent behind a closed gate runs, but
// its informers cannot sync.
type gate struct {
	listener net.Listener
	target   string
	open     chan struct{}
	openOnce sync.Once

	// mu guards conns and closed.
	mu     sync.Mutex
	conns  []net.Conn
	closed bool
	wg     sync.WaitGroup
}

// startGate starts a closed gate to target (host:port) on a free port.
func startGate(t *testing.T, target string) *gate {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{listener: l, target: target, open: make(chan struct{})}
	g.wg.Go(g.serve)
	t.Cleanup(g.close)
	return g
}

// Addr is the gate's address.
func (g *gate) Addr() string { return g.listener.Addr().String() }

// Open lets held and new connections through.
func (g *gate) Open() { g.openOnce.Do(func() { close(g.open) }) }

func (g *gate) serve() {
	for {
		conn, err := g.listener.Accept()
		if err != nil {
			return
		}
		if !g.track(conn) {
			_ = conn.Close()
			return
		}
		g.wg.Go(func() { g.forward(conn) })
	}
}

// track remembers conn for close; false when the gate is closing.
func (g *gate) track(conn net.Conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.conns = append(g.conns, conn)
	return true
}

func (g *gate) forward(conn net.Conn) {
	defer func() { _ = conn.Close() }()
	<-g.open
	upstream, err := net.Dial("tcp", g.target)
	if err != nil {
		return
	}
	if !g.track(upstream) {
		_ = upstream.Close()
		return
	}
	defer func() { _ = upstream.Close() }()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(upstream, conn); done <- struct{}{} }()
	go func() { _, _ = io.Copy(conn, upstream); done <- struct{}{} }()
	<-done
}

func (g *gate) close() {
	_ = g.listener.Close()
	g.Open()
	g.mu.Lock()
	g.closed = true
	for _, c := range g.conns {
		_ = c.Close()
	}
	g.mu.Unlock()
	g.wg.Wait()
}

// kubeConfigThrough rewrites every cluster of a kubeconfig to reach its
// server through the gate. The server certificate stays valid: it names
// 127.0.0.1, whatever the port.
func kubeConfigThrough(t *testing.T, kubeConfig []byte, g *gate) []byte {
	t.Helper()
	cfg, err := clientcmd.Load(kubeConfig)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Clusters) == 0 {
		t.Fatal(errors.New("kubeconfig has no cluster"))
	}
	for _, c := range cfg.Clusters {
		u, err := url.Parse(c.Server)
		if err != nil {
			t.Fatal(err)
		}
		if u.Host != g.target {
			t.Fatalf("kubeconfig server %s is not the gate's target %s", c.Server, g.target)
		}
		u.Host = g.Addr()
		c.Server = u.String()
	}
	out, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
