package check

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Status is the outcome of a scenario.
type Status string

// The outcomes of a scenario.
const (
	Pass    Status = "pass"
	Fail    Status = "fail"
	Skipped Status = "skipped"
)

// Call is one CSI call a scenario made.
type Call struct {
	// Method is the CSI method, e.g. NodeStageVolume.
	Method string `json:"method"`
	// Code is the gRPC code name of the answer ("OK" for success).
	Code string `json:"code"`
	// Message is the error message, if any.
	Message string `json:"message,omitempty"`
	// Duration is how long the call took.
	Duration time.Duration `json:"duration"`
	// Note says what the check did to the call (its answer withheld, the
	// caller killed during it).
	Note string `json:"note,omitempty"`
}

// Result is the outcome of one scenario.
type Result struct {
	// Name is the scenario's name (what --scenario matches).
	Name string `json:"name"`
	// Title says what the scenario does.
	Title string `json:"title"`
	// Status is pass, fail or skipped.
	Status Status `json:"status"`
	// Reason is why the scenario was skipped, or the step that failed.
	Reason string `json:"reason,omitempty"`
	// Expected is, on failure, what the CSI spec or the kubelet expects.
	Expected string `json:"expected,omitempty"`
	// Got is, on failure, what the driver did.
	Got string `json:"got,omitempty"`
	// Duration is the scenario's run time, cleanup included.
	Duration time.Duration `json:"duration"`
	// Calls are the CSI calls made, in the order they ended.
	Calls []Call `json:"calls,omitempty"`
	// Cleanup lists what the cleanup after the scenario found left over
	// (and removed) or could not remove.
	Cleanup []string `json:"cleanup,omitempty"`
}

// Report is the outcome of a run.
type Report struct {
	// Driver is the driver's name (GetPluginInfo).
	Driver string `json:"driver"`
	// Version is the driver's vendor version.
	Version string `json:"version,omitempty"`
	// Endpoint is the node plugin's endpoint.
	Endpoint string `json:"endpoint"`
	// NodeCapabilities and ControllerCapabilities are what the driver offers.
	NodeCapabilities       []string `json:"nodeCapabilities"`
	ControllerCapabilities []string `json:"controllerCapabilities,omitempty"`
	// Results are the scenarios' outcomes, in the order they ran.
	Results []Result `json:"results"`
	// Duration is the whole run's time.
	Duration time.Duration `json:"duration"`
	// Cleanup lists what the final cleanup found left over or could not remove.
	Cleanup []string `json:"cleanup,omitempty"`
}

// Failed says whether any scenario failed or the cleanup found something
// it could not remove.
func (r *Report) Failed() bool {
	for _, res := range r.Results {
		if res.Status == Fail {
			return true
		}
	}
	return len(r.Cleanup) > 0
}

// Count returns how many scenarios ended with s.
func (r *Report) Count(s Status) int {
	n := 0
	for _, res := range r.Results {
		if res.Status == s {
			n++
		}
	}
	return n
}

// WriteTable writes the report for people (and pull requests): one line
// per scenario, then per scenario the CSI calls and, on failure, what was
// expected and what the driver did.
func (r *Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "csi-volmgr check of %s %s at %s\n", r.Driver, r.Version, r.Endpoint)
	fmt.Fprintf(&b, "node capabilities: %s\n", strings.Join(r.NodeCapabilities, ", "))
	if len(r.ControllerCapabilities) > 0 {
		fmt.Fprintf(&b, "controller capabilities: %s\n", strings.Join(r.ControllerCapabilities, ", "))
	}
	b.WriteString("\n")
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tRESULT\tTIME\tCALLS\tDETAIL")
	for _, res := range r.Results {
		detail := res.Reason
		if res.Status == Pass {
			detail = res.Title
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", res.Name, res.Status, seconds(res.Duration), len(res.Calls), detail)
	}
	_ = tw.Flush()
	for _, res := range r.Results {
		if res.Status == Skipped {
			continue
		}
		fmt.Fprintf(&b, "\n### %s: %s (%s)\n", res.Name, res.Status, seconds(res.Duration))
		if res.Status == Fail {
			fmt.Fprintf(&b, "    step:     %s\n    expected: %s\n    got:      %s\n", res.Reason, res.Expected, res.Got)
		}
		for _, c := range res.Calls {
			line := fmt.Sprintf("    %-28s %-18s %8s", c.Method, c.Code, millis(c.Duration))
			if c.Note != "" {
				line += "  (" + c.Note + ")"
			}
			if c.Message != "" && c.Code != "OK" {
				line += "  " + c.Message
			}
			b.WriteString(line + "\n")
		}
		for _, c := range res.Cleanup {
			fmt.Fprintf(&b, "    cleanup: %s\n", c)
		}
	}
	fmt.Fprintf(&b, "\n%d passed, %d failed, %d skipped in %s\n", r.Count(Pass), r.Count(Fail), r.Count(Skipped), seconds(r.Duration))
	for _, c := range r.Cleanup {
		fmt.Fprintf(&b, "cleanup: %s\n", c)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// JUnit types, as CI systems read them.
type junitSuites struct {
	XMLName xml.Name     `xml:"testsuites"`
	Suites  []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Skipped  int         `xml:"skipped,attr"`
	Time     string      `xml:"time,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	Classname string        `xml:"classname,attr"`
	Time      string        `xml:"time,attr"`
	Failure   *junitMessage `xml:"failure,omitempty"`
	Skipped   *junitMessage `xml:"skipped,omitempty"`
	SystemOut string        `xml:"system-out,omitempty"`
}

type junitMessage struct {
	Message string `xml:"message,attr"`
	Text    string `xml:",chardata"`
}

// WriteJUnit writes the report as a JUnit XML document: one test suite,
// one test case per scenario, the calls in its system-out.
func (r *Report) WriteJUnit(w io.Writer) error {
	s := junitSuite{Name: "csi-volmgr check " + r.Driver, Tests: len(r.Results), Failures: r.Count(Fail),
		Skipped: r.Count(Skipped), Time: fmt.Sprintf("%.3f", r.Duration.Seconds())}
	for _, res := range r.Results {
		c := junitCase{Name: res.Name, Classname: "csi-volmgr.check", Time: fmt.Sprintf("%.3f", res.Duration.Seconds())}
		var out strings.Builder
		for _, call := range res.Calls {
			fmt.Fprintf(&out, "%s %s %s %s %s\n", call.Method, call.Code, millis(call.Duration), call.Note, call.Message)
		}
		for _, cl := range res.Cleanup {
			fmt.Fprintf(&out, "cleanup: %s\n", cl)
		}
		c.SystemOut = out.String()
		switch res.Status {
		case Fail:
			c.Failure = &junitMessage{Message: res.Reason, Text: "expected: " + res.Expected + "\ngot: " + res.Got}
		case Skipped:
			c.Skipped = &junitMessage{Message: res.Reason}
		}
		s.Cases = append(s.Cases, c)
	}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(junitSuites{Suites: []junitSuite{s}}); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}

func seconds(d time.Duration) string { return fmt.Sprintf("%.2fs", d.Seconds()) }

func millis(d time.Duration) string {
	if d < 10*time.Millisecond {
		return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000)
	}
	return d.Round(time.Millisecond).String()
}
