package plugin_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/moby/sys/mountinfo"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

// clients are the CSI clients of one connection to a test plugin.
type clients struct {
	conn *grpc.ClientConn
	csi.IdentityClient
	csi.ControllerClient
	csi.NodeClient
}

func dial(t *testing.T, p *plugintest.Plugin) *clients {
	t.Helper()
	conn, err := p.Dial()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &clients{conn: conn, IdentityClient: csi.NewIdentityClient(conn), ControllerClient: csi.NewControllerClient(conn), NodeClient: csi.NewNodeClient(conn)}
}

func capability(at plugin.AccessType) *csi.VolumeCapability {
	c := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	if at == plugin.AccessBlock {
		c.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
	} else {
		c.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}
	}
	return c
}

func createVolume(t *testing.T, c *clients, name string, at plugin.AccessType, size int64) *csi.Volume {
	t.Helper()
	resp, err := c.CreateVolume(t.Context(), &csi.CreateVolumeRequest{
		Name:               name,
		VolumeCapabilities: []*csi.VolumeCapability{capability(at)},
		CapacityRange:      &csi.CapacityRange{RequiredBytes: size},
	})
	if err != nil {
		t.Fatalf("CreateVolume %s: %v", name, err)
	}
	return resp.GetVolume()
}

// volumePath returns where the plugin keeps the volume, from its state file.
func volumePath(t *testing.T, p *plugintest.Plugin, id string) string {
	t.Helper()
	vols, err := p.Volumes()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vols {
		if v.ID == id {
			return v.Path
		}
	}
	t.Fatalf("volume %s is not in the state file", id)
	return ""
}

// mountAt returns the mount table entry for the mount point path, nil if path is not a mount point.
func mountAt(t *testing.T, path string) *mountinfo.Info {
	t.Helper()
	mounts, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(path))
	if err != nil {
		t.Fatal(err)
	}
	if len(mounts) == 0 {
		return nil
	}
	return mounts[len(mounts)-1]
}

func wantCode(t *testing.T, err error, want codes.Code, what string) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Errorf("%s: got %v (%v), want %v", what, got, err, want)
	}
}

func exists(t *testing.T, path string) bool {
	t.Helper()
	_, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

// loopDeviceOf returns the loop device backed by file, "" if none.
func loopDeviceOf(t *testing.T, file string) string {
	t.Helper()
	devs, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		data, err := os.ReadFile(d)
		if err == nil && string(data) == file+"\n" {
			return "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(d)))
		}
	}
	return ""
}
