package plugin_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

func TestMountVolumeIsBindMountAndSurvivesRestart(t *testing.T) {
	work := t.TempDir()
	staging := filepath.Join(work, "globalmount")
	target := filepath.Join(work, "pod-a", "mount")
	roTarget := filepath.Join(work, "pod-b", "mount")
	for _, d := range []string{staging, filepath.Dir(target), filepath.Dir(roTarget)} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	caps := plugin.AllCapabilities()
	p := plugintest.Start(t, plugintest.Options{Capabilities: &caps})
	c := dial(t, p)
	ctx := t.Context()

	vol := createVolume(t, c, "data", plugin.AccessMount, 1<<20)
	id := vol.GetVolumeId()
	pub, err := c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: p.NodeID, VolumeCapability: capability(plugin.AccessMount)})
	if err != nil {
		t.Fatal(err)
	}
	stage := &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: capability(plugin.AccessMount), PublishContext: pub.GetPublishContext()}
	publish := &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: capability(plugin.AccessMount), PublishContext: pub.GetPublishContext()}
	roPublish := proto.Clone(publish).(*csi.NodePublishVolumeRequest)
	roPublish.TargetPath, roPublish.Readonly = roTarget, true
	if _, err := c.NodeStageVolume(ctx, stage); err != nil {
		t.Fatalf("NodeStageVolume: %v", err)
	}
	for _, req := range []*csi.NodePublishVolumeRequest{publish, roPublish} {
		if _, err := c.NodePublishVolume(ctx, req); err != nil {
			t.Fatalf("NodePublishVolume %s: %v", req.GetTargetPath(), err)
		}
	}

	// A file written through the target is in the volume's directory, and visible through the staging path.
	want := []byte("written through the target path")
	if err := os.WriteFile(filepath.Join(target, "hello"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	dir := volumePath(t, p, id)
	for _, through := range []string{dir, staging, roTarget} {
		got, err := os.ReadFile(filepath.Join(through, "hello"))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("reading through %s: %q, %v; want %q", through, got, err, want)
		}
	}
	for _, mp := range []string{staging, target, roTarget} {
		if mountAt(t, mp) == nil {
			t.Errorf("%s is not a mount point", mp)
		}
	}
	if err := os.WriteFile(filepath.Join(roTarget, "nope"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("writing through the read-only target: %v, want EROFS", err)
	}

	checkSurvived := func(when string) {
		t.Helper()
		list, err := c.ListVolumes(ctx, &csi.ListVolumesRequest{})
		if err != nil {
			t.Fatalf("%s: ListVolumes: %v", when, err)
		}
		if len(list.GetEntries()) != 1 || list.GetEntries()[0].GetVolume().GetVolumeId() != id || list.GetEntries()[0].GetVolume().GetCapacityBytes() != 1<<20 {
			t.Errorf("%s: ListVolumes = %v, want only %s with 1MiB", when, list.GetEntries(), id)
		}
		// Repeating the calls succeeds without stacking mounts.
		if _, err := c.NodeStageVolume(ctx, stage); err != nil {
			t.Errorf("%s: repeated NodeStageVolume: %v", when, err)
		}
		if _, err := c.NodePublishVolume(ctx, publish); err != nil {
			t.Errorf("%s: repeated NodePublishVolume: %v", when, err)
		}
		for _, mp := range []string{staging, target} {
			if n := countMounts(t, mp); n != 1 {
				t.Errorf("%s: %s is mounted %d times, want once", when, mp, n)
			}
		}
		// The records survived: a conflicting publish and an early unstage are refused.
		conflicting := proto.Clone(publish).(*csi.NodePublishVolumeRequest)
		conflicting.Readonly = true
		_, err = c.NodePublishVolume(ctx, conflicting)
		wantCode(t, err, codes.AlreadyExists, when+": publishing read-only where it is published read-write")
		_, err = c.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
		wantCode(t, err, codes.FailedPrecondition, when+": unstaging a published volume")
		got, err := os.ReadFile(filepath.Join(target, "hello"))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: reading through the target: %q, %v", when, got, err)
		}
	}
	if err := p.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	checkSurvived("after a graceful restart")
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := p.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	checkSurvived("after a crash")

	// Teardown in CO order removes every mount, the targets and finally the volume.
	_, err = c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
	wantCode(t, err, codes.FailedPrecondition, "deleting a published volume")
	for _, tp := range []string{target, roTarget} {
		if _, err := c.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: tp}); err != nil {
			t.Fatalf("NodeUnpublishVolume %s: %v", tp, err)
		}
		if exists(t, tp) {
			t.Errorf("target %s still exists after NodeUnpublishVolume", tp)
		}
	}
	_, err = c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: p.NodeID})
	wantCode(t, err, codes.FailedPrecondition, "detaching a staged volume")
	if _, err := c.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatalf("NodeUnstageVolume: %v", err)
	}
	if mountAt(t, staging) != nil || !exists(t, staging) {
		t.Errorf("staging path %s: want it left as an unmounted directory", staging)
	}
	if _, err := c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: p.NodeID}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
	if exists(t, dir) {
		t.Errorf("volume directory %s still exists after DeleteVolume", dir)
	}
}

func countMounts(t *testing.T, path string) int {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			n++
		}
	}
	return n
}

func TestNodeCallsNeedPublishContext(t *testing.T) {
	work := t.TempDir()
	staging, target := filepath.Join(work, "staging"), filepath.Join(work, "target")
	caps := plugin.Capabilities{StageUnstage: true, ControllerPublish: true}
	p := plugintest.Start(t, plugintest.Options{Capabilities: &caps})
	c := dial(t, p)
	ctx := t.Context()
	id := createVolume(t, c, "v", plugin.AccessMount, 0).GetVolumeId()

	stage := &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: capability(plugin.AccessMount)}
	_, err := c.NodeStageVolume(ctx, stage)
	wantCode(t, err, codes.FailedPrecondition, "staging before ControllerPublishVolume")

	pub, err := c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: p.NodeID, VolumeCapability: capability(plugin.AccessMount)})
	if err != nil {
		t.Fatal(err)
	}
	if pub.GetPublishContext()[plugin.PublishContextDevicePath] == "" {
		t.Fatalf("publish_context %v lacks %s", pub.GetPublishContext(), plugin.PublishContextDevicePath)
	}
	_, err = c.NodeStageVolume(ctx, stage)
	wantCode(t, err, codes.FailedPrecondition, "staging without publish_context")
	stage.PublishContext = map[string]string{plugin.PublishContextDevicePath: "/elsewhere"}
	_, err = c.NodeStageVolume(ctx, stage)
	wantCode(t, err, codes.FailedPrecondition, "staging with a wrong publish_context")
	stage.PublishContext = pub.GetPublishContext()
	if _, err := c.NodeStageVolume(ctx, stage); err != nil {
		t.Fatalf("staging with the publish_context: %v", err)
	}

	publish := &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: capability(plugin.AccessMount)}
	_, err = c.NodePublishVolume(ctx, publish)
	wantCode(t, err, codes.FailedPrecondition, "publishing without publish_context")
	publish.PublishContext = pub.GetPublishContext()
	if _, err := c.NodePublishVolume(ctx, publish); err != nil {
		t.Fatalf("publishing with the publish_context: %v", err)
	}

	// The journal shows what reached the node, so tests of a CO can check it passed publish_context on.
	entries, err := p.ReadJournal()
	if err != nil {
		t.Fatal(err)
	}
	var ok int
	for _, call := range plugin.Calls(entries) {
		if call.Begin.Method == "NodeStageVolume" || call.Begin.Method == "NodePublishVolume" {
			if call.Code() == codes.OK && call.Begin.PublishContext[plugin.PublishContextDevicePath] == pub.GetPublishContext()[plugin.PublishContextDevicePath] {
				ok++
			}
		}
	}
	if ok != 2 {
		t.Errorf("journal shows %d successful node calls with the publish_context, want 2", ok)
	}
}

func TestBlockVolumeIsLoopDevice(t *testing.T) {
	for name, staged := range map[string]bool{"with staging": true, "without staging": false} {
		t.Run(name, func(t *testing.T) {
			work := t.TempDir()
			staging, target := filepath.Join(work, "staging"), filepath.Join(work, "pod", "dev")
			if err := os.MkdirAll(staging, 0o750); err != nil {
				t.Fatal(err)
			}
			caps := plugin.Capabilities{StageUnstage: staged, Expand: true, VolumeStats: true}
			p := plugintest.Start(t, plugintest.Options{Capabilities: &caps})
			c := dial(t, p)
			ctx := t.Context()
			id := createVolume(t, c, "blk", plugin.AccessBlock, 8<<20).GetVolumeId()
			image := volumePath(t, p, id)

			publish := &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, VolumeCapability: capability(plugin.AccessBlock)}
			if staged {
				if _, err := c.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: capability(plugin.AccessBlock)}); err != nil {
					t.Fatalf("NodeStageVolume: %v", err)
				}
				publish.StagingTargetPath = staging
			}
			if _, err := c.NodePublishVolume(ctx, publish); err != nil {
				t.Fatalf("NodePublishVolume: %v", err)
			}
			loop := loopDeviceOf(t, image)
			if loop == "" {
				t.Fatalf("no loop device backs %s", image)
			}
			fi, err := os.Stat(target)
			if err != nil || fi.Mode()&os.ModeDevice == 0 {
				t.Fatalf("target %s: %v, mode %v; want a block device", target, err, fi.Mode())
			}

			// Bytes written to the published device land in the volume's image file.
			want := bytes.Repeat([]byte("csi-volmgr"), 400)
			dev, err := os.OpenFile(target, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := dev.WriteAt(want, 4096); err != nil {
				t.Fatal(err)
			}
			if err := errors.Join(dev.Sync(), dev.Close()); err != nil {
				t.Fatal(err)
			}
			img, err := os.ReadFile(image)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(img[4096:4096+len(want)], want) {
				t.Error("the bytes written to the device are not in the image file")
			}

			// Expansion grows the file and the device.
			resp, err := c.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: target, CapacityRange: &csi.CapacityRange{RequiredBytes: 16 << 20}})
			if err != nil || resp.GetCapacityBytes() != 16<<20 {
				t.Fatalf("NodeExpandVolume: %v, %v; want 16MiB", resp, err)
			}
			if got := deviceSize(t, loop); got != 16<<20 {
				t.Errorf("loop device size after expansion = %d, want %d", got, 16<<20)
			}
			stats, err := c.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: target})
			if err != nil || stats.GetUsage()[0].GetTotal() != 16<<20 {
				t.Errorf("NodeGetVolumeStats: %v, %v; want total 16MiB", stats, err)
			}

			if _, err := c.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
				t.Fatalf("NodeUnpublishVolume: %v", err)
			}
			if exists(t, target) {
				t.Error("target still exists after NodeUnpublishVolume")
			}
			if staged {
				if loopDeviceOf(t, image) == "" {
					t.Error("the loop device went with the publication, but the volume is still staged")
				}
				if _, err := c.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
					t.Fatalf("NodeUnstageVolume: %v", err)
				}
				if entries, _ := os.ReadDir(staging); len(entries) != 0 {
					t.Errorf("staging directory not empty after NodeUnstageVolume: %v", entries)
				}
			}
			if dev := loopDeviceOf(t, image); dev != "" {
				t.Errorf("loop device %s is still attached after the volume left the node", dev)
			}
		})
	}
}

// deviceSize reads a block device's size in bytes from sysfs.
func deviceSize(t *testing.T, dev string) int64 {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "size"))
	if err != nil {
		t.Fatal(err)
	}
	var sectors int64
	for _, ch := range strings.TrimSpace(string(data)) {
		sectors = sectors*10 + int64(ch-'0')
	}
	return sectors * 512
}

// TestVolumeDirMode: --volume-dir-mode=755 makes a new filesystem volume
// look like a freshly made filesystem, whose root only root may write.
func TestVolumeDirMode(t *testing.T) {
	p := plugintest.Start(t, plugintest.Options{VolumeDirMode: 0o755})
	c := dial(t, p)
	vol := createVolume(t, c, "fresh", plugin.AccessMount, 1<<20)
	fi, err := os.Stat(volumePath(t, p, vol.GetVolumeId()))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o755 {
		t.Errorf("volume directory mode = %v, want 0755", fi.Mode().Perm())
	}
}
