package app

import (
	"strings"
	"testing"

	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
)

// TestLoggingFormats: run takes --logging-format=json (and text); another
// format is refused with the formats it knows.
func TestLoggingFormats(t *testing.T) {
	fg := featuregate.NewFeatureGate()
	if err := logsapi.AddFeatureGates(fg); err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{"text", "json"} {
		o := NewRunOptions()
		o.Logging.Format = format
		if errs := logsapi.Validate(&o.Logging, fg, nil); len(errs) > 0 {
			t.Errorf("--logging-format=%s: %v", format, errs.ToAggregate())
		}
	}
	o := NewRunOptions()
	o.Logging.Format = "yaml"
	if errs := logsapi.Validate(&o.Logging, fg, nil); len(errs) == 0 {
		t.Error("--logging-format=yaml accepted")
	}
	if usage := newRunCommand().Flags().Lookup("logging-format").Usage; !strings.Contains(usage, `"json"`) {
		t.Errorf("--logging-format's help %q does not name json", usage)
	}
}
