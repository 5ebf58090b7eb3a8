package plugin_test

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

func TestRegistrationSocket(t *testing.T) {
	regDir := t.TempDir()
	p := plugintest.Start(t, plugintest.Options{Name: "reg.test.csi-volmgr.io", RegistrationDir: regDir})
	ctx := t.Context()
	if want := filepath.Join(regDir, "reg.test.csi-volmgr.io-reg.sock"); p.RegistrationSocket != want {
		t.Fatalf("RegistrationSocket = %s, want %s", p.RegistrationSocket, want)
	}
	fi, err := os.Stat(p.RegistrationSocket)
	if err != nil || fi.Mode().Type() != fs.ModeSocket {
		t.Fatalf("registration socket: %v, %v; want a socket", fi, err)
	}

	conn, err := grpc.NewClient("unix://"+p.RegistrationSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	reg := registerapi.NewRegistrationClient(conn)
	info, err := reg.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.GetType() != registerapi.CSIPlugin || info.GetName() != p.Name || info.GetEndpoint() != p.Endpoint || !slices.Equal(info.GetSupportedVersions(), []string{"1.0.0"}) {
		t.Errorf("GetInfo = %v, want CSIPlugin %s at %s supporting 1.0.0", info, p.Name, p.Endpoint)
	}
	for _, st := range []*registerapi.RegistrationStatus{{PluginRegistered: false, Error: "version mismatch"}, {PluginRegistered: true}} {
		if _, err := reg.NotifyRegistrationStatus(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	entries, err := p.ReadJournal()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		if e.Event == plugin.EventBegin && e.Method == "NotifyRegistrationStatus" && e.Registered != nil {
			got = append(got, map[bool]string{true: "registered", false: "failed: " + e.Message}[*e.Registered])
		}
	}
	if want := []string{"failed: version mismatch", "registered"}; !slices.Equal(got, want) {
		t.Errorf("journaled notifications = %q, want %q", got, want)
	}

	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, sock := range []string{p.RegistrationSocket, p.Endpoint} {
		if exists(t, sock) {
			t.Errorf("%s still exists after a graceful stop", sock)
		}
	}
}

func TestFaultsInARunningPlugin(t *testing.T) {
	work := t.TempDir()
	staging := filepath.Join(work, "staging")
	if err := os.MkdirAll(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	p := plugintest.Start(t, plugintest.Options{})
	c := dial(t, p)
	ctx := t.Context()
	id := createVolume(t, c, "v", plugin.AccessMount, 0).GetVolumeId()
	stage := &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: capability(plugin.AccessMount)}
	unstage := &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}

	// An error code, once; rules for other volumes do not apply.
	if err := p.SetFaults(
		plugin.FaultRule{Method: "NodeStageVolume", VolumeID: "vol-other", Code: codes.Internal},
		plugin.FaultRule{Method: "NodeStageVolume", Code: codes.Unavailable, Message: "try again", Times: 1},
	); err != nil {
		t.Fatal(err)
	}
	_, err := c.NodeStageVolume(ctx, stage)
	wantCode(t, err, codes.Unavailable, "first stage with a times=1 Unavailable rule")
	if mountAt(t, staging) != nil {
		t.Error("the failed stage mounted the volume")
	}
	if _, err := c.NodeStageVolume(ctx, stage); err != nil {
		t.Fatalf("second stage: %v", err)
	}
	if _, err := c.NodeUnstageVolume(ctx, unstage); err != nil {
		t.Fatal(err)
	}

	// Exit before the step: the process dies, nothing is mounted, and after a restart the rule is used up.
	if err := p.SetFaults(plugin.FaultRule{Method: "NodeStageVolume", Exit: plugin.ExitBefore, Times: 1}); err != nil {
		t.Fatal(err)
	}
	_, err = c.NodeStageVolume(ctx, stage)
	wantCode(t, err, codes.Unavailable, "stage that kills the plugin")
	<-p.Exited()
	if mountAt(t, staging) != nil {
		t.Error("the step ran although the plugin was killed before it")
	}
	last := lastCall(t, p, "NodeStageVolume")
	if last.Done || len(last.Faults) != 1 || last.Faults[0].Message != "exit-before" {
		t.Errorf("journal: %+v, want an unfinished NodeStageVolume with an exit-before fault", last)
	}
	if err := p.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.NodeStageVolume(ctx, stage); err != nil {
		t.Fatalf("stage after the restart: %v", err)
	}
	if _, err := c.NodeUnstageVolume(ctx, unstage); err != nil {
		t.Fatal(err)
	}

	// Exit after the step: the mount is made, the caller never hears of it, and the retry after the
	// restart succeeds without mounting twice.
	if err := p.SetFaults(plugin.FaultRule{Method: "NodeStageVolume", Exit: plugin.ExitAfter, Times: 1}); err != nil {
		t.Fatal(err)
	}
	_, err = c.NodeStageVolume(ctx, stage)
	wantCode(t, err, codes.Unavailable, "stage that kills the plugin after the step")
	<-p.Exited()
	if mountAt(t, staging) == nil {
		t.Error("the step did not run before the plugin was killed after it")
	}
	if f := lastCall(t, p, "NodeStageVolume").Faults; len(f) != 1 || f[0].Message != "exit-after" || f[0].Code != "OK" {
		t.Errorf("journaled faults = %+v, want exit-after of a step that returned OK", f)
	}
	if err := p.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.NodeStageVolume(ctx, stage); err != nil {
		t.Fatalf("retried stage: %v", err)
	}
	if n := countMounts(t, staging); n != 1 {
		t.Errorf("staging path mounted %d times, want once", n)
	}

	// Hang until the caller gives up.
	if err := p.SetFaults(plugin.FaultRule{Method: "NodeUnstageVolume", Hang: true}); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = c.NodeUnstageVolume(short, unstage)
	cancel()
	wantCode(t, err, codes.DeadlineExceeded, "hanging unstage")
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := p.WaitForJournal(waitCtx, func(entries []plugin.Entry) bool {
		calls := plugin.Calls(entries)
		last := calls[len(calls)-1]
		return last.Begin.Method == "NodeUnstageVolume" && last.Done
	}); err != nil {
		t.Fatalf("the hanging call never ended in the plugin: %v", err)
	}
	if code := lastCall(t, p, "NodeUnstageVolume").Code(); code != codes.DeadlineExceeded && code != codes.Canceled {
		t.Errorf("journaled result of the hanging call = %v, want DeadlineExceeded or Canceled", code)
	}
	if mountAt(t, staging) == nil {
		t.Error("the hanging unstage unmounted the volume")
	}
	if err := p.ClearFaults(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.NodeUnstageVolume(ctx, unstage); err != nil {
		t.Fatalf("unstage after clearing faults: %v", err)
	}
}

func lastCall(t *testing.T, p *plugintest.Plugin, method string) plugin.Call {
	t.Helper()
	entries, err := p.ReadJournal()
	if err != nil {
		t.Fatal(err)
	}
	calls := plugin.Calls(entries)
	for i := len(calls) - 1; i >= 0; i-- {
		if calls[i].Begin.Method == method {
			return calls[i]
		}
	}
	t.Fatalf("no %s call in the journal", method)
	return plugin.Call{}
}

func TestJournalShowsConcurrentCalls(t *testing.T) {
	work := t.TempDir()
	p := plugintest.Start(t, plugintest.Options{Capabilities: &plugin.Capabilities{}})
	c := dial(t, p)
	ctx := t.Context()
	ids := []string{createVolume(t, c, "a", plugin.AccessMount, 0).GetVolumeId(), createVolume(t, c, "b", plugin.AccessMount, 0).GetVolumeId()}

	// Each publish is held for a while, so publishes of different volumes overlap only if the
	// plugin serves them in parallel.
	if err := p.SetFaults(plugin.FaultRule{Method: "NodePublishVolume", Delay: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			target := filepath.Join(work, "target", string(rune('a'+i)))
			if _, err := c.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, VolumeCapability: capability(plugin.AccessMount)}); err != nil {
				t.Errorf("NodePublishVolume %s: %v", id, err)
			}
		}()
	}
	wg.Wait()

	entries, err := p.ReadJournal()
	if err != nil {
		t.Fatal(err)
	}
	var publishes []plugin.Call
	for _, call := range plugin.Calls(entries) {
		if call.Begin.Method == "NodePublishVolume" {
			publishes = append(publishes, call)
		}
	}
	if len(publishes) != 2 || !publishes[0].Overlaps(publishes[1]) {
		t.Fatalf("publishes = %+v, want two overlapping calls", publishes)
	}
	for _, call := range publishes {
		if call.Code() != codes.OK || len(call.Faults) != 1 || call.End.Time.Sub(call.Begin.Time) < 300*time.Millisecond {
			t.Errorf("call %d: code %v, faults %v, duration %v; want OK after a 300ms delay", call.Seq, call.Code(), call.Faults, call.End.Time.Sub(call.Begin.Time))
		}
	}
}

func TestCloseUnmountsAfterACrash(t *testing.T) {
	work := t.TempDir()
	staging := filepath.Join(work, "staging")
	targets := map[plugin.AccessType]string{plugin.AccessMount: filepath.Join(work, "mnt"), plugin.AccessBlock: filepath.Join(work, "blk")}
	if err := os.MkdirAll(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	p, err := plugintest.Launch(t.Context(), plugintest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := dial(t, p)
	ctx := t.Context()

	var images []string
	for at, target := range targets {
		id := createVolume(t, c, string(at), at, 4<<20).GetVolumeId()
		images = append(images, volumePath(t, p, id))
		st := filepath.Join(staging, string(at))
		if _, err := c.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: st, VolumeCapability: capability(at)}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: st, TargetPath: target, VolumeCapability: capability(at)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	for _, target := range targets {
		if mountAt(t, target) == nil {
			t.Fatalf("%s is not mounted after the crash; the test proves nothing", target)
		}
	}

	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, mp := range []string{targets[plugin.AccessMount], targets[plugin.AccessBlock], filepath.Join(staging, "mount"), filepath.Join(staging, "block", "device")} {
		if mountAt(t, mp) != nil {
			t.Errorf("%s is still mounted after Close", mp)
		}
	}
	for _, img := range images {
		if dev := loopDeviceOf(t, img); dev != "" {
			t.Errorf("loop device %s over %s is still attached after Close", dev, img)
		}
	}
	if exists(t, p.Dir) {
		t.Errorf("plugin directory %s still exists after Close", p.Dir)
	}
}
