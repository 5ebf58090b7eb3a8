// Command createvolume creates a filesystem volume on a CSI driver through
// its Controller service and prints the volume ID, for the standalone demo
// (examples/standalone/run.sh): the PersistentVolume of the demo names the
// volume the CSI test plugin created. CreateVolume is idempotent by name, so
// running it twice prints the same ID.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func main() {
	endpoint := flag.String("endpoint", "", "The driver's CSI socket (path or unix:// URL).")
	name := flag.String("name", "demo", "The volume's name (CreateVolume is idempotent by name).")
	size := flag.Int64("size", 1<<30, "The volume's size in bytes.")
	flag.Parse()
	if *endpoint == "" {
		fmt.Fprintln(os.Stderr, "createvolume: --endpoint is required")
		os.Exit(2)
	}
	id, err := create(*endpoint, *name, *size)
	if err != nil {
		fmt.Fprintln(os.Stderr, "createvolume:", err)
		os.Exit(1)
	}
	fmt.Println(id)
}

func create(endpoint, name string, size int64) (string, error) {
	target := endpoint
	if !strings.HasPrefix(target, "unix:") {
		target = "unix://" + target
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "", fmt.Errorf("connecting to %s: %w", endpoint, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := csi.NewControllerClient(conn).CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:          name,
		CapacityRange: &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}},
	})
	if err != nil {
		return "", fmt.Errorf("CreateVolume %q: %w", name, err)
	}
	return resp.GetVolume().GetVolumeId(), nil
}
