package app

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/version"

	"github.com/csi-volmgr/csi-volmgr/volumemanager/buildinfo"
)

func TestVersionPrintsTheBuild(t *testing.T) {
	info := buildinfo.Get()
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		cmd := NewRootCommand(&out)
		cmd.SetArgs(append([]string{"version"}, args...))
		err := cmd.Execute()
		return out.String(), err
	}
	line, err := run()
	if err != nil {
		t.Fatalf("version: %v", err)
	}
	for _, want := range []string{"csi-volmgr " + info.GitVersion, info.GoVersion, info.Platform, info.BuildDate} {
		if !strings.Contains(line, want) {
			t.Errorf("version printed %q, which lacks %q", line, want)
		}
	}
	out, err := run("-o", "json")
	if err != nil {
		t.Fatalf("version -o json: %v", err)
	}
	var got version.Info
	if err := json.Unmarshal([]byte(out), &got); err != nil || got != info {
		t.Errorf("version -o json printed %s (%v), want %+v", out, err, info)
	}
	if _, err := run("-o", "yaml"); err == nil {
		t.Error("version -o yaml succeeded")
	}
}

func TestUnknownCommandFails(t *testing.T) {
	var out bytes.Buffer
	cmd := NewRootCommand(&out)
	cmd.SetArgs([]string{"no-such-command"})
	if err := cmd.Execute(); err == nil {
		t.Fatal("unknown command succeeded")
	}
}
