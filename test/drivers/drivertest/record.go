package drivertest

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/csi-volmgr/csi-volmgr/test/drivers/driverresult"
)

// Recorder fills a driverresult.Result step by step. A failed step fails the test (Errorf) and
// every later lifecycle step is recorded as skipped, naming the failed one: they depend on it.
type Recorder struct {
	t *testing.T
	// R is the Result; the test sets its NodePluginFlags, Checks and Notes.
	R      driverresult.Result
	failed string
}

// NewRecorder starts the record r of the driver, with the commit and machine filled in.
func NewRecorder(t *testing.T, r driverresult.Result) *Recorder {
	commit, err := driverresult.Commit(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	r.Commit = commit
	r.Machine = driverresult.Machine()
	return &Recorder{t: t, R: r}
}

// Step runs fn as the lifecycle step name and records its outcome; it returns whether it passed.
func (rec *Recorder) Step(name string, fn func() error) bool {
	rec.t.Helper()
	if rec.failed != "" {
		rec.R.Lifecycle = append(rec.R.Lifecycle, driverresult.Step{Name: name, Result: driverresult.Skip,
			Reason: "not run: the step " + rec.failed + " failed"})
		return false
	}
	began := time.Now()
	err := fn()
	s := driverresult.Step{Name: name, Result: driverresult.Pass, Seconds: Seconds(time.Since(began))}
	if err != nil {
		s.Result, s.Reason = driverresult.Fail, err.Error()
		rec.failed = name
		rec.t.Errorf("%s: %v", name, err)
	} else {
		rec.t.Logf("%s: pass (%.1fs)", name, s.Seconds)
	}
	rec.R.Lifecycle = append(rec.R.Lifecycle, s)
	return err == nil
}

// Note adds a line to the Result's notes.
func (rec *Recorder) Note(format string, args ...any) {
	rec.R.Notes = append(rec.R.Notes, fmt.Sprintf(format, args...))
}

// Write stores the Result in $DRIVERS_RESULTS when it is set; began is when the run began.
func (rec *Recorder) Write(began time.Time) {
	rec.R.Date = time.Now().UTC().Format(time.RFC3339)
	rec.R.Seconds = Seconds(time.Since(began))
	dir := os.Getenv("DRIVERS_RESULTS")
	if dir == "" {
		rec.t.Log("DRIVERS_RESULTS is not set: the result is not written")
		return
	}
	if err := driverresult.Write(dir, rec.R); err != nil {
		rec.t.Errorf("writing the result: %v", err)
		return
	}
	rec.t.Logf("result written to %s/%s.json", dir, rec.R.Name)
}

// Seconds is d in seconds, to the millisecond.
func Seconds(d time.Duration) float64 { return float64(d.Milliseconds()) / 1000 }
