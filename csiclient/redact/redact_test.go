package redact

import (
	"bytes"
	"strings"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr/funcr"
	"k8s.io/klog/v2"
)

func TestCSIStripsSecretsAndTokens(t *testing.T) {
	req := &csi.NodePublishVolumeRequest{
		VolumeId: "vol-1",
		Secrets:  map[string]string{"password": "s3cr3t-value"},
		VolumeContext: map[string]string{
			"csi.storage.k8s.io/serviceAccount.tokens": `{"vault":{"token":"eyJhbGciOiJSUzI1NiJ9.tok"}}`,
			"csi.storage.k8s.io/pod.name":              "app",
		},
	}
	got := CSI(req).String()
	for _, leak := range []string{"s3cr3t-value", "eyJhbGciOiJSUzI1NiJ9"} {
		if strings.Contains(got, leak) {
			t.Errorf("logged form %s holds %q", got, leak)
		}
	}
	for _, kept := range []string{"vol-1", "app", Redacted} {
		if !strings.Contains(got, kept) {
			t.Errorf("logged form %s lacks %q", got, kept)
		}
	}
	if req.GetVolumeContext()["csi.storage.k8s.io/serviceAccount.tokens"] == Redacted || req.GetSecrets()["password"] != "s3cr3t-value" {
		t.Error("CSI changed the request itself")
	}
	if got := CSI(&csi.NodeStageVolumeRequest{VolumeId: "v"}).String(); !strings.Contains(got, `"v"`) {
		t.Errorf("a message without credentials = %s", got)
	}
	if got := CSI(nil).String(); got != "null" {
		t.Errorf("CSI(nil) = %q", got)
	}
}

func TestQuietCapsVerbosity(t *testing.T) {
	var buf bytes.Buffer
	logger := funcr.New(func(prefix, args string) { buf.WriteString(prefix + args + "\n") }, funcr.Options{Verbosity: 10})
	ctx := Quiet(klog.NewContext(t.Context(), logger), APIBodies)
	l := klog.FromContext(ctx).WithName("client").WithValues("k", "v")
	l.V(APIBodies).Info("visible")
	l.V(APIBodies + 1).Info("body")
	if l.V(8).Enabled() {
		t.Error("V(8) enabled under a logger capped at 7")
	}
	if out := buf.String(); !strings.Contains(out, "visible") || strings.Contains(out, "body") {
		t.Errorf("log = %q, want only the message at V(%d)", out, APIBodies)
	}
}
