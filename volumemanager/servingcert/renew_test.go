package servingcert_test

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/csi-volmgr/csi-volmgr/volumemanager/servingcert"
)

// TestRenewerRenewsBeforeExpiry: under an agent that runs on, the
// certificate is replaced once it enters its last RenewBefore (its year of
// validity nearly over), not before.
func TestRenewerRenewsBeforeExpiry(t *testing.T) {
	certFile, _, clk, renewed := startRenewer(t)
	first := readFile(t, certFile)

	// advance steps the clock a day at a time, as the renewer looks daily.
	advance := func(days int) {
		t.Helper()
		for range days {
			waitForTimer(t, clk)
			clk.Step(24 * time.Hour)
		}
	}
	// A year of validity: 335 days pass without a renewal.
	advance(334)
	waitForTimer(t, clk)
	select {
	case <-renewed:
		t.Fatal("renewed with more than RenewBefore of validity left")
	default:
	}
	if !bytes.Equal(readFile(t, certFile), first) {
		t.Fatal("the certificate changed with more than RenewBefore of validity left")
	}
	advance(2)
	expectRenewal(t, renewed)
	if bytes.Equal(readFile(t, certFile), first) {
		t.Error("the renewer said it renewed, the certificate on disk is the same")
	}
}

// TestRenewerRemakesARemovedPair: a pair removed by hand under a running
// agent is made again within a day.
func TestRenewerRemakesARemovedPair(t *testing.T) {
	certFile, keyFile, clk, renewed := startRenewer(t)
	waitForTimer(t, clk)
	for _, f := range []string{certFile, keyFile} {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	clk.Step(24 * time.Hour)
	expectRenewal(t, renewed)
	if _, err := os.Stat(certFile); err != nil {
		t.Errorf("the removed pair was not made again: %v", err)
	}
}

// startRenewer writes a pair and runs a Renewer of it on a fake clock
// until the test ends; renewed receives after each renewal.
func startRenewer(t *testing.T) (certFile, keyFile string, clk *clocktesting.FakeClock, renewed chan struct{}) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	opts := servingcert.Options{Dir: t.TempDir(), Host: "host-a"}
	certFile, keyFile, _, err := servingcert.Ensure(opts)
	if err != nil {
		t.Fatal(err)
	}
	clk = clocktesting.NewFakeClock(time.Now())
	renewed = make(chan struct{}, 1)
	r := &servingcert.Renewer{Options: opts, Clock: clk, Renewed: func() { renewed <- struct{}{} }}
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return certFile, keyFile, clk, renewed
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func waitForTimer(t *testing.T, clk *clocktesting.FakeClock) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !clk.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("the renewer does not wait on its clock")
		}
		time.Sleep(time.Millisecond)
	}
}

func expectRenewal(t *testing.T, renewed <-chan struct{}) {
	t.Helper()
	select {
	case <-renewed:
	case <-time.After(10 * time.Second):
		t.Fatal("no renewal")
	}
}
