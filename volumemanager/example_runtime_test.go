package volumemanager_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/mount-utils"

	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// Example_runtime shows what a runtime that embeds the volume manager does
// with a pod: wait until its volumes are published, hand the mounted paths
// to its sandbox, and, once the pod's containers stopped, say so and wait
// until the volumes are unmounted. The node here runs without an API server
// (pods from a manifest directory) with the project's CSI test plugin; with
// an API server, set Config.KubeClient instead of Config.Manifests.
func Example_runtime() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base, _ := os.MkdirTemp("", "ex")
	defer os.RemoveAll(base)
	root, manifests := filepath.Join(base, "root"), filepath.Join(base, "manifests")
	_ = os.MkdirAll(filepath.Join(root, "plugins_registry"), 0o750)
	_ = os.MkdirAll(manifests, 0o750)

	// A CSI driver registers in <root>/plugins_registry, as with a kubelet.
	drv, err := plugintest.Launch(ctx, plugintest.Options{RegistrationDir: filepath.Join(root, "plugins_registry")})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer drv.Close()
	handle := exampleVolume(ctx, drv)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "app", UID: "0f6c9a52-5c1e-4c0e-9d0c-7b0f4d1c2e3a"}}
	_ = os.WriteFile(filepath.Join(manifests, "app.yaml"), []byte(fmt.Sprintf(exampleManifests, pod.UID, plugin.DefaultName, handle)), 0o600)

	vm, err := volumemanager.New(ctx, volumemanager.Config{
		NodeName: "node-1", RootDir: root, Manifests: manifests,
		// The runtime says when a pod's containers stopped.
		WaitForContainersStopped: true,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- vm.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			fmt.Println(err)
		}
	}()

	// CreatePod: wait for the volumes, then hand them to the sandbox.
	if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
		fmt.Println(err)
		return
	}
	data := vm.GetMountedVolumesForPod(pod.UID)["data"]
	fmt.Println("volume data:", data.AccessType, "read-only:", data.ReadOnly)
	// Every container of the pod gets the groups its volumes ask for.
	fmt.Println("extra supplemental groups:", vm.GetExtraSupplementalGroupsForPod(pod))
	// The container writes through its mount (bind-mounted at /data).
	_ = os.WriteFile(filepath.Join(data.HostPath, "hello"), []byte("hi"), 0o600)

	// DeletePod: stop the containers, say so, wait for the unmount.
	vm.ContainersStopped(pod.UID)
	if err := vm.WaitForUnmount(ctx, pod); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("mounted after teardown:", len(vm.GetMountedVolumesForPod(pod.UID)))
	mounted, _ := mount.New("").IsMountPoint(data.HostPath)
	fmt.Println("target still a mount point:", mounted)
	// The volume itself is unstaged (and detached) next; let that finish
	// before the agent stops.
	_ = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true,
		func(context.Context) (bool, error) { return len(vm.Volumes()) == 0, nil })
	vols, _ := drv.Volumes()
	written, _ := os.ReadFile(filepath.Join(vols[0].Path, "hello"))
	fmt.Printf("in the driver's volume: %q\n", written)
	// Output:
	// volume data: Filesystem read-only: false
	// extra supplemental groups: [2345]
	// mounted after teardown: 0
	// target still a mount point: false
	// in the driver's volume: "hi"
}

const exampleManifests = `apiVersion: v1
kind: Pod
metadata:
  name: app
  namespace: default
  uid: %s
spec:
  containers:
  - name: app
    image: none
    volumeMounts:
    - name: data
      mountPath: /data
  volumes:
  - name: data
    persistentVolumeClaim:
      claimName: data
---
apiVersion: v1
kind: PersistentVolume
metadata:
  name: pv-data
  annotations:
    pv.beta.kubernetes.io/gid: "2345"
spec:
  capacity:
    storage: 1Gi
  accessModes: [ReadWriteOnce]
  csi:
    driver: %s
    volumeHandle: %s
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: data
  namespace: default
spec:
  accessModes: [ReadWriteOnce]
  volumeName: pv-data
  resources:
    requests:
      storage: 1Gi
`

// exampleVolume creates a volume on the plugin and returns its handle.
func exampleVolume(ctx context.Context, p *plugintest.Plugin) string {
	conn, err := p.Dial()
	if err != nil {
		return ""
	}
	defer conn.Close()
	resp, err := csi.NewControllerClient(conn).CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: "data",
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}},
	})
	if err != nil {
		return ""
	}
	return resp.GetVolume().GetVolumeId()
}
