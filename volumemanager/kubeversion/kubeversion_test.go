package kubeversion_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/version"
	"k8s.io/klog/v2/textlogger"

	"github.com/csi-volmgr/csi-volmgr/volumemanager/kubeversion"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		major, minor string
		want         kubeversion.Version
		wantErr      bool
	}{
		{major: "1", minor: "34", want: kubeversion.Version{Major: 1, Minor: 34}},
		{major: "1", minor: "35+", want: kubeversion.Version{Major: 1, Minor: 35}}, // GKE, EKS
		{major: "1", minor: "", wantErr: true},                                     // a fake clientset's discovery
		{major: "", minor: "", wantErr: true},
		{major: "one", minor: "34", wantErr: true},
	} {
		got, err := kubeversion.Parse(&version.Info{Major: tc.major, Minor: tc.minor})
		if (err != nil) != tc.wantErr || (err == nil && got != tc.want) {
			t.Errorf("Parse(%q, %q) = %+v, %v; want %+v, error %v", tc.major, tc.minor, got, err, tc.want, tc.wantErr)
		}
	}
	if _, err := kubeversion.Parse(nil); err == nil {
		t.Error("Parse(nil) succeeded")
	}
}

// TestFeatures: which behaviours each minor gets, as the API server and
// the kubelet of that minor have them by default.
func TestFeatures(t *testing.T) {
	for _, tc := range []struct {
		minor int
		want  kubeversion.Features
	}{
		{33, kubeversion.Features{}},
		{34, kubeversion.Features{}},
		{35, kubeversion.Features{MutableCSINodeAllocatableCount: true}},
		{36, kubeversion.Features{MutableCSINodeAllocatableCount: true}},
		{37, kubeversion.Features{MutableCSINodeAllocatableCount: true, SELinuxMountAllAccessModes: true}},
		{38, kubeversion.Features{MutableCSINodeAllocatableCount: true, SELinuxMountAllAccessModes: true}},
	} {
		if got := (kubeversion.Version{Major: 1, Minor: tc.minor}).Features(); got != tc.want {
			t.Errorf("1.%d: features %+v, want %+v", tc.minor, got, tc.want)
		}
	}
	if kubeversion.Newest() != (kubeversion.Features{MutableCSINodeAllocatableCount: true, SELinuxMountAllAccessModes: true}) {
		t.Errorf("Newest() = %+v, want every feature on", kubeversion.Newest())
	}
	for v, want := range map[kubeversion.Version]string{
		{Major: 1, Minor: 34, GitVersion: "v1.34.4"}:                   "1.34 (v1.34.4)",
		{Major: 1, Minor: 37, GitVersion: "v0.0.0-master+$Format:%H$"}: "1.37",
		{Major: 1, Minor: 35}:                                          "1.35",
	} {
		if got := v.String(); got != want {
			t.Errorf("%#v.String() = %q, want %q", v, got, want)
		}
	}
	for minor, want := range map[int]bool{33: false, 34: true, 37: true, 38: false} {
		if got := (kubeversion.Version{Major: 1, Minor: minor}).Supported(); got != want {
			t.Errorf("1.%d supported = %v, want %v", minor, got, want)
		}
	}
}

// report returns what Report logged and returned.
func report(t *testing.T, v kubeversion.Version, err error) (string, kubeversion.Features) {
	t.Helper()
	var buf bytes.Buffer
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&buf), textlogger.Verbosity(0)))
	f := kubeversion.Report(logger, v, err)
	return buf.String(), f
}

// TestReport: a warning outside the range, one line per feature the
// minor lacks, nothing at the default verbosity on the newest.
func TestReport(t *testing.T) {
	t.Run("Newest", func(t *testing.T) {
		out, f := report(t, kubeversion.Version{Major: 1, Minor: 37, GitVersion: "v1.37.2"}, nil)
		if out != "" || f != kubeversion.Newest() {
			t.Errorf("logged %q, features %+v; want nothing and every feature", out, f)
		}
	})
	t.Run("Oldest", func(t *testing.T) {
		out, f := report(t, kubeversion.Version{Major: 1, Minor: 34, GitVersion: "v1.34.4"}, nil)
		if f != (kubeversion.Features{}) {
			t.Errorf("features %+v, want none", f)
		}
		if strings.Contains(out, "supports") || strings.Count(out, "\n") != 2 ||
			!strings.Contains(out, `feature="MutableCSINodeAllocatableCount"`) || !strings.Contains(out, `feature="SELinuxMount"`) {
			t.Errorf("logged:\n%s\nwant exactly one line for each of MutableCSINodeAllocatableCount and SELinuxMount, no range warning", out)
		}
	})
	t.Run("TooOld", func(t *testing.T) {
		out, _ := report(t, kubeversion.Version{Major: 1, Minor: 31, GitVersion: "v1.31.9"}, nil)
		if !strings.HasPrefix(out, "E") || !strings.Contains(out, "older than csi-volmgr supports") ||
			!strings.Contains(out, `serverVersion="1.31 (v1.31.9)"`) || !strings.Contains(out, `supported="v1.34 to v1.37"`) {
			t.Errorf("logged:\n%s\nwant an error line naming the server's version and the supported range", out)
		}
	})
	t.Run("TooNew", func(t *testing.T) {
		out, f := report(t, kubeversion.Version{Major: 1, Minor: 38, GitVersion: "v1.38.0"}, nil)
		if !strings.Contains(out, "newer than csi-volmgr supports") || strings.Count(out, "\n") != 1 || f != kubeversion.Newest() {
			t.Errorf("logged:\n%s\nfeatures %+v; want one warning and every feature", out, f)
		}
	})
	t.Run("Unknown", func(t *testing.T) {
		out, f := report(t, kubeversion.Version{}, errors.New("connection refused"))
		if f != (kubeversion.Features{}) || !strings.Contains(out, "Could not read the API server's version") ||
			!strings.Contains(out, "connection refused") {
			t.Errorf("logged:\n%s\nfeatures %+v; want the error and the oldest minor's features", out, f)
		}
	})
}

type fakeServer struct {
	fails int
	calls int
	info  *version.Info
}

func (s *fakeServer) ServerVersionWithContext(context.Context) (*version.Info, error) {
	s.calls++
	if s.calls <= s.fails {
		return nil, errors.New("connection refused")
	}
	return s.info, nil
}

// TestDetect: the API server may answer late; one that never answers
// ends in an error after the timeout.
func TestDetect(t *testing.T) {
	s := &fakeServer{fails: 1, info: &version.Info{Major: "1", Minor: "35", GitVersion: "v1.35.4"}}
	v, err := kubeversion.Detect(t.Context(), s, 10*time.Second)
	if err != nil || v != (kubeversion.Version{Major: 1, Minor: 35, GitVersion: "v1.35.4"}) || s.calls != 2 {
		t.Errorf("Detect = %+v, %v after %d calls; want 1.35 after 2", v, err, s.calls)
	}
	s = &fakeServer{fails: 1 << 30}
	began := time.Now()
	if _, err := kubeversion.Detect(t.Context(), s, 1500*time.Millisecond); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("Detect against a server that never answers: %v, want the last error", err)
	}
	if d := time.Since(began); d > 5*time.Second {
		t.Errorf("Detect took %v, want about its timeout", d)
	}
}
