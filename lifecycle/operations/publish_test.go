package operations

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// stagedHarness returns a harness whose test driver needs no attach and
// where pvSource() is staged.
func stagedHarness(t *testing.T, opts harnessOptions) (*harness, volume.Source) {
	t.Helper()
	h := newHarness(t, opts)
	h.noAttach()
	src := pvSource()
	if err := h.ops.Stage(testContext(t), volume.PersistentName(src.Driver, src.Handle), src, nil); err != nil {
		t.Fatalf("Stage: %v", err)
	}
	return h, src
}

func TestPublishSendsTheKubeletRequest(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.setCaps(csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME, csi.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP,
		csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER)
	pol := volume.DefaultPolicy()
	pol.PodInfoOnMount = true
	h.policies.set(testDriver, pol)
	src := pvSource()
	name := volume.PersistentName(src.Driver, src.Handle)
	h.vas.set(attached(src, map[string]string{"devicePath": "/dev/sdx"}))
	ctx := testContext(t)
	if err := h.ops.WaitForAttach(ctx, name, src); err != nil {
		t.Fatal(err)
	}
	if err := h.ops.Stage(ctx, name, src, nil); err != nil {
		t.Fatal(err)
	}
	key := keyOf(src, "uid-a")
	pv := podVolume("uid-a", "pod-a")
	if err := h.ops.Publish(ctx, key, src, pv); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	st, _ := h.ops.Layout().Staging(src.ID)
	podDir := filepath.Join(h.root, "pods/uid-a/volumes/kubernetes.io~csi/pv-1")
	want := &csi.NodePublishVolumeRequest{
		VolumeId:          "vol-1",
		PublishContext:    map[string]string{"devicePath": "/dev/sdx"},
		StagingTargetPath: st.Path,
		TargetPath:        podDir + "/mount",
		VolumeCapability: &csi.VolumeCapability{
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER},
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{
				FsType: "ext4", MountFlags: []string{"noatime", "nodiratime"}, VolumeMountGroup: "2000",
			}},
		},
		Readonly: true,
		Secrets:  map[string]string{"publish-key": "publish-s3cr3t"},
		VolumeContext: map[string]string{
			"attr":                                   "value",
			"csi.storage.k8s.io/pod.name":            "pod-a",
			"csi.storage.k8s.io/pod.namespace":       "ns",
			"csi.storage.k8s.io/pod.uid":             "uid-a",
			"csi.storage.k8s.io/serviceAccount.name": "sa-pod-a",
			"csi.storage.k8s.io/ephemeral":           "false",
		},
	}
	reqs := requests[*csi.NodePublishVolumeRequest](h, "NodePublishVolume")
	if len(reqs) != 1 {
		t.Fatalf("NodePublishVolume called %d times", len(reqs))
	}
	if diff := cmp.Diff(want, reqs[0], protocmp.Transform()); diff != "" {
		t.Errorf("NodePublishVolume request (-want +got):\n%s", diff)
	}
	if src.Attributes[PodNameKey] != "" {
		t.Error("Publish changed the Source's attributes")
	}
	if !published(h.world, key) {
		t.Error("the pod's volume is not ready after Publish")
	}

	rec, err := checkpoint.ReadPublish(podDir + "/vol_data.json")
	if err != nil {
		t.Fatal(err)
	}
	wantRec := checkpoint.PublishRecord{
		SpecVolID: "pv-1", VolumeHandle: "vol-1", DriverName: testDriver, NodeName: testNode,
		AttachmentID: volume.AttachmentName("vol-1", testDriver, testNode), VolumeLifecycleMode: storagev1.VolumeLifecyclePersistent,
		VolumeName: name, PodUID: "uid-a", AccessType: volume.Filesystem, TargetPath: want.TargetPath,
	}
	if rec != wantRec {
		t.Errorf("publish record = %+v, want %+v", rec, wantRec)
	}
	if fi, err := os.Stat(podDir); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("pod volume directory: %v, %v; want 0750", fi, err)
	}
	if exists(t, want.TargetPath) {
		t.Error("the agent created the target itself; the driver creates it")
	}
}

func TestPublishWithoutPodInfoKeepsAttributesOnly(t *testing.T) {
	h, src := stagedHarness(t, harnessOptions{})
	if err := h.ops.Publish(testContext(t), keyOf(src, "uid-a"), src, podVolume("uid-a", "pod-a")); err != nil {
		t.Fatal(err)
	}
	got := requests[*csi.NodePublishVolumeRequest](h, "NodePublishVolume")[0].GetVolumeContext()
	if !cmp.Equal(got, map[string]string{"attr": "value"}) {
		t.Errorf("volume_context = %v, want the attributes only", got)
	}
}

func TestPublishInlineVolume(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	src := volume.Source{
		ID: volume.ID{Driver: testDriver, Handle: volume.InlineHandle("uid-a", "scratch"), AccessType: volume.Filesystem}, Inline: true,
		FSType: "xfs", Attributes: map[string]string{"size": "1Gi"},
		PublishSecret: &volume.SecretRef{Namespace: "ns", Name: "publish-secret"},
	}
	key := volume.PodKey{Volume: volume.InlineName("uid-a", "scratch"), Pod: "uid-a"}
	pv := podVolume("uid-a", "pod-a")
	pv.SpecName = "scratch"
	ctx := testContext(t)

	// The default policy allows Persistent volumes only.
	if err := h.ops.Publish(ctx, key, src, pv); !errors.Is(err, volume.ErrInvalidSpec) {
		t.Fatalf("Publish of an inline volume without Ephemeral mode = %v, want ErrInvalidSpec", err)
	}
	pol := volume.DefaultPolicy() // attach required: inline volumes need none anyway
	pol.PodInfoOnMount = true
	pol.VolumeLifecycleModes = []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecycleEphemeral}
	h.policies.set(testDriver, pol)
	if err := h.ops.WaitForAttach(ctx, key.Volume, src); err != nil {
		t.Fatal(err)
	}
	if err := h.ops.Stage(ctx, key.Volume, src, nil); err != nil {
		t.Fatal(err)
	}
	if err := h.ops.Publish(ctx, key, src, pv); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if n := len(requests[*csi.NodeStageVolumeRequest](h, "NodeStageVolume")); n != 0 {
		t.Errorf("inline volume staged %d times", n)
	}
	req := requests[*csi.NodePublishVolumeRequest](h, "NodePublishVolume")[0]
	if req.GetStagingTargetPath() != "" || req.GetPublishContext() != nil ||
		req.GetTargetPath() != filepath.Join(h.root, "pods/uid-a/volumes/kubernetes.io~csi/scratch/mount") ||
		req.GetVolumeContext()[EphemeralKey] != "true" || req.GetVolumeContext()["size"] != "1Gi" ||
		req.GetSecrets()["publish-key"] != "publish-s3cr3t" ||
		req.GetVolumeCapability().GetAccessMode().GetMode() != csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER {
		t.Errorf("inline NodePublishVolume request = %v", req)
	}
	rec, err := checkpoint.ReadPublish(filepath.Join(h.root, "pods/uid-a/volumes/kubernetes.io~csi/scratch/vol_data.json"))
	if err != nil || rec.VolumeLifecycleMode != storagev1.VolumeLifecycleEphemeral || rec.SpecVolID != "scratch" {
		t.Errorf("inline publish record = %+v, %v", rec, err)
	}
	if err := h.ops.Unpublish(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := h.ops.Unstage(ctx, key.Volume); err != nil {
		t.Fatal(err)
	}
	if n := len(h.world.VolumeNames()); n != 0 || len(requests[*csi.NodeUnstageVolumeRequest](h, "NodeUnstageVolume")) != 0 {
		t.Errorf("after teardown %d volumes remain, NodeUnstageVolume calls %d", n, len(requests[*csi.NodeUnstageVolumeRequest](h, "NodeUnstageVolume")))
	}
}

func TestPublishPreconditions(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	src := pvSource()
	name := volume.PersistentName(src.Driver, src.Handle)
	key := keyOf(src, "uid-a")
	ctx := testContext(t)
	if err := h.ops.Publish(ctx, key, src, podVolume("uid-a", "pod-a")); !errors.Is(err, volume.ErrNotStaged) {
		t.Errorf("Publish before Stage = %v, want ErrNotStaged", err)
	}
	if err := h.ops.Stage(ctx, name, src, nil); !errors.Is(err, volume.ErrNotAttached) {
		t.Errorf("Stage before attach = %v, want ErrNotAttached", err)
	}
	p, _ := h.world.Pod(key)
	if p.State != volume.NotPublished || p.LastError == nil || !errors.Is(p.LastError.Err, volume.ErrNotStaged) {
		t.Errorf("pod entry = %+v, want NotPublished with the ErrNotStaged error", p)
	}
	if n := len(requests[*csi.NodePublishVolumeRequest](h, "NodePublishVolume")) + len(requests[*csi.NodeStageVolumeRequest](h, "NodeStageVolume")); n != 0 {
		t.Errorf("%d CSI calls despite failed preconditions", n)
	}
	// Unpublish of the failed entry calls nothing and forgets it.
	if err := h.ops.Unpublish(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, ok := h.world.Pod(key); ok || len(requests[*csi.NodeUnpublishVolumeRequest](h, "NodeUnpublishVolume")) != 0 {
		t.Error("Unpublish of a never published entry called the driver or kept the entry")
	}

	bad := src
	bad.PVName = "../../etc"
	h.noAttach()
	if err := h.ops.Stage(ctx, volume.PersistentName(bad.Driver, bad.Handle), bad, nil); err != nil {
		t.Fatal(err)
	}
	err := h.ops.Publish(ctx, keyOf(bad, "uid-b"), bad, podVolume("uid-b", "pod-b"))
	if err != nil {
		t.Fatalf("Publish with PV name ../../etc: %v (it escapes to one harmless directory)", err)
	}
	bad.PVName = ".."
	if err := h.ops.Publish(ctx, keyOf(bad, "uid-c"), bad, podVolume("uid-c", "pod-c")); !errors.Is(err, volume.ErrInvalidName) {
		t.Errorf("Publish with PV name .. = %v, want ErrInvalidName", err)
	}
}

func TestReadWriteOncePod(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.noAttach()
	src := pvSource()
	src.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod}
	ctx := testContext(t)
	if err := h.ops.Stage(ctx, volume.PersistentName(src.Driver, src.Handle), src, nil); err != nil {
		t.Fatal(err)
	}
	a, b := keyOf(src, "uid-a"), keyOf(src, "uid-b")
	h.client.NextNodePublishVolumeErr = status.Error(codes.DeadlineExceeded, "slow")
	_ = h.ops.Publish(ctx, a, src, podVolume("uid-a", "pod-a"))
	h.client.NextNodePublishVolumeErr = nil
	// An uncertain publish of pod a counts as a use.
	err := h.ops.Publish(ctx, b, src, podVolume("uid-b", "pod-b"))
	if !errors.Is(err, volume.ErrInUse) || !strings.Contains(err.Error(), "uid-a") {
		t.Fatalf("second pod's Publish = %v, want ErrInUse naming uid-a", err)
	}
	if err := h.ops.Publish(ctx, a, src, podVolume("uid-a", "pod-a")); err != nil {
		t.Fatalf("the same pod's retry = %v", err)
	}
	if err := h.ops.Unpublish(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := h.ops.Publish(ctx, b, src, podVolume("uid-b", "pod-b")); err != nil {
		t.Errorf("Publish after the first pod went = %v", err)
	}
}

func TestServiceAccountTokens(t *testing.T) {
	for _, inSecrets := range []bool{false, true} {
		h, src := stagedHarness(t, harnessOptions{tokens: fakeTokens{}})
		pol := volume.DefaultPolicy()
		pol.AttachRequired = false
		pol.TokenRequests = []storagev1.TokenRequest{{Audience: "vault"}, {Audience: ""}}
		pol.ServiceAccountTokenInSecrets = inSecrets
		h.policies.set(testDriver, pol)
		if err := h.ops.Publish(testContext(t), keyOf(src, "uid-a"), src, podVolume("uid-a", "pod-a")); err != nil {
			t.Fatal(err)
		}
		req := requests[*csi.NodePublishVolumeRequest](h, "NodePublishVolume")[0]
		where, other := req.GetVolumeContext(), req.GetSecrets()
		if inSecrets {
			where, other = other, where
		}
		if _, ok := other[ServiceAccountTokensKey]; ok {
			t.Errorf("inSecrets=%v: the tokens are in both volume_context and secrets", inSecrets)
		}
		var tokens map[string]struct {
			Token string `json:"token"`
		}
		if err := json.Unmarshal([]byte(where[ServiceAccountTokensKey]), &tokens); err != nil {
			t.Fatalf("inSecrets=%v: %s = %q: %v", inSecrets, ServiceAccountTokensKey, where[ServiceAccountTokensKey], err)
		}
		if tokens["vault"].Token != "token-for-vault-sa-pod-a" || tokens[""].Token != "token-for--sa-pod-a" {
			t.Errorf("inSecrets=%v: tokens = %+v", inSecrets, tokens)
		}
		if inSecrets && req.GetSecrets()["publish-key"] != "publish-s3cr3t" {
			t.Error("the tokens replaced the publish Secret")
		}
	}

	h, src := stagedHarness(t, harnessOptions{})
	pol := volume.DefaultPolicy()
	pol.AttachRequired = false
	pol.TokenRequests = []storagev1.TokenRequest{{Audience: "vault"}}
	h.policies.set(testDriver, pol)
	if err := h.ops.Publish(testContext(t), keyOf(src, "uid-a"), src, podVolume("uid-a", "pod-a")); !errors.Is(err, volume.ErrInvalidSpec) {
		t.Errorf("Publish for a driver with tokenRequests and no token issuer = %v, want ErrInvalidSpec", err)
	}
}

func TestPublishErrorClasses(t *testing.T) {
	for _, tc := range codeClass {
		t.Run(tc.code.String(), func(t *testing.T) {
			h, src := stagedHarness(t, harnessOptions{})
			key := keyOf(src, "uid-a")
			pub, _ := h.ops.Layout().Publishing("uid-a", "pv-1", volume.Filesystem)
			h.client.NextNodePublishVolumeErr = status.Error(tc.code, "injected")
			err := h.ops.Publish(testContext(t), key, src, podVolume("uid-a", "pod-a"))
			if status.Code(err) != tc.code || errors.Is(err, csiclient.ErrUncertain) != tc.uncertain {
				t.Fatalf("Publish = %v, want %v (uncertain %v)", err, tc.code, tc.uncertain)
			}
			p, _ := h.world.Pod(key)
			want := volume.NotPublished
			if tc.uncertain {
				want = volume.PublishUncertain
			}
			if p.State != want || p.LastError == nil || p.LastError.Step != volume.StepPublish || published(h.world, key) {
				t.Errorf("pod entry = %+v, want %v with the error and not ready", p, want)
			}
			if got := slices.Contains(h.world.Publishers(key.Volume), key.Pod); got != tc.uncertain {
				t.Errorf("pod counted as publisher = %v, want %v (torn down when unwanted)", got, tc.uncertain)
			}
			if got := exists(t, pub.Record); got != tc.uncertain {
				t.Errorf("publish record exists = %v, want %v", got, tc.uncertain)
			}
		})
	}
}

func TestReconstructedPublishStaysUncertainOnFinalError(t *testing.T) {
	h, src := stagedHarness(t, harnessOptions{})
	key := keyOf(src, "uid-a")
	pub, _ := h.ops.Layout().Publishing("uid-a", "pv-1", volume.Filesystem)
	h.world.AddReconstructedPod(key, src.ID, pub.Target)
	h.client.NextNodePublishVolumeErr = status.Error(codes.FailedPrecondition, "final")
	_ = h.ops.Publish(testContext(t), key, src, podVolume("uid-a", "pod-a"))
	if p, _ := h.world.Pod(key); p.State != volume.PublishUncertain || !p.Reconstructed {
		t.Errorf("reconstructed pod after a final error = %+v, want still uncertain", p)
	}
}

func TestUnpublish(t *testing.T) {
	for _, tc := range []struct {
		name         string
		err          error
		stillMounted bool
		wantErr      error
	}{
		{name: "success"},
		{name: "NotFound is already done", err: status.Error(codes.NotFound, "gone")},
		{name: "final error", err: status.Error(codes.Internal, "busy"), wantErr: csiclient.ErrFinal},
		{name: "uncertain error", err: status.Error(codes.Unavailable, "restarting"), wantErr: csiclient.ErrUncertain},
		{name: "target still mounted", stillMounted: true, wantErr: ErrStillMounted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, src := stagedHarness(t, harnessOptions{})
			key := keyOf(src, "uid-a")
			pub, _ := h.ops.Layout().Publishing("uid-a", "pv-1", volume.Filesystem)
			ctx := testContext(t)
			if err := h.ops.Publish(ctx, key, src, podVolume("uid-a", "pod-a")); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(pub.Target, 0o750); err != nil { // as a driver does
				t.Fatal(err)
			}
			h.client.NextNodeUnpublishVolumeErr = tc.err
			h.mounts.mounted[pub.Target] = tc.stillMounted
			err := h.ops.Unpublish(ctx, key)
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("Unpublish = %v", err)
				}
				if _, ok := h.world.Pod(key); ok || exists(t, filepath.Join(h.root, "pods")+"/uid-a") {
					t.Error("the pod entry or its directory is left after Unpublish")
				}
				if h.world.MayUnstage(key.Volume) != nil {
					t.Error("the volume cannot be unstaged after its only pod left")
				}
			} else {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Unpublish = %v, want %v", err, tc.wantErr)
				}
				p, _ := h.world.Pod(key)
				if p.State != volume.PublishUncertain || p.LastError == nil || p.LastError.Step != volume.StepUnpublish {
					t.Errorf("pod entry after a failed unpublish = %+v, want PublishUncertain", p)
				}
				if !exists(t, pub.Record) {
					t.Error("the publish record is gone although the unpublish failed")
				}
			}
			want := &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: pub.Target}
			reqs := requests[*csi.NodeUnpublishVolumeRequest](h, "NodeUnpublishVolume")
			if len(reqs) != 1 || !cmp.Equal(reqs[0], want, protocmp.Transform()) {
				t.Errorf("NodeUnpublishVolume requests = %v, want [%v]", reqs, want)
			}
		})
	}
}

func TestDriverNotRegistered(t *testing.T) {
	h, src := stagedHarness(t, harnessOptions{})
	name := volume.PersistentName(src.Driver, src.Handle)
	key := keyOf(src, "uid-a")
	ctx := testContext(t)
	if err := h.ops.Publish(ctx, key, src, podVolume("uid-a", "pod-a")); err != nil {
		t.Fatal(err)
	}
	h.unregister(testDriver)
	for step, fn := range map[string]func() error{
		"Stage":     func() error { return h.ops.Stage(ctx, name, src, nil) },
		"Publish":   func() error { return h.ops.Publish(ctx, keyOf(src, "uid-b"), src, podVolume("uid-b", "pod-b")) },
		"Unpublish": func() error { return h.ops.Unpublish(ctx, key) },
	} {
		if err := fn(); !errors.Is(err, volume.ErrDriverNotRegistered) || !strings.Contains(err.Error(), testDriver) {
			t.Errorf("%s = %v, want ErrDriverNotRegistered naming the driver", step, err)
		}
	}
	if v, _ := h.world.Volume(name); v.Stage != volume.Staged {
		t.Errorf("stage state after a failed Stage = %v, want unchanged Staged", v.Stage)
	}
	if p, _ := h.world.Pod(key); p.State != volume.Published || p.LastError == nil {
		t.Errorf("pod entry after a failed Unpublish = %+v, want still Published with the error", p)
	}
	h.world.ForgetPod(key)
	h.world.ForgetPod(keyOf(src, "uid-b"))
	if err := h.ops.Unstage(ctx, name); !errors.Is(err, volume.ErrDriverNotRegistered) {
		t.Errorf("Unstage = %v, want ErrDriverNotRegistered", err)
	}
}

func TestSecretsNeverLogged(t *testing.T) {
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(10), ktesting.BufferLogs(true)))
	ctx := klog.NewContext(testContext(t), logger)
	h := newHarness(t, harnessOptions{})
	h.noAttach()
	src := pvSource()
	name := volume.PersistentName(src.Driver, src.Handle)
	h.client.NextNodePublishVolumeErr = status.Error(codes.Internal, "driver failed")
	var errs []error
	errs = append(errs, h.ops.Stage(ctx, name, src, nil), h.ops.Publish(ctx, keyOf(src, "uid-a"), src, podVolume("uid-a", "pod-a")))
	delete(h.secrets.m, "ns/publish-secret")
	h.client.NextNodePublishVolumeErr = nil
	errs = append(errs, h.ops.Publish(ctx, keyOf(src, "uid-a"), src, podVolume("uid-a", "pod-a")))
	if errs[2] == nil || !strings.Contains(errs[2].Error(), "ns/publish-secret") {
		t.Errorf("Publish with a missing Secret = %v, want an error naming it", errs[2])
	}
	logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	for _, secret := range []string{"stage-s3cr3t", "publish-s3cr3t"} {
		if strings.Contains(logs, secret) {
			t.Errorf("the logs contain secret %q", secret)
		}
		for _, err := range errs {
			if err != nil && strings.Contains(err.Error(), secret) {
				t.Errorf("error %q contains secret %q", err, secret)
			}
		}
	}
	if !strings.Contains(logs, "Publish") {
		t.Errorf("nothing was logged at all (%d bytes), the check proves nothing", len(logs))
	}
}
