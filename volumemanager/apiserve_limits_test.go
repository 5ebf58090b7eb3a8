package volumemanager_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// shortLimits are bounds a test sees fire in a moment.
func shortLimits() volumemanager.ServerLimits {
	l := volumemanager.DefaultServerLimits(0)
	l.ReadHeaderTimeout, l.ReadTimeout, l.WriteTimeout, l.IdleTimeout = 500*time.Millisecond, time.Second, time.Second, 500*time.Millisecond
	l.MaxHeaderBytes = 4 << 10
	l.MaxConnections, l.MaxConnectionsPerSource = 6, 3
	return l
}

// startBounded runs a standalone agent whose TCP endpoint has limits, and
// returns the endpoint's address and the API socket. The endpoint is on
// the loopback in plain HTTP, so that the tests speak raw HTTP on it: the
// bounds are the http.Server's and the listener's, under TLS the same.
func startBounded(t *testing.T, limits volumemanager.ServerLimits) (tcp, socket string) {
	t.Helper()
	tcp = freeAddress(t)
	n := startStandaloneWith(t, func(c *volumemanager.Config) {
		c.HTTPEndpoint, c.HTTPAccess.Plaintext = tcp, true
		volumemanager.SetServerLimits(c, limits)
	})
	return tcp, volumemanager.SocketPath(n.root)
}

// dial opens a connection to addr from the local address from ("" any).
func dial(t *testing.T, addr, from string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if from != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	c, err := d.DialContext(t.Context(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// ping sends GET /healthz/ping on c (keep-alive) and returns the status,
// or an error when the connection is closed.
func ping(c net.Conn) (int, error) {
	if _, err := io.WriteString(c, "GET /healthz/ping HTTP/1.1\r\nHost: agent\r\n\r\n"); err != nil {
		return 0, err
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// closedWithin says whether the server closes c (a read returns EOF or a
// reset) within d.
func closedWithin(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := c.Read(make([]byte, 1))
	if err == nil {
		return false
	}
	ne, ok := errors.AsType[net.Error](err)
	return !ok || !ne.Timeout()
}

// TestTCPIdleAndSilentConnectionsClosed: a keep-alive connection idle for
// longer than IdleTimeout, and a connection that never sends its headers
// (ReadHeaderTimeout), are closed by the agent.
func TestTCPIdleAndSilentConnectionsClosed(t *testing.T) {
	tcp, _ := startBounded(t, shortLimits())
	idle := dial(t, tcp, "")
	if code, err := ping(idle); err != nil || code != http.StatusOK {
		t.Fatalf("ping: %d, %v", code, err)
	}
	if !closedWithin(idle, 3*time.Second) {
		t.Error("a keep-alive connection idle past IdleTimeout (500ms) is still open after 3s")
	}
	silent := dial(t, tcp, "")
	if !closedWithin(silent, 3*time.Second) {
		t.Error("a connection that sent nothing is still open 3s after ReadHeaderTimeout (500ms)")
	}
	// A slow sender of headers is cut off too.
	slow := dial(t, tcp, "")
	_, _ = io.WriteString(slow, "GET /healthz HTTP/1.1\r\n")
	if !closedWithin(slow, 3*time.Second) {
		t.Error("a connection whose headers never end is still open 3s after ReadHeaderTimeout (500ms)")
	}
}

// TestTCPHeaderTooLarge: headers past MaxHeaderBytes get 431.
func TestTCPHeaderTooLarge(t *testing.T) {
	tcp, _ := startBounded(t, shortLimits())
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+tcp+"/healthz", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+strings.Repeat("x", 16<<10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("16 KiB of headers answered %d, want 431", resp.StatusCode)
	}
	if code := call(t, http.DefaultClient, http.MethodGet, "http://"+tcp+"/healthz", "short"); code != http.StatusOK {
		t.Errorf("small headers answered %d, want 200", code)
	}
}

// TestTCPConnectionCap: past MaxConnectionsPerSource from one address, and
// past MaxConnections in all, a new connection is closed at once; a
// closed connection frees its place.
func TestTCPConnectionCap(t *testing.T) {
	limits := shortLimits()
	limits.IdleTimeout, limits.ReadHeaderTimeout = time.Minute, time.Minute
	tcp, socket := startBounded(t, limits)
	var held []net.Conn
	for range 3 {
		c := dial(t, tcp, "127.0.0.1")
		if code, err := ping(c); err != nil || code != http.StatusOK {
			t.Fatalf("connection within the bounds: %d, %v", code, err)
		}
		held = append(held, c)
	}
	over := dial(t, tcp, "127.0.0.1")
	if _, err := ping(over); err == nil {
		t.Error("a 4th connection from one address was served; want it closed (MaxConnectionsPerSource 3)")
	}
	// Other addresses fill the rest of the total.
	for _, from := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.3"} {
		if code, err := ping(dial(t, tcp, from)); err != nil || code != http.StatusOK {
			t.Fatalf("connection from %s within the bounds: %d, %v", from, code, err)
		}
	}
	if _, err := ping(dial(t, tcp, "127.0.0.4")); err == nil {
		t.Error("a 7th connection was served; want it closed (MaxConnections 6)")
	}
	// Both refusals are counted.
	if n := refusedCount(t, socket, "connections"); n < 2 {
		t.Errorf("csi_volmgr_http_refused_total{reason=\"connections\"} = %v, want at least 2", n)
	}
	// A place given back is taken again.
	_ = held[0].Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, err := ping(dial(t, tcp, "127.0.0.1"))
		if err == nil && code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a connection closed, a new one is still refused: %d, %v", code, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRequestBodyTooLarge: a running-pods report past 4 MiB, and a
// containers-stopped signal with a body past 64 KiB, get 413 (on the
// socket, which serves them without credentials; the TCP endpoint wraps
// the same handler).
func TestRequestBodyTooLarge(t *testing.T) {
	_, socket := startBounded(t, shortLimits())
	client := unixClient(socket)
	for _, tc := range []struct {
		what, method, path string
		body               []byte
		chunked            bool
	}{
		{"a running-pods report of 5 MiB", http.MethodPut, volumemanager.RunningPodsPath, bytes.Repeat([]byte(" "), 5<<20), false},
		{"a chunked running-pods report of 5 MiB", http.MethodPut, volumemanager.RunningPodsPath,
			append(append([]byte(`{"uids":["`), bytes.Repeat([]byte("u"), 5<<20)...), []byte(`"]}`)...), true},
		{"a containers-stopped signal with 128 KiB", http.MethodPost, volumemanager.PodsPath + "/ns/p/containers-stopped?uid=u", bytes.Repeat([]byte("x"), 128<<10), false},
	} {
		var body io.Reader = bytes.NewReader(tc.body)
		if tc.chunked {
			body = io.MultiReader(body) // no length: sent chunked
		}
		req, err := http.NewRequestWithContext(t.Context(), tc.method, "http://csi-volmgr"+tc.path, body)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.what, err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("%s answered %d, want 413", tc.what, resp.StatusCode)
		}
	}
}

// refusedCount reads csi_volmgr_http_refused_total of reason from the
// agent's /metrics on its socket.
func refusedCount(t *testing.T, socket, reason string) float64 {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://csi-volmgr/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := unixClient(socket).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	prefix := `csi_volmgr_http_refused_total{reason="` + reason + `"} `
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), prefix); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatalf("no %s in /metrics", prefix)
	return 0
}
