package helm_test

import (
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
)

// lint runs `helm lint --strict` on the chart with vals and returns its
// findings of severity warning and above (strict makes warnings errors).
func lint(vals map[string]any) []error {
	l := action.NewLint()
	l.Strict = true
	l.Namespace = releaseNamespace
	return l.Run([]string{chartDir}, vals).Errors
}

// TestChartLint runs helm lint --strict with the default values and with
// every option set.
func TestChartLint(t *testing.T) {
	for name, vals := range valueSets {
		t.Run(name, func(t *testing.T) {
			if errs := lint(values(t, vals)); len(errs) != 0 {
				t.Fatalf("helm lint: %v", errs)
			}
		})
	}
}

// TestChartLintFails shows that lint fails on values values.schema.json
// refuses: a key values.yaml does not have and a value out of its range.
// (helm lint reports a template's fail() only as information; the
// contradictions the templates refuse are TestChartRejects'.)
func TestChartLintFails(t *testing.T) {
	for vals, want := range map[string]string{
		"registerNodes: true": "registerNodes",
		"logFormat: yaml":     "logFormat",
	} {
		t.Run(want, func(t *testing.T) {
			errs := lint(values(t, vals))
			if len(errs) == 0 {
				t.Fatalf("helm lint passes with %q", vals)
			}
			found := false
			for _, err := range errs {
				found = found || strings.Contains(err.Error(), want)
			}
			if !found {
				t.Fatalf("helm lint with %q: got %v, want an error naming %q", vals, errs, want)
			}
		})
	}
}
