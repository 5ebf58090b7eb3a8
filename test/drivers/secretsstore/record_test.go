//go:build drivers

package secretsstore_test

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/csi-volmgr/csi-volmgr/test/drivers/driverresult"
)

// recorder fills a driverresult.Result step by step. A failed step fails the test (Errorf) and
// every later lifecycle step is recorded as skipped, naming the failed one: they depend on it.
type recorder struct {
	t      *testing.T
	r      driverresult.Result
	failed string
}

func newRecorder(t *testing.T, r driverresult.Result) *recorder {
	r.Commit = gitDescribe(t)
	r.Machine = machine()
	return &recorder{t: t, r: r}
}

// step runs fn as the lifecycle step name and records its outcome; it returns whether it passed.
func (rec *recorder) step(name string, fn func() error) bool {
	rec.t.Helper()
	if rec.failed != "" {
		rec.r.Lifecycle = append(rec.r.Lifecycle, driverresult.Step{Name: name, Result: driverresult.Skip,
			Reason: "not run: the step " + rec.failed + " failed"})
		return false
	}
	began := time.Now()
	err := fn()
	s := driverresult.Step{Name: name, Result: driverresult.Pass, Seconds: seconds(time.Since(began))}
	if err != nil {
		s.Result, s.Reason = driverresult.Fail, err.Error()
		rec.failed = name
		rec.t.Errorf("%s: %v", name, err)
	} else {
		rec.t.Logf("%s: pass (%.1fs)", name, s.Seconds)
	}
	rec.r.Lifecycle = append(rec.r.Lifecycle, s)
	return err == nil
}

// note adds a line to the Result's notes.
func (rec *recorder) note(format string, args ...any) {
	rec.r.Notes = append(rec.r.Notes, fmt.Sprintf(format, args...))
}

// write stores the Result in $DRIVERS_RESULTS when it is set.
func (rec *recorder) write(began time.Time) {
	rec.r.Date = time.Now().UTC().Format(time.RFC3339)
	rec.r.Seconds = seconds(time.Since(began))
	dir := os.Getenv("DRIVERS_RESULTS")
	if dir == "" {
		rec.t.Log("DRIVERS_RESULTS is not set: the result is not written")
		return
	}
	if err := driverresult.Write(dir, rec.r); err != nil {
		rec.t.Errorf("writing the result: %v", err)
		return
	}
	rec.t.Logf("result written to %s/%s.json", dir, rec.r.Name)
}

func seconds(d time.Duration) float64 { return float64(d.Milliseconds()) / 1000 }

func gitDescribe(t *testing.T) string {
	out, err := exec.CommandContext(t.Context(), "git", "describe", "--always", "--dirty").Output()
	if err != nil {
		t.Fatalf("git describe: %v", err)
	}
	return strings.TrimSpace(string(out))
}

func machine() string {
	var u unix.Utsname
	kernel := "unknown kernel"
	if unix.Uname(&u) == nil {
		kernel = "Linux " + unix.ByteSliceToString(u.Release[:])
	}
	return fmt.Sprintf("%d cores, %s, %s", runtime.NumCPU(), kernel, runtime.Version())
}
