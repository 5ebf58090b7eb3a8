package front

import (
	"regexp"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestPodUID(t *testing.T) {
	a := PodUID("/var/lib/co/pods/a/target")
	if a != PodUID("/var/lib/co/pods/a/target") {
		t.Error("PodUID is not stable")
	}
	if a == PodUID("/var/lib/co/pods/b/target") {
		t.Error("different targets share a PodUID")
	}
	if !regexp.MustCompile(`^front-[0-9a-f]{40}$`).MatchString(string(a)) {
		t.Errorf("PodUID = %q, want front- and 40 hex digits", a)
	}
	if got, want := PodUID(""), "front-e3b0c44298fc1c149afbf4c8996fb92427ae41e4"; string(got) != want {
		t.Errorf("PodUID(\"\") = %q, want %q (sha256 of nothing)", got, want)
	}
}

func TestArgumentChecks(t *testing.T) {
	mount := &csi.VolumeCapability{
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
	}
	for name, tc := range map[string]struct {
		err  error
		want codes.Code
	}{
		"absolute clean path":      {err: checkPath("target_path", "/a/b"), want: codes.OK},
		"missing path":             {err: checkPath("target_path", ""), want: codes.InvalidArgument},
		"relative path":            {err: checkPath("target_path", "a/b"), want: codes.InvalidArgument},
		"dot-dot path":             {err: checkPath("target_path", "/a/../b"), want: codes.InvalidArgument},
		"trailing slash":           {err: checkPath("target_path", "/a/b/"), want: codes.InvalidArgument},
		"NUL byte":                 {err: checkPath("target_path", "/a\x00b"), want: codes.InvalidArgument},
		"optional empty":           {err: optionalPath("staging_target_path", ""), want: codes.OK},
		"optional relative":        {err: optionalPath("staging_target_path", "s"), want: codes.InvalidArgument},
		"lookup relative":          {err: lookupPath("volume_path", "some/path"), want: codes.OK},
		"lookup empty":             {err: lookupPath("volume_path", ""), want: codes.InvalidArgument},
		"lookup NUL":               {err: lookupPath("volume_path", "/\x00"), want: codes.InvalidArgument},
		"capability":               {err: checkCapability(mount), want: codes.OK},
		"no capability":            {err: checkCapability(nil), want: codes.InvalidArgument},
		"no access mode":           {err: checkCapability(&csi.VolumeCapability{AccessType: mount.AccessType}), want: codes.InvalidArgument},
		"no access type":           {err: checkCapability(&csi.VolumeCapability{AccessMode: mount.AccessMode}), want: codes.InvalidArgument},
		"required empty":           {err: required("volume_id", ""), want: codes.InvalidArgument},
		"first error is the first": {err: firstError(nil, required("a", ""), required("b", "")), want: codes.InvalidArgument},
	} {
		t.Run(name, func(t *testing.T) {
			if got := status.Code(tc.err); got != tc.want {
				t.Errorf("code = %v (%v), want %v", got, tc.err, tc.want)
			}
		})
	}
	if err := firstError(nil, required("a", ""), required("b", "")); status.Convert(err).Message() != "a is required" {
		t.Errorf("firstError = %v, want the first failing check", err)
	}
}
