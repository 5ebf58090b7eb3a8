package paths_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/paths"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

func TestCallerPaths(t *testing.T) {
	l := layout(t, root)
	hash := paths.HandleHash("vol-1")
	cv, err := l.CallerVolume("d.csi.example.com", "vol-1")
	if err != nil {
		t.Fatal(err)
	}
	wantDir := root + "/front/d.csi.example.com/" + hash
	if cv.Dir != wantDir || cv.StageRecord != wantDir+"/vol_data.json" {
		t.Errorf("CallerVolume = %+v, want %s/vol_data.json", cv, wantDir)
	}
	cp, err := l.CallerPublishing("d.csi.example.com", "vol-1", "front-abc")
	if err != nil {
		t.Fatal(err)
	}
	if cp.Dir != wantDir+"/front-abc" || cp.Record != wantDir+"/front-abc/vol_data.json" {
		t.Errorf("CallerPublishing = %+v", cp)
	}
	if l.FrontDir() != root+"/front" {
		t.Errorf("FrontDir = %s", l.FrontDir())
	}
	for name, fn := range map[string]func() error{
		"driver ..":         func() error { _, err := l.CallerVolume("..", "vol-1"); return err },
		"driver with slash": func() error { _, err := l.CallerVolume("a/b", "vol-1"); return err },
		"empty handle":      func() error { _, err := l.CallerVolume("d", ""); return err },
		"pod with slash":    func() error { _, err := l.CallerPublishing("d", "vol-1", "a/b"); return err },
		"pod ..":            func() error { _, err := l.CallerPublishing("d", "vol-1", ".."); return err },
		"pod is the record": func() error { _, err := l.CallerPublishing("d", "vol-1", "vol_data.json"); return err },
		"empty pod":         func() error { _, err := l.CallerPublishing("d", "vol-1", ""); return err },
	} {
		if err := fn(); !errors.Is(err, volume.ErrInvalidName) {
			t.Errorf("%s: %v, want ErrInvalidName", name, err)
		}
	}
	// Any handle is hashed, so none escapes the driver's directory.
	if cv, err := l.CallerVolume("d", "../../x"); err != nil || filepath.Dir(cv.Dir) != root+"/front/d" {
		t.Errorf("CallerVolume of a handle with dot-dots = %+v, %v; want a directory below %s/front/d", cv, err, root)
	}
}

func TestCallerRecords(t *testing.T) {
	dir := t.TempDir()
	l := layout(t, dir)
	write := func(p string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("{}\n"), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	cv, _ := l.CallerVolume("d", "vol-1")
	write(cv.StageRecord)
	p1, _ := l.CallerPublishing("d", "vol-1", "front-1")
	write(p1.Record)
	p2, _ := l.CallerPublishing("d", "vol-2", "front-2") // published without a stage
	write(p2.Record)
	if err := os.MkdirAll(filepath.Join(l.FrontDir(), "d", paths.HandleHash("vol-3"), "front-3"), 0o750); err != nil {
		t.Fatal(err) // a directory without a record is not a record
	}
	if err := os.MkdirAll(filepath.Join(l.FrontDir(), "d", "not-a-hash"), 0o750); err != nil {
		t.Fatal(err)
	}

	got, err := l.CallerRecords()
	if !errors.Is(err, volume.ErrInvalidName) {
		t.Errorf("CallerRecords error = %v, want the bad directory reported", err)
	}
	var records []string
	for _, r := range got {
		records = append(records, r.Record)
		if r.Driver != "d" {
			t.Errorf("record %+v: driver %q", r, r.Driver)
		}
	}
	// By volume directory; a volume's staged record before its publish records.
	want := []string{cv.StageRecord, p1.Record, p2.Record}
	if paths.HandleHash("vol-2") < paths.HandleHash("vol-1") {
		want = []string{p2.Record, cv.StageRecord, p1.Record}
	}
	if !slices.Equal(records, want) {
		t.Errorf("CallerRecords = %v, want %v", records, want)
	}
	for _, r := range got {
		if r.Record == p1.Record && r.Pod != types.UID("front-1") {
			t.Errorf("publish record %+v: pod %q, want front-1", r, r.Pod)
		}
		if r.Record == cv.StageRecord && r.Pod != "" {
			t.Errorf("staged record %+v has a pod", r)
		}
	}

	empty := layout(t, t.TempDir())
	if got, err := empty.CallerRecords(); err != nil || len(got) != 0 {
		t.Errorf("CallerRecords without <root>/front = %v, %v; want nothing", got, err)
	}
}
