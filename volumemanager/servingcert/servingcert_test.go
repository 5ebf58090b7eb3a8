package servingcert_test

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/csi-volmgr/csi-volmgr/volumemanager/servingcert"
)

// TestEnsureWritesAndKeepsThePair: the first call writes a pair (key
// 0600) that a client trusting the certificate file verifies for every
// name and address; the next keeps it; a new address, a broken pair or a
// missing key make a new one.
func TestEnsureWritesAndKeepsThePair(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	opts := servingcert.Options{Dir: dir, Host: "host-a", DNSNames: []string{"node-a", "localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv4(10, 1, 2, 3)}}
	certFile, keyFile, generated, err := servingcert.Ensure(opts)
	if err != nil || !generated {
		t.Fatalf("Ensure = %v, generated %v; want a new pair", err, generated)
	}
	if certFile != filepath.Join(dir, servingcert.CertFileName) || keyFile != filepath.Join(dir, servingcert.KeyFileName) {
		t.Errorf("paths %s, %s", certFile, keyFile)
	}
	if fi, err := os.Stat(keyFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("key %s: %v, mode %v; want 0600", keyFile, err, fi.Mode())
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("dir %s: %v, mode %v; want 0700", dir, err, fi.Mode())
	}
	verify(t, certFile, keyFile, "host-a", "node-a", "localhost", "127.0.0.1", "10.1.2.3")
	if entries, _ := os.ReadDir(dir); len(entries) != 2 {
		t.Errorf("%s holds %d files, want the pair alone (no temporary file)", dir, len(entries))
	}

	if _, _, generated, err := servingcert.Ensure(opts); err != nil || generated {
		t.Errorf("second Ensure = %v, generated %v; want the pair kept", err, generated)
	}

	opts.IPs = append(opts.IPs, net.IPv4(10, 9, 9, 9))
	if _, _, generated, err := servingcert.Ensure(opts); err != nil || !generated {
		t.Errorf("Ensure with a new address = %v, generated %v; want a new pair", err, generated)
	}
	verify(t, certFile, keyFile, "10.9.9.9")

	other := servingcert.Options{Dir: t.TempDir(), Host: "host-b"}
	otherKey := filepath.Join(other.Dir, servingcert.KeyFileName)
	if _, _, _, err := servingcert.Ensure(other); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(otherKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, generated, err := servingcert.Ensure(opts); err != nil || !generated {
		t.Errorf("Ensure with a key of another pair = %v, generated %v; want a new pair", err, generated)
	}
	verify(t, certFile, keyFile, "host-a")

	if err := os.Remove(keyFile); err != nil {
		t.Fatal(err)
	}
	if _, _, generated, err := servingcert.Ensure(opts); err != nil || !generated {
		t.Errorf("Ensure without the key = %v, generated %v; want a new pair", err, generated)
	}
}

// verify serves the pair and connects to it for each name as a client
// that trusts the certificate file alone.
func verify(t *testing.T, certFile, keyFile string, names ...string) {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		t.Fatal("no certificate in the file")
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			_ = c.Close()
		}
	}()
	for _, name := range names {
		c, err := tls.Dial("tcp", l.Addr().String(), &tls.Config{RootCAs: roots, ServerName: name, MinVersion: tls.VersionTLS12})
		if err != nil {
			t.Errorf("TLS to the pair as %s: %v", name, err)
			continue
		}
		_ = c.Close()
	}
}

// TestHostNames: an address endpoint adds itself, an empty or unspecified
// one every address of the host; loopback and localhost always.
func TestHostNames(t *testing.T) {
	host, _ := os.Hostname()
	subject, dns, ips, err := servingcert.HostNames("10.1.2.3", "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if subject != host {
		t.Errorf("subject %q, want the host name %q", subject, host)
	}
	if !slices.Contains(dns, "node-a") || !slices.Contains(dns, "localhost") {
		t.Errorf("names %v, want node-a and localhost", dns)
	}
	want := []string{"127.0.0.1", "::1", "10.1.2.3"}
	if len(ips) != len(want) {
		t.Fatalf("addresses %v, want %v", ips, want)
	}
	for i, ip := range ips {
		if ip.String() != want[i] {
			t.Errorf("addresses %v, want %v", ips, want)
		}
	}
	for _, all := range []string{"", "0.0.0.0", "::"} {
		_, _, ips, err := servingcert.HostNames(all)
		if err != nil {
			t.Fatal(err)
		}
		addrs, _ := net.InterfaceAddrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && !n.IP.IsLinkLocalUnicast() && !slices.ContainsFunc(ips, n.IP.Equal) {
				t.Errorf("HostNames(%q) lacks the host's address %s: %v", all, n.IP, ips)
			}
		}
	}
}
