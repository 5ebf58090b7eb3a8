package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2/ktesting"
)

func TestFaultRuleJSON(t *testing.T) {
	rule := FaultRule{Method: "NodeStageVolume", VolumeID: "vol-1", Code: codes.Unavailable, Message: "m", Delay: 1500 * time.Millisecond, Times: 2}
	data, err := json.Marshal(rule)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"method":"NodeStageVolume","volumeID":"vol-1","code":"Unavailable","message":"m","delay":"1.5s","times":2}`
	if string(data) != want {
		t.Errorf("marshal = %s, want %s", data, want)
	}
	var back FaultRule
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if back != rule {
		t.Errorf("round trip = %+v, want %+v", back, rule)
	}

	for name, tc := range map[string]struct {
		in      string
		want    codes.Code
		wantErr bool
	}{
		"camel case name": {in: `{"method":"X","code":"NotFound"}`, want: codes.NotFound},
		"upper snake":     {in: `{"method":"X","code":"DEADLINE_EXCEEDED"}`, want: codes.DeadlineExceeded},
		"unknown code":    {in: `{"method":"X","code":"Nope"}`, wantErr: true},
		"bad delay":       {in: `{"method":"X","delay":"soon"}`, wantErr: true},
	} {
		t.Run(name, func(t *testing.T) {
			var r FaultRule
			err := json.Unmarshal([]byte(tc.in), &r)
			if tc.wantErr {
				if !errors.Is(err, ErrInvalidFault) {
					t.Fatalf("error = %v, want ErrInvalidFault", err)
				}
				return
			}
			if err != nil || r.Code != tc.want {
				t.Fatalf("got code %v, err %v; want %v", r.Code, err, tc.want)
			}
		})
	}
}

func TestFaultConfigValidate(t *testing.T) {
	for name, tc := range map[string]struct {
		rule  FaultRule
		valid bool
	}{
		"code only":            {rule: FaultRule{Method: "NodeStageVolume", Code: codes.Internal}, valid: true},
		"delay then code":      {rule: FaultRule{Method: "*", Delay: time.Second, Code: codes.Aborted}, valid: true},
		"exit after":           {rule: FaultRule{Method: "NodePublishVolume", Exit: ExitAfter, Times: 1}, valid: true},
		"exit before and code": {rule: FaultRule{Method: "NodePublishVolume", Exit: ExitBefore, Code: codes.Internal}, valid: true},
		"hang":                 {rule: FaultRule{Method: "NodePublishVolume", Hang: true, Delay: time.Second}, valid: true},
		"no method":            {rule: FaultRule{Code: codes.Internal}},
		"hang and exit":        {rule: FaultRule{Method: "X", Hang: true, Exit: ExitBefore}},
		"hang and code":        {rule: FaultRule{Method: "X", Hang: true, Code: codes.Internal}},
		"code and exit after":  {rule: FaultRule{Method: "X", Code: codes.Internal, Exit: ExitAfter}},
		"unknown exit":         {rule: FaultRule{Method: "X", Exit: "sometime"}},
		"negative times":       {rule: FaultRule{Method: "X", Times: -1}},
		"not a code":           {rule: FaultRule{Method: "X", Code: 99}},
	} {
		t.Run(name, func(t *testing.T) {
			err := FaultConfig{Rules: []FaultRule{{Method: "Probe"}, tc.rule}}.Validate()
			if tc.valid && err != nil {
				t.Errorf("Validate() = %v, want nil", err)
			}
			if !tc.valid && !errors.Is(err, ErrInvalidFault) {
				t.Errorf("Validate() = %v, want ErrInvalidFault", err)
			}
			if !tc.valid && WriteFaultConfig(filepath.Join(t.TempDir(), "f.json"), FaultConfig{Rules: []FaultRule{tc.rule}}) == nil {
				t.Error("WriteFaultConfig accepted an invalid rule")
			}
		})
	}
}

// newTestInjector returns an injector over a fresh control file and state directory.
func newTestInjector(t *testing.T) (*faultInjector, string) {
	dir := t.TempDir()
	j, err := openJournal(filepath.Join(dir, "journal.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = j.close() })
	control := filepath.Join(dir, "faults.json")
	return newFaultInjector(control, dir, j), control
}

func writeRules(t *testing.T, path, generation string, rules ...FaultRule) {
	t.Helper()
	if err := WriteFaultConfig(path, FaultConfig{Generation: generation, Rules: rules}); err != nil {
		t.Fatal(err)
	}
}

func TestFaultMatch(t *testing.T) {
	type call struct {
		method, volume string
		want           string // Message of the rule expected to fire, "" for none.
	}
	rules := []FaultRule{
		{Method: "NodeStageVolume", VolumeID: "vol-a", Code: codes.Internal, Message: "stage a"},
		{Method: "NodeStageVolume", Code: codes.Internal, Message: "stage any", Times: 2},
		{Method: "*", VolumeID: "vol-z", Code: codes.Internal, Message: "anything z"},
	}
	for name, calls := range map[string][]call{
		"volume filter wins by order": {
			{method: "NodeStageVolume", volume: "vol-a", want: "stage a"},
			{method: "NodeStageVolume", volume: "vol-a", want: "stage a"},
		},
		"times run out, then nothing matches": {
			{method: "NodeStageVolume", volume: "vol-b", want: "stage any"},
			{method: "NodeStageVolume", volume: "vol-c", want: "stage any"},
			{method: "NodeStageVolume", volume: "vol-b", want: ""},
		},
		"times run out, then a later rule matches": {
			{method: "NodeStageVolume", volume: "vol-z", want: "stage any"},
			{method: "NodeStageVolume", volume: "vol-z", want: "stage any"},
			{method: "NodeStageVolume", volume: "vol-z", want: "anything z"},
		},
		"wildcard method": {
			{method: "Probe", volume: "", want: ""},
			{method: "NodeUnpublishVolume", volume: "vol-z", want: "anything z"},
		},
		"other method": {
			{method: "NodePublishVolume", volume: "vol-a", want: ""},
		},
	} {
		t.Run(name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			f, control := newTestInjector(t)
			writeRules(t, control, "g1", rules...)
			for i, c := range calls {
				r, ok := f.match(ctx, c.method, c.volume)
				if got := map[bool]string{true: r.Message}[ok]; got != c.want {
					t.Errorf("call %d (%s %s) fired %q, want %q", i, c.method, c.volume, got, c.want)
				}
			}
		})
	}
}

func TestFaultReloadAndTimesAcrossRestart(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	f, control := newTestInjector(t)

	if _, ok := f.match(ctx, "NodeStageVolume", "v"); ok {
		t.Fatal("a rule fired without a control file")
	}
	writeRules(t, control, "g1", FaultRule{Method: "NodeStageVolume", Exit: ExitBefore, Times: 1})
	if _, ok := f.match(ctx, "NodeStageVolume", "v"); !ok {
		t.Fatal("the rule did not fire after the control file appeared")
	}
	if _, ok := f.match(ctx, "NodeStageVolume", "v"); ok {
		t.Fatal("a times=1 rule fired twice")
	}

	// A new process over the same state directory must not fire the rule again.
	restarted := newFaultInjector(control, filepath.Dir(control), f.journal)
	if _, ok := restarted.match(ctx, "NodeStageVolume", "v"); ok {
		t.Fatal("a times=1 rule fired again after a restart")
	}

	// Writing the same rules under a new generation resets the count.
	writeRules(t, control, "g2", FaultRule{Method: "NodeStageVolume", Exit: ExitBefore, Times: 1})
	if _, ok := restarted.match(ctx, "NodeStageVolume", "v"); !ok {
		t.Fatal("the rule did not fire after a new generation was written")
	}

	// An invalid file means no rules; removing the file too.
	if err := os.WriteFile(control, []byte(`{"rules":[{"method":"NodeStageVolume","hang":true,"exit":"before"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, ok := restarted.match(ctx, "NodeStageVolume", "v"); ok {
		t.Fatal("a rule fired from an invalid control file")
	}
	writeRules(t, control, "g3", FaultRule{Method: "NodeStageVolume", Code: codes.Internal})
	if err := os.Remove(control); err != nil {
		t.Fatal(err)
	}
	if _, ok := restarted.match(ctx, "NodeStageVolume", "v"); ok {
		t.Fatal("a rule fired after the control file was removed")
	}
}

// callThrough runs the injector (inside the journal, as the server chains them) on a NodeStageVolume
// call and reports whether the step ran.
func callThrough(ctx context.Context, f *faultInjector, handlerErr error) (ran bool, err error) {
	err = callThroughRan(ctx, f, handlerErr, &ran)
	return ran, err
}

// callThroughRan is callThrough that sets *ran when the step runs, for callers that look before it returns.
func callThroughRan(ctx context.Context, f *faultInjector, handlerErr error, ran *bool) error {
	info := &grpc.UnaryServerInfo{FullMethod: csi.Node_NodeStageVolume_FullMethodName}
	req := &csi.NodeStageVolumeRequest{VolumeId: "vol-1"}
	_, err := f.journal.interceptor(ctx, req, info, func(ctx context.Context, req any) (any, error) {
		return f.interceptor(ctx, req, info, func(context.Context, any) (any, error) {
			*ran = true
			return &csi.NodeStageVolumeResponse{}, handlerErr
		})
	})
	return err
}

func TestFaultInterceptorActions(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	f, control := newTestInjector(t)

	writeRules(t, control, "code", FaultRule{Method: "NodeStageVolume", Code: codes.ResourceExhausted, Message: "full"})
	ran, err := callThrough(ctx, f, nil)
	if st := status.Convert(err); ran || st.Code() != codes.ResourceExhausted || st.Message() != "full" {
		t.Errorf("code rule: ran=%v err=%v, want ResourceExhausted \"full\" without running the step", ran, err)
	}

	writeRules(t, control, "other volume", FaultRule{Method: "NodeStageVolume", VolumeID: "vol-2", Code: codes.Internal})
	if ran, err := callThrough(ctx, f, nil); !ran || err != nil {
		t.Errorf("rule for another volume: ran=%v err=%v, want the step to run", ran, err)
	}

	const delay = 50 * time.Millisecond
	writeRules(t, control, "delay", FaultRule{Method: "NodeStageVolume", Delay: delay})
	start := time.Now()
	if ran, err := callThrough(ctx, f, nil); !ran || err != nil || time.Since(start) < delay {
		t.Errorf("delay rule: ran=%v err=%v after %v, want the step to run after %v", ran, err, time.Since(start), delay)
	}

	writeRules(t, control, "long delay", FaultRule{Method: "NodeStageVolume", Delay: time.Hour})
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if ran, err := callThrough(cancelled, f, nil); ran || status.Code(err) != codes.Canceled {
		t.Errorf("cancelled delay: ran=%v err=%v, want Canceled without running the step", ran, err)
	}

	entries, err := ReadJournal(f.journal.f.Name())
	if err != nil {
		t.Fatal(err)
	}
	var faults []string
	for _, c := range Calls(entries) {
		for _, e := range c.Faults {
			faults = append(faults, e.Message)
		}
	}
	if got, want := strings.Join(faults, ","), "error,delay 50ms,delay 1h0m0s"; got != want {
		t.Errorf("journaled faults = %q, want %q", got, want)
	}
}

func TestFaultInterceptorHang(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	f, control := newTestInjector(t)
	writeRules(t, control, "hang", FaultRule{Method: "NodeStageVolume", Hang: true})

	callCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		ran bool
		err error
	}
	done := make(chan result, 1)
	go func() {
		ran, err := callThrough(callCtx, f, nil)
		done <- result{ran, err}
	}()
	// Wait until the call is hanging, as the journal says, then check it has not returned.
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !hasFault(t, f, "hang") {
		if time.Now().After(deadline) {
			t.Fatal("the hang fault was never journaled")
		}
		<-tick.C
	}
	select {
	case r := <-done:
		t.Fatalf("hanging call returned before cancellation: %+v", r)
	default:
	}
	cancel()
	if r := <-done; r.ran || status.Code(r.err) != codes.Canceled {
		t.Errorf("hang: ran=%v err=%v, want Canceled without running the step", r.ran, r.err)
	}
}

func hasFault(t *testing.T, f *faultInjector, action string) bool {
	t.Helper()
	entries, err := ReadJournal(f.journal.f.Name())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Event == EventFault && e.Message == action {
			return true
		}
	}
	return false
}

func TestFaultInterceptorExit(t *testing.T) {
	for name, tc := range map[string]struct {
		exit       FaultExit
		handlerErr error
		wantRan    bool
		wantCode   string
	}{
		"before": {exit: ExitBefore, wantRan: false},
		"after":  {exit: ExitAfter, handlerErr: status.Error(codes.NotFound, "x"), wantRan: true, wantCode: "NotFound"},
	} {
		t.Run(name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			f, control := newTestInjector(t)
			writeRules(t, control, name, FaultRule{Method: "NodeStageVolume", Exit: tc.exit})
			exited := make(chan bool, 1)
			var ran bool
			// The real exit never returns; this one ends the calling goroutine the same way.
			// It runs on that goroutine, after the step if any, so reading ran is safe.
			f.exit = func() {
				exited <- ran
				runtime.Goexit()
			}
			go func() {
				_ = callThroughRan(ctx, f, tc.handlerErr, &ran)
				t.Error("the call returned after the exit fault")
			}()
			if ranBeforeExit := <-exited; ranBeforeExit != tc.wantRan {
				t.Errorf("step ran before exit = %v, want %v", ranBeforeExit, tc.wantRan)
			}
			entries, err := ReadJournal(f.journal.f.Name())
			if err != nil {
				t.Fatal(err)
			}
			calls := Calls(entries)
			if len(calls) != 1 || calls[0].Done || len(calls[0].Faults) != 1 {
				t.Fatalf("calls = %+v, want one unfinished call with one fault", calls)
			}
			if fe := calls[0].Faults[0]; fe.Message != "exit-"+name || fe.Code != tc.wantCode {
				t.Errorf("fault entry = %+v, want action exit-%s with code %q", fe, name, tc.wantCode)
			}
		})
	}
}
