package plugin

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2/ktesting"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

func newTestJournal(t *testing.T) *journal {
	t.Helper()
	j, err := openJournal(filepath.Join(t.TempDir(), "journal.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = j.close() })
	return j
}

func TestJournalRecordsRequestFieldsAndResults(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	j := newTestJournal(t)
	registered := false
	calls := []struct {
		method string
		req    any
		err    error
	}{
		{csi.Node_NodeStageVolume_FullMethodName, &csi.NodeStageVolumeRequest{
			VolumeId: "vol-1", StagingTargetPath: "/s", PublishContext: map[string]string{"devicePath": "/d"},
			Secrets: map[string]string{"password": "never journaled"},
		}, nil},
		{csi.Node_NodePublishVolume_FullMethodName, &csi.NodePublishVolumeRequest{
			VolumeId: "vol-1", StagingTargetPath: "/s", TargetPath: "/t", Readonly: true,
		}, status.Error(codes.NotFound, "gone")},
		{csi.Controller_ControllerPublishVolume_FullMethodName, &csi.ControllerPublishVolumeRequest{VolumeId: "vol-2", NodeId: "n1"}, nil},
		{csi.Node_NodeGetVolumeStats_FullMethodName, &csi.NodeGetVolumeStatsRequest{VolumeId: "vol-3", VolumePath: "/v"}, nil},
		{registerapi.Registration_NotifyRegistrationStatus_FullMethodName, &registerapi.RegistrationStatus{PluginRegistered: false, Error: "bad version"}, nil},
	}
	for _, c := range calls {
		info := &grpc.UnaryServerInfo{FullMethod: c.method}
		_, _ = j.interceptor(ctx, c.req, info, func(context.Context, any) (any, error) { return nil, c.err })
	}

	entries, err := ReadJournal(j.f.Name())
	if err != nil {
		t.Fatal(err)
	}
	pid := os.Getpid()
	want := []Entry{
		{PID: pid, Seq: 1, Event: EventBegin, Method: "NodeStageVolume", VolumeID: "vol-1", StagingPath: "/s", PublishContext: map[string]string{"devicePath": "/d"}},
		{PID: pid, Seq: 1, Event: EventEnd, Method: "NodeStageVolume", VolumeID: "vol-1", Code: "OK"},
		{PID: pid, Seq: 2, Event: EventBegin, Method: "NodePublishVolume", VolumeID: "vol-1", StagingPath: "/s", TargetPath: "/t", ReadOnly: true},
		{PID: pid, Seq: 2, Event: EventEnd, Method: "NodePublishVolume", VolumeID: "vol-1", Code: "NotFound", Message: "gone"},
		{PID: pid, Seq: 3, Event: EventBegin, Method: "ControllerPublishVolume", VolumeID: "vol-2", NodeID: "n1"},
		{PID: pid, Seq: 3, Event: EventEnd, Method: "ControllerPublishVolume", VolumeID: "vol-2", Code: "OK"},
		{PID: pid, Seq: 4, Event: EventBegin, Method: "NodeGetVolumeStats", VolumeID: "vol-3", VolumePath: "/v"},
		{PID: pid, Seq: 4, Event: EventEnd, Method: "NodeGetVolumeStats", VolumeID: "vol-3", Code: "OK"},
		{PID: pid, Seq: 5, Event: EventBegin, Method: "NotifyRegistrationStatus", Registered: &registered, Message: "bad version"},
		{PID: pid, Seq: 5, Event: EventEnd, Method: "NotifyRegistrationStatus", Code: "OK"},
	}
	if diff := cmp.Diff(want, entries, cmpopts.IgnoreFields(Entry{}, "Time")); diff != "" {
		t.Errorf("journal entries differ (-want +got):\n%s", diff)
	}
	for i := 1; i < len(entries); i++ {
		if entries[i].Time.Before(entries[i-1].Time) {
			t.Errorf("entry %d is older than entry %d", i, i-1)
		}
	}

	got := Calls(entries)
	if len(got) != 5 {
		t.Fatalf("Calls returned %d calls, want 5", len(got))
	}
	if got[0].Code() != codes.OK || got[1].Code() != codes.NotFound || !got[1].Done {
		t.Errorf("call codes = %v, %v; want OK, NotFound", got[0].Code(), got[1].Code())
	}
	if got[0].Overlaps(got[1]) {
		t.Error("sequential calls reported as overlapping")
	}
}

func TestJournalConcurrentCallsOverlap(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	j := newTestJournal(t)
	const n = 32
	info := &grpc.UnaryServerInfo{FullMethod: csi.Node_NodePublishVolume_FullMethodName}

	// Every handler waits until all calls are inside, so all calls overlap.
	var inside sync.WaitGroup
	inside.Add(n)
	var done sync.WaitGroup
	for i := range n {
		done.Add(1)
		go func() {
			defer done.Done()
			req := &csi.NodePublishVolumeRequest{VolumeId: "vol", TargetPath: filepath.Join("/pods", string(rune('a'+i)))}
			_, _ = j.interceptor(ctx, req, info, func(context.Context, any) (any, error) {
				inside.Done()
				inside.Wait()
				return &csi.NodePublishVolumeResponse{}, nil
			})
		}()
	}
	done.Wait()

	entries, err := ReadJournal(j.f.Name())
	if err != nil {
		t.Fatalf("concurrent entries are not intact JSON lines: %v", err)
	}
	if len(entries) != 2*n {
		t.Fatalf("journal has %d entries, want %d", len(entries), 2*n)
	}
	calls := Calls(entries)
	targets := map[string]bool{}
	for _, c := range calls {
		if !c.Done || c.Code() != codes.OK {
			t.Errorf("call %d: done=%v code=%v, want a finished OK call", c.Seq, c.Done, c.Code())
		}
		targets[c.Begin.TargetPath] = true
	}
	if len(targets) != n {
		t.Errorf("calls name %d distinct targets, want %d", len(targets), n)
	}
	for i := range calls {
		for k := i + 1; k < len(calls); k++ {
			if !calls[i].Overlaps(calls[k]) {
				t.Fatalf("calls %d and %d do not overlap, but all ran at once", calls[i].Seq, calls[k].Seq)
			}
		}
	}
}

func TestReadJournalIgnoresPartialLastLine(t *testing.T) {
	p := filepath.Join(t.TempDir(), "journal.jsonl")
	content := `{"pid":1,"seq":1,"event":"begin","time":"2026-01-01T00:00:00Z","method":"NodeStageVolume"}` + "\n" +
		`{"pid":1,"seq":1,"event":"end","time":"2026-01-01T00:00:01Z","method":"NodeStageVolume","code":"OK"}` + "\n" +
		`{"pid":1,"seq":2,"event":"beg`
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	entries, err := ReadJournal(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 || entries[1].Code != "OK" {
		t.Fatalf("entries = %+v, want the two complete lines", entries)
	}

	if err := os.WriteFile(p, []byte("not json\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadJournal(p); err == nil {
		t.Error("ReadJournal accepted a corrupt line")
	}
}

func TestCallsWithoutEnd(t *testing.T) {
	at := func(s int) time.Time { return time.Unix(int64(s), 0) }
	entries := []Entry{
		{PID: 10, Seq: 1, Event: EventBegin, Time: at(1), Method: "NodeStageVolume"},
		{PID: 10, Seq: 1, Event: EventFault, Time: at(1), Method: "NodeStageVolume", Message: "exit-before"},
		{PID: 11, Event: EventStart, Time: at(5)},
		{PID: 11, Seq: 1, Event: EventBegin, Time: at(6), Method: "NodeStageVolume"},
		{PID: 11, Seq: 1, Event: EventEnd, Time: at(7), Method: "NodeStageVolume", Code: "OK"},
	}
	calls := Calls(entries)
	if len(calls) != 2 {
		t.Fatalf("Calls = %+v, want 2 calls (same seq, different processes)", calls)
	}
	killed, retried := calls[0], calls[1]
	if killed.Done || killed.Code() != codes.Unknown || len(killed.Faults) != 1 {
		t.Errorf("killed call = %+v, want unfinished with one fault", killed)
	}
	if !retried.Done || retried.Code() != codes.OK || retried.PID != 11 {
		t.Errorf("retried call = %+v, want finished OK in process 11", retried)
	}
	if !killed.Overlaps(retried) {
		t.Error("an unfinished call must overlap every later call")
	}
}
