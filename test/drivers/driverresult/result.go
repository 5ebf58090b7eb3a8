// Package driverresult is the record of one stock CSI driver's run of `make drivers`: what
// `csi-volmgr check` found against its node plugin, and how the agent's lifecycle went with it on a
// real kube-apiserver. The records are committed under docs/drivers/results/ and the compatibility
// table of docs/drivers.md is rendered from them (hack/driverstable), never typed.
package driverresult

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// The outcomes of a Step.
const (
	Pass = "pass"
	Fail = "fail"
	Skip = "skip"
)

// Result is one driver's run.
type Result struct {
	// Name is the short name of the driver's directory under test/drivers (e.g. "juicefs").
	Name string `json:"name"`
	// Driver is the CSI driver name its node plugin reports (e.g. "csi.juicefs.com").
	Driver string `json:"driver"`
	// Kind says what the driver stands for in the matrix: "fuse", "ephemeral-inline", "block", ….
	Kind string `json:"kind"`
	// Module and Version are the Go module and version its binaries were built from.
	Module  string `json:"module"`
	Version string `json:"version"`
	// Commit is csi-volmgr's commit (git describe --always --dirty) the run tested.
	Commit string `json:"commit"`
	// Date is when the run ended, RFC 3339, UTC.
	Date string `json:"date"`
	// Machine names the machine: cores, kernel, Go version.
	Machine string `json:"machine"`
	// Checks are the scenarios of `csi-volmgr check` against the node plugin, in its order.
	Checks []Step `json:"checks"`
	// Lifecycle are the steps of the agent's lifecycle with the driver on a real kube-apiserver.
	Lifecycle []Step `json:"lifecycle"`
	// NodePluginFlags are the exact flags the node plugin ran with beside csi-volmgr.
	NodePluginFlags []string `json:"nodePluginFlags"`
	// Settings are what a user changes in the driver's own install to run it beside csi-volmgr
	// instead of a kubelet (the kubeletDir-style values of its Helm chart), one per line.
	Settings []string `json:"settings"`
	// Notes are what a reader should know: a driver defect seen, a csi-volmgr defect fixed, why a
	// step cannot run here.
	Notes []string `json:"notes,omitempty"`
	// Seconds is how long the whole run took.
	Seconds float64 `json:"seconds"`
}

// Step is one scenario or lifecycle step.
type Step struct {
	Name    string  `json:"name"`
	Result  string  `json:"result"`
	Reason  string  `json:"reason,omitempty"` // required for fail and skip
	Seconds float64 `json:"seconds"`
}

// Validate checks a record is complete enough to render.
func (r Result) Validate() error {
	var errs []error
	if r.Name == "" || r.Driver == "" || r.Module == "" || r.Version == "" || r.Commit == "" || r.Date == "" {
		errs = append(errs, fmt.Errorf("name, driver, module, version, commit and date are required (got %q %q %q %q %q %q)",
			r.Name, r.Driver, r.Module, r.Version, r.Commit, r.Date))
	}
	for _, group := range [][]Step{r.Checks, r.Lifecycle} {
		for _, s := range group {
			switch s.Result {
			case Pass:
			case Fail, Skip:
				if strings.TrimSpace(s.Reason) == "" {
					errs = append(errs, fmt.Errorf("%s: %s without a reason", s.Name, s.Result))
				}
			default:
				errs = append(errs, fmt.Errorf("%s: result %q is not pass, fail or skip", s.Name, s.Result))
			}
		}
	}
	return errors.Join(errs...)
}

// Counts returns how many steps of steps passed, failed and were skipped.
func Counts(steps []Step) (pass, fail, skip int) {
	for _, s := range steps {
		switch s.Result {
		case Pass:
			pass++
		case Fail:
			fail++
		case Skip:
			skip++
		}
	}
	return pass, fail, skip
}

// Write stores r as dir/<name>.json, atomically.
func Write(dir string, r Result) error {
	if err := r.Validate(); err != nil {
		return fmt.Errorf("driver result %s: %w", r.Name, err)
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+r.Name+".json.*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), filepath.Join(dir, r.Name+".json"))
}

// Load reads every dir/*.json, sorted by name.
func Load(dir string) ([]Result, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	var out []Result
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		var r Result
		dec := json.NewDecoder(strings.NewReader(string(b)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&r); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		if err := r.Validate(); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
