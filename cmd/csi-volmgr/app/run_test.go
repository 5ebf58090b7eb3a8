package app

import (
	"errors"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// TestFlagErrorsNameTheFlag checks that every Config field the volume
// manager rejects comes back naming the flag a user sets.
func TestFlagErrorsNameTheFlag(t *testing.T) {
	err := errors.Join(
		&volumemanager.ConfigError{Field: "RootDir", Err: errors.New(`"relative" must be an absolute path`)},
		&volumemanager.ConfigError{Field: "FrontDriver", Err: errors.New("is set without a front endpoint")},
		errors.New("something else"),
	)
	want := "--root-dir \"relative\" must be an absolute path\n--front-driver is set without a front endpoint\nsomething else"
	if got := (&RunOptions{}).flagErrors(err).Error(); got != want {
		t.Errorf("flagErrors = %q, want %q", got, want)
	}
	single := &volumemanager.ConfigError{Field: "HTTPEndpoint", Err: errors.New("127.0.0.1:9809: address already in use")}
	if got := (&RunOptions{}).flagErrors(single).Error(); got != "--http-endpoint 127.0.0.1:9809: address already in use" {
		t.Errorf("flagErrors(single) = %q", got)
	}
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	NewRunOptions().AddFlags(fs)
	for field, flag := range flagOf {
		if fs.Lookup(strings.TrimPrefix(flag, "--")) == nil {
			t.Errorf("field %s maps to %s, which is not a flag of run", field, flag)
		}
	}
}
