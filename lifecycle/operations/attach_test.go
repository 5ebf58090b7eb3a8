package operations

import (
	"errors"
	"strings"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

func TestWaitForAttach(t *testing.T) {
	src := pvSource()
	vaName := volume.AttachmentName(src.Handle, src.Driver, testNode)
	now := metav1.Now()
	for _, tc := range []struct {
		name        string
		va          *storagev1.VolumeAttachment
		noAttach    bool
		wantErr     string // substring; "" means success
		wantIs      error  // the sentinel the error wraps; nil means volume.ErrNotAttached
		wantContext map[string]string
	}{
		{name: "attach not required", noAttach: true},
		{name: "missing", wantErr: "does not exist"},
		{name: "not attached yet", va: &storagev1.VolumeAttachment{}, wantErr: "not attached yet"},
		{name: "for another node", va: &storagev1.VolumeAttachment{Spec: storagev1.VolumeAttachmentSpec{NodeName: "other-node"},
			Status: storagev1.VolumeAttachmentStatus{Attached: true}}, wantErr: `is for node "other-node" and attacher "` + src.Driver + `", not node "` + testNode + `"`},
		{name: "of another attacher", va: &storagev1.VolumeAttachment{Spec: storagev1.VolumeAttachmentSpec{Attacher: "other.example.com"},
			Status: storagev1.VolumeAttachmentStatus{Attached: true}}, wantErr: `attacher "other.example.com"`},
		{name: "attach error", va: &storagev1.VolumeAttachment{Status: storagev1.VolumeAttachmentStatus{
			AttachError: &storagev1.VolumeError{Message: "rpc error: disk is locked"}}}, wantErr: "attach failed: VolumeAttachment " + vaName + ": rpc error: disk is locked",
			wantIs: ErrAttachFailed},
		{name: "being deleted", va: &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now},
			Status: storagev1.VolumeAttachmentStatus{Attached: true}}, wantErr: "being deleted"},
		{name: "attached", va: &storagev1.VolumeAttachment{Status: storagev1.VolumeAttachmentStatus{
			Attached: true, AttachmentMetadata: map[string]string{"devicePath": "/dev/sdz"}}},
			wantContext: map[string]string{"devicePath": "/dev/sdz"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessOptions{})
			if tc.noAttach {
				h.noAttach()
			}
			if tc.va != nil {
				tc.va.Name = vaName
				// Unless the case says otherwise, the VolumeAttachment is this node's and driver's.
				if tc.va.Spec.NodeName == "" {
					tc.va.Spec.NodeName = testNode
				}
				if tc.va.Spec.Attacher == "" {
					tc.va.Spec.Attacher = src.Driver
				}
				h.vas.set(tc.va)
			}
			name := volume.PersistentName(src.Driver, src.Handle)
			err := h.ops.WaitForAttach(testContext(t), name, src)
			v, _ := h.world.Volume(name)
			if tc.wantErr != "" {
				wantIs := tc.wantIs
				if wantIs == nil {
					wantIs = volume.ErrNotAttached
				}
				if !errors.Is(err, wantIs) || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), vaName) {
					t.Fatalf("WaitForAttach = %v, want %v naming %s with %q", err, wantIs, vaName, tc.wantErr)
				}
				if !errors.Is(wantIs, volume.ErrNotAttached) && errors.Is(err, volume.ErrNotAttached) {
					t.Errorf("WaitForAttach = %v, must not read as not attached yet", err)
				}
				if v.Attached || v.LastError == nil || v.LastError.Step != volume.StepWaitForAttach {
					t.Errorf("asw = %+v, want not attached with the error", v)
				}
				return
			}
			if err != nil {
				t.Fatalf("WaitForAttach = %v", err)
			}
			if !v.Attached || len(v.PublishContext) != len(tc.wantContext) || v.PublishContext["devicePath"] != tc.wantContext["devicePath"] {
				t.Errorf("asw = %+v, want attached with publish_context %v", v, tc.wantContext)
			}
		})
	}
}

func TestWaitForAttachOfInlineVolumeRecordsNothing(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	name := volume.InlineName("uid", "scratch")
	if err := h.ops.WaitForAttach(testContext(t), name, volume.Source{ID: volume.ID{Driver: testDriver}, Inline: true}); err != nil {
		t.Fatal(err)
	}
	if _, ok := h.world.Volume(name); ok {
		t.Error("an inline volume was recorded as attached")
	}
}

// TestPublishContextIsReadForEachStep: the publish_context of stage and
// publish is the VolumeAttachment's attachmentMetadata at the time of the
// step, not what the first WaitForAttach saw (the kubelet reads the
// VolumeAttachment again in MountDevice and SetUpAt).
func TestPublishContextIsReadForEachStep(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	src := pvSource()
	name := volume.PersistentName(src.Driver, src.Handle)
	ctx := testContext(t)
	h.vas.set(attached(src, map[string]string{"devicePath": "/dev/old"}))
	if err := h.ops.WaitForAttach(ctx, name, src); err != nil {
		t.Fatal(err)
	}
	h.vas.set(attached(src, map[string]string{"devicePath": "/dev/stage"}))
	if err := h.ops.Stage(ctx, name, src, nil); err != nil {
		t.Fatal(err)
	}
	h.vas.set(attached(src, map[string]string{"devicePath": "/dev/publish"}))
	if err := h.ops.Publish(ctx, keyOf(src, "uid-a"), src, podVolume("uid-a", "pod-a")); err != nil {
		t.Fatal(err)
	}
	stage := requests[*csi.NodeStageVolumeRequest](h, "NodeStageVolume")
	publish := requests[*csi.NodePublishVolumeRequest](h, "NodePublishVolume")
	if len(stage) != 1 || len(publish) != 1 {
		t.Fatalf("got %d stage and %d publish requests, want one each", len(stage), len(publish))
	}
	if got := stage[0].GetPublishContext()["devicePath"]; got != "/dev/stage" {
		t.Errorf("NodeStageVolume publish_context devicePath = %q, want the VolumeAttachment's at stage time /dev/stage", got)
	}
	if got := publish[0].GetPublishContext()["devicePath"]; got != "/dev/publish" {
		t.Errorf("NodePublishVolume publish_context devicePath = %q, want the VolumeAttachment's at publish time /dev/publish", got)
	}

	// A VolumeAttachment that is no longer attached stops the next step.
	h.vas.set(&storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: volume.AttachmentName(src.Handle, src.Driver, testNode)}})
	if err := h.ops.Publish(ctx, keyOf(src, "uid-b"), src, podVolume("uid-b", "pod-b")); !errors.Is(err, volume.ErrNotAttached) {
		t.Errorf("Publish with the VolumeAttachment detached = %v, want %v", err, volume.ErrNotAttached)
	}
}
