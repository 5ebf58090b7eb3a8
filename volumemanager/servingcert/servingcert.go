// Package servingcert keeps the self-signed serving certificate of the
// agent's TCP endpoint when no certificate is given, as the kubelet's
// InitializeTLS keeps kubelet.crt and kubelet.key in its --cert-dir when
// --tls-cert-file is not set: a certificate of its own CA (client-go's
// GenerateSelfSignedCertKey: a serving certificate followed by the CA that
// signed it, valid for a year), for the host's names and addresses.
//
// Unlike the kubelet, Ensure makes a new pair when the one on disk no
// longer fits: unreadable, key and certificate not of one pair, expiring
// within RenewBefore, or not valid for a name or address now asked for;
// and Renewer does the same while the agent runs, where the kubelet's
// certificate expires under a kubelet that was not restarted for a year.
// Both files are written atomically (a temporary file renamed), the key
// with mode 0600.
package servingcert

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	certutil "k8s.io/client-go/util/cert"
)

// The files of the pair in its directory.
const (
	CertFileName = "csi-volmgr-serving.crt"
	KeyFileName  = "csi-volmgr-serving.key"
)

// RenewBefore is how long before it expires a certificate on disk is
// replaced: at start by Ensure, while the agent runs by Renewer.
const RenewBefore = 30 * 24 * time.Hour

// Options say where the pair is kept and what it is valid for.
type Options struct {
	// Dir holds the pair; it is created with mode 0700. Required.
	Dir string
	// Host is the certificate's subject and first name (the host name).
	// Required.
	Host string
	// DNSNames and IPs are further names and addresses it is valid for.
	DNSNames []string
	IPs      []net.IP
}

// Ensure returns the paths of the pair in opts.Dir, writing a new pair
// first unless the one there is readable, of one key, valid for more
// than RenewBefore and for every name and address of opts. generated
// says it wrote one.
func Ensure(opts Options) (certFile, keyFile string, generated bool, err error) {
	return ensureAt(opts, time.Now())
}

func ensureAt(opts Options, now time.Time) (certFile, keyFile string, generated bool, err error) {
	if opts.Dir == "" || opts.Host == "" {
		return "", "", false, errors.New("servingcert: a directory and a host are required")
	}
	certFile, keyFile = filepath.Join(opts.Dir, CertFileName), filepath.Join(opts.Dir, KeyFileName)
	if fits(certFile, keyFile, opts, now) {
		return certFile, keyFile, false, nil
	}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return "", "", false, fmt.Errorf("servingcert: %w", err)
	}
	cert, key, err := certutil.GenerateSelfSignedCertKey(opts.Host, opts.IPs, opts.DNSNames)
	if err != nil {
		return "", "", false, fmt.Errorf("servingcert: generating a self-signed certificate: %w", err)
	}
	// The key first: a crash between the two renames leaves a pair that
	// does not match, which the next start replaces.
	if err := writeAtomic(keyFile, key, 0o600); err != nil {
		return "", "", false, err
	}
	if err := writeAtomic(certFile, cert, 0o644); err != nil {
		return "", "", false, err
	}
	return certFile, keyFile, true, nil
}

// fits says whether the pair on disk can be served for opts at now.
func fits(certFile, keyFile string, opts Options, now time.Time) bool {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil || len(pair.Certificate) == 0 {
		return false
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil || now.Before(leaf.NotBefore) || now.Add(RenewBefore).After(leaf.NotAfter) {
		return false
	}
	for _, name := range append([]string{opts.Host}, opts.DNSNames...) {
		if leaf.VerifyHostname(name) != nil {
			return false
		}
	}
	for _, ip := range opts.IPs {
		if !slices.ContainsFunc(leaf.IPAddresses, ip.Equal) {
			return false
		}
	}
	return true
}

// writeAtomic writes data to path through a temporary file of mode perm
// in the same directory, renamed over path.
func writeAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return fmt.Errorf("servingcert: %w", err)
	}
	tmp := f.Name()
	_, err = bytes.NewReader(data).WriteTo(f)
	err = errors.Join(err, f.Chmod(perm), f.Sync(), f.Close())
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("servingcert: writing %s: %w", path, err)
	}
	return nil
}

// HostNames returns what the certificate of an endpoint on host (the host
// part of --http-endpoint) is valid for: the host's name (the subject),
// extra names (the node's) and "localhost"; the loopback addresses, and
// host itself when it is an address, or, when it is empty or unspecified
// (every interface), every address of the host but link-local ones.
func HostNames(host string, extra ...string) (subject string, dnsNames []string, ips []net.IP, err error) {
	subject, err = os.Hostname()
	if err != nil {
		return "", nil, nil, fmt.Errorf("servingcert: the host name: %w", err)
	}
	for _, n := range append(extra, "localhost") {
		if n != "" && n != subject && !slices.Contains(dnsNames, n) {
			dnsNames = append(dnsNames, n)
		}
	}
	ips = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	add := func(ip net.IP) {
		if !slices.ContainsFunc(ips, ip.Equal) {
			ips = append(ips, ip)
		}
	}
	ip := net.ParseIP(host)
	switch {
	case ip != nil && !ip.IsUnspecified():
		add(ip)
	case ip != nil || host == "":
		addrs, err := net.InterfaceAddrs()
		if err != nil {
			return "", nil, nil, fmt.Errorf("servingcert: the host's addresses: %w", err)
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && !n.IP.IsLinkLocalUnicast() && !n.IP.IsLinkLocalMulticast() {
				add(n.IP)
			}
		}
	default:
		if host != subject && !slices.Contains(dnsNames, host) {
			dnsNames = append(dnsNames, host)
		}
	}
	return subject, dnsNames, ips, nil
}
