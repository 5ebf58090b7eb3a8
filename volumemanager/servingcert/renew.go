package servingcert

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"path/filepath"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

const (
	// checkEvery bounds the wait between two looks at the pair on disk, so
	// that a pair removed or broken by hand is made again within a day.
	checkEvery = 24 * time.Hour
	// retryAfter is the wait after a renewal that failed, or that did not
	// give a pair that fits.
	retryAfter = time.Hour
)

// Renewer keeps the pair of Options fitting while the agent runs: it
// calls Ensure when the certificate enters its last RenewBefore, and when
// the pair on disk was removed or broken (looked at daily). The serving
// side follows the files on disk (the API server's dynamic certificate
// content), so a renewed pair is served without a restart; it may log
// once that key and certificate do not match, between the two renames.
type Renewer struct {
	Options Options
	// Clock is the real clock when nil.
	Clock clock.WithTicker
	// Renewed, when set, is called after a new pair was written.
	Renewed func()
}

// Run renews until ctx ends.
func (r *Renewer) Run(ctx context.Context) {
	clk := r.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	logger := klog.FromContext(ctx)
	certFile := filepath.Join(r.Options.Dir, CertFileName)
	keyFile := filepath.Join(r.Options.Dir, KeyFileName)
	for {
		wait := r.untilRenewal(certFile, keyFile, clk.Now())
		if wait <= 0 {
			_, _, generated, err := ensureAt(r.Options, clk.Now())
			switch {
			case err != nil:
				logger.Error(err, "Cannot renew the self-signed serving certificate; the one on disk is served until it expires", "retryIn", retryAfter)
			case generated:
				logger.Info("Renewed the self-signed serving certificate", "certificate", certFile)
				if r.Renewed != nil {
					r.Renewed()
				}
			}
			if r.untilRenewal(certFile, keyFile, clk.Now()) <= 0 {
				wait = retryAfter
			}
		}
		if wait <= 0 {
			continue
		}
		t := clk.NewTimer(min(wait, checkEvery))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

// untilRenewal is how long the pair on disk still fits: zero when it must
// be replaced now.
func (r *Renewer) untilRenewal(certFile, keyFile string, now time.Time) time.Duration {
	if !fits(certFile, keyFile, r.Options, now) {
		return 0
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return 0
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return 0
	}
	return max(leaf.NotAfter.Add(-RenewBefore).Sub(now), 0)
}
