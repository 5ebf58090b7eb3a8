package k8stest

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
)

// The environment shared by the tests of one test binary.
var (
	// mainRunning is set by Main before any test runs.
	mainRunning atomic.Bool
	// sharedOptions is written by Main before m.Run and only read after.
	sharedOptions Options

	// sharedOnce starts sharedEnv on first use; sharedEnv and sharedErr are
	// written only inside it.
	sharedOnce sync.Once
	sharedEnv  *Env
	sharedErr  error
)

// Main runs the tests of a test binary and exits; call it from TestMain:
//
//	func TestMain(m *testing.M) { k8stest.Main(m, k8stest.Options{}) }
//
// The shared environment starts when a test first calls New or Shared, so a
// run that selects only unit tests starts no API server. It is stopped after
// the last test.
func Main(m *testing.M, opts Options) {
	sharedOptions = opts
	mainRunning.Store(true)
	code := m.Run()
	if sharedEnv != nil {
		if err := sharedEnv.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "k8stest: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}

// Shared returns the environment shared by the tests of this binary,
// starting it on first use. It fails tb if Main is not running the binary or
// the environment cannot start (e.g. the binaries are missing).
func Shared(tb testing.TB) *Env {
	tb.Helper()
	if !mainRunning.Load() {
		tb.Fatal("k8stest: the test binary must run through k8stest.Main: " +
			"add func TestMain(m *testing.M) { k8stest.Main(m, k8stest.Options{}) }")
	}
	started := false
	sharedOnce.Do(func() {
		started = true
		sharedEnv, sharedErr = Start(sharedOptions)
	})
	if sharedErr != nil {
		tb.Fatalf("k8stest: %v", sharedErr)
	}
	if started {
		tb.Logf("k8stest: etcd and kube-apiserver ready after %v", sharedEnv.StartupDuration)
	}
	return sharedEnv
}

// New returns a Fixture on the shared environment: a fresh namespace and a
// unique node name for tb, removed again when tb ends.
func New(tb testing.TB) *Fixture {
	tb.Helper()
	return Shared(tb).NewFixture(tb)
}
