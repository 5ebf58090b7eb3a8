package plugin

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"sync/atomic"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Event is the kind of a journal entry.
type Event string

const (
	// EventStart is written once when the plugin serves its endpoint.
	EventStart Event = "start"
	// EventBegin is written when a call arrives, before any fault or work.
	EventBegin Event = "begin"
	// EventEnd is written when a call returns; Code holds its result.
	EventEnd Event = "end"
	// EventFault is written when a fault rule fires; Message names the action.
	EventFault Event = "fault"
)

// Entry is one line of the journal.
type Entry struct {
	// PID is the process that wrote the entry; with Seq it identifies a call across plugin restarts.
	PID int `json:"pid"`
	// Seq numbers the calls of one process from 1; begin, end and fault entries of a call share it.
	Seq uint64 `json:"seq,omitempty"`
	// Event is the kind of entry.
	Event Event `json:"event"`
	// Time is when the event happened.
	Time time.Time `json:"time"`
	// Method is the short gRPC method name, e.g. "NodeStageVolume" or "NotifyRegistrationStatus".
	Method string `json:"method,omitempty"`
	// VolumeID is the request's volume_id.
	VolumeID string `json:"volumeID,omitempty"`
	// NodeID is the request's node_id (ControllerPublishVolume, ControllerUnpublishVolume), and the
	// plugin's node ID on start entries.
	NodeID string `json:"nodeID,omitempty"`
	// StagingPath is the request's staging_target_path.
	StagingPath string `json:"stagingPath,omitempty"`
	// TargetPath is the request's target_path.
	TargetPath string `json:"targetPath,omitempty"`
	// VolumePath is the request's volume_path (NodeGetVolumeStats, NodeExpandVolume).
	VolumePath string `json:"volumePath,omitempty"`
	// ReadOnly is the request's readonly flag.
	ReadOnly bool `json:"readOnly,omitempty"`
	// PublishContext is the request's publish_context (NodeStageVolume, NodePublishVolume).
	PublishContext map[string]string `json:"publishContext,omitempty"`
	// RequiredBytes is the request's capacity_range.required_bytes (CreateVolume,
	// ControllerExpandVolume, NodeExpandVolume).
	RequiredBytes int64 `json:"requiredBytes,omitempty"`
	// TokensDigest is the hex SHA-256 of the service account tokens a NodePublishVolume carries
	// (csi.storage.k8s.io/serviceAccount.tokens, in volume_context or secrets): two calls with the
	// same digest got the same tokens. The tokens themselves are never written.
	TokensDigest string `json:"tokensDigest,omitempty"`
	// MountFlags are the mount_flags of the request's volume_capability (NodeStageVolume,
	// NodePublishVolume), e.g. the context="..." of an SELinux mount.
	MountFlags []string `json:"mountFlags,omitempty"`
	// AccessType is "mount" or "block", the access type of the request's volume_capability.
	AccessType string `json:"accessType,omitempty"`
	// VolumeContext is the request's volume_context (NodePublishVolume), service account tokens
	// included: the journal is test data, read by tests that check where such values must not go.
	VolumeContext map[string]string `json:"volumeContext,omitempty"`
	// Registered is NotifyRegistrationStatus.plugin_registered.
	Registered *bool `json:"registered,omitempty"`
	// Code is the gRPC code name of the result ("OK", "NotFound", ...) on end entries, and on fault
	// entries of "exit-after" the result of the step that ran.
	Code string `json:"code,omitempty"`
	// Message is the error message on end entries, the registration error on begin entries of
	// NotifyRegistrationStatus, the fault action on fault entries ("delay 1s", "hang", "exit-before",
	// "error", "exit-after") and the driver name on start entries.
	Message string `json:"message,omitempty"`
}

// journal appends entries to a JSON-lines file. Each entry is one write(2) on an O_APPEND file
// descriptor, so concurrent entries never interleave and an entry survives the process being
// killed right after it. A nil *journal discards everything.
type journal struct {
	f   *os.File
	pid int
	seq atomic.Uint64
	now func() time.Time
}

// openJournal opens (creating) the journal at p; an empty p returns a nil journal.
func openJournal(p string) (*journal, error) {
	if p == "" {
		return nil, nil
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open journal: %w", err)
	}
	return &journal{f: f, pid: os.Getpid(), now: time.Now}, nil
}

// record stamps e with the process ID and the current time and appends it.
func (j *journal) record(e Entry) error {
	if j == nil {
		return nil
	}
	e.PID = j.pid
	e.Time = j.now()
	line, err := json.Marshal(&e)
	if err != nil {
		return fmt.Errorf("encode journal entry: %w", err)
	}
	if _, err := j.f.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("append to journal: %w", err)
	}
	return nil
}

// recordOrLog records e and logs a failure to do so; a broken journal must not fail the call.
func (j *journal) recordOrLog(ctx context.Context, e Entry) {
	if err := j.record(e); err != nil {
		klog.FromContext(ctx).Error(err, "Failed to write journal entry", "method", e.Method)
	}
}

func (j *journal) close() error {
	if j == nil {
		return nil
	}
	return j.f.Close()
}

// callKey carries a call's sequence number in its context, for the fault interceptor's entries.
type callKey struct{}

// interceptor writes a begin entry before and an end entry after every unary call.
func (j *journal) interceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if j == nil {
		return handler(ctx, req)
	}
	begin := describeCall(info.FullMethod, req)
	begin.Seq = j.seq.Add(1)
	begin.Event = EventBegin
	j.recordOrLog(ctx, begin)

	resp, err := handler(context.WithValue(ctx, callKey{}, begin.Seq), req)

	st := status.Convert(err)
	j.recordOrLog(ctx, Entry{
		Seq:      begin.Seq,
		Event:    EventEnd,
		Method:   begin.Method,
		VolumeID: begin.VolumeID,
		Code:     st.Code().String(),
		Message:  st.Message(),
	})
	return resp, err
}

// serviceAccountTokensKey is the volume_context (or secrets) key of the tokens a CO passes to a
// driver whose CSIDriver asks for them.
const serviceAccountTokensKey = "csi.storage.k8s.io/serviceAccount.tokens"

// describeCall copies the fields of a request that tests assert on into a journal entry.
func describeCall(fullMethod string, req any) Entry {
	e := Entry{Method: path.Base(fullMethod)}
	if r, ok := req.(interface{ GetVolumeId() string }); ok {
		e.VolumeID = r.GetVolumeId()
	}
	if r, ok := req.(interface{ GetNodeId() string }); ok {
		e.NodeID = r.GetNodeId()
	}
	if r, ok := req.(interface{ GetStagingTargetPath() string }); ok {
		e.StagingPath = r.GetStagingTargetPath()
	}
	if r, ok := req.(interface{ GetTargetPath() string }); ok {
		e.TargetPath = r.GetTargetPath()
	}
	if r, ok := req.(interface{ GetVolumePath() string }); ok {
		e.VolumePath = r.GetVolumePath()
	}
	if r, ok := req.(interface{ GetReadonly() bool }); ok {
		e.ReadOnly = r.GetReadonly()
	}
	if r, ok := req.(interface{ GetPublishContext() map[string]string }); ok {
		e.PublishContext = r.GetPublishContext()
	}
	if r, ok := req.(interface{ GetCapacityRange() *csi.CapacityRange }); ok {
		e.RequiredBytes = r.GetCapacityRange().GetRequiredBytes()
	}
	if r, ok := req.(*csi.NodePublishVolumeRequest); ok {
		tokens, found := r.GetVolumeContext()[serviceAccountTokensKey]
		if !found {
			tokens, found = r.GetSecrets()[serviceAccountTokensKey]
		}
		if found {
			sum := sha256.Sum256([]byte(tokens))
			e.TokensDigest = hex.EncodeToString(sum[:])
		}
		e.VolumeContext = r.GetVolumeContext()
	}
	if r, ok := req.(interface{ GetVolumeCapability() *csi.VolumeCapability }); ok && r.GetVolumeCapability() != nil {
		c := r.GetVolumeCapability()
		e.MountFlags = c.GetMount().GetMountFlags()
		switch {
		case c.GetMount() != nil:
			e.AccessType = "mount"
		case c.GetBlock() != nil:
			e.AccessType = "block"
		}
	}
	if r, ok := req.(*registerapi.RegistrationStatus); ok {
		registered := r.GetPluginRegistered()
		e.Registered = &registered
		e.Message = r.GetError()
	}
	return e
}

// ReadJournal parses the journal at p. A last line without its newline, still being written, is ignored.
func ReadJournal(p string) ([]Entry, error) {
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("read journal: %w", err)
	}
	var out []Entry
	for n := 1; len(data) > 0; n++ {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break
		}
		var e Entry
		if err := json.Unmarshal(data[:i], &e); err != nil {
			return out, fmt.Errorf("journal %s line %d: %w", p, n, err)
		}
		out = append(out, e)
		data = data[i+1:]
	}
	return out, nil
}

// Call is one call assembled from its journal entries.
type Call struct {
	// PID and Seq identify the call.
	PID int
	Seq uint64
	// Begin is the begin entry, with the request's fields.
	Begin Entry
	// End is the end entry; its zero value (Done false) means the call never returned, e.g. the
	// plugin exited during it.
	End Entry
	// Done reports whether the call returned.
	Done bool
	// Faults are the fault entries of the call.
	Faults []Entry
}

// Code returns the call's result code; Unknown if it never returned.
func (c Call) Code() codes.Code {
	if !c.Done {
		return codes.Unknown
	}
	code, _ := parseCode(c.End.Code)
	return code
}

// Overlaps reports whether two calls were in the plugin at the same time. A call that never
// returned is taken to last forever.
func (c Call) Overlaps(o Call) bool {
	end := func(x Call) time.Time {
		if x.Done {
			return x.End.Time
		}
		return time.Unix(1<<40, 0)
	}
	return c.Begin.Time.Before(end(o)) && o.Begin.Time.Before(end(c))
}

// Calls groups begin, end and fault entries into calls, in the order the calls began.
func Calls(entries []Entry) []Call {
	type key struct {
		pid int
		seq uint64
	}
	index := map[key]int{}
	var out []Call
	for _, e := range entries {
		if e.Seq == 0 {
			continue
		}
		k := key{e.PID, e.Seq}
		i, ok := index[k]
		if !ok {
			i = len(out)
			index[k] = i
			out = append(out, Call{PID: e.PID, Seq: e.Seq})
		}
		switch e.Event {
		case EventBegin:
			out[i].Begin = e
		case EventEnd:
			out[i].End, out[i].Done = e, true
		case EventFault:
			out[i].Faults = append(out[i].Faults, e)
		}
	}
	return out
}

// parseCode maps a code name as codes.Code.String writes it ("NotFound") back to the code.
func parseCode(name string) (codes.Code, bool) {
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if c.String() == name {
			return c, true
		}
	}
	return codes.Unknown, false
}
