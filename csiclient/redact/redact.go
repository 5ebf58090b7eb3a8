// Package redact keeps secrets out of logs. CSI messages are logged with
// their csi_secret fields stripped (csi-lib-utils protosanitizer) and with
// the credentials the kubelet puts into volume_context (the pod's service
// account tokens) replaced too, which protosanitizer does not know. Calls
// whose request or response carries a secret (a Secret GET, a
// TokenRequest, a CSI call) run with a logger capped below the verbosity
// at which client-go and csi-lib-utils log bodies, whatever -v says.
package redact

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	"github.com/kubernetes-csi/csi-lib-utils/protosanitizer"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"k8s.io/klog/v2"
)

// CredentialKeys are the volume_context keys whose values are credentials:
// the pod's service account tokens (CSIDriver tokenRequests).
var CredentialKeys = []string{"csi.storage.k8s.io/serviceAccount.tokens"}

// Redacted replaces a credential's value.
const Redacted = "***stripped***"

// CSI returns msg for a log: a CSI request or response with its secrets
// and the credentials of its volume_context replaced. Anything that is not
// a protobuf message is returned as protosanitizer would.
func CSI(msg any) fmt.Stringer {
	m, ok := msg.(proto.Message)
	if !ok || m == nil {
		return protosanitizer.StripSecrets(msg)
	}
	if r := m.ProtoReflect(); r.IsValid() && hasCredential(r) {
		c := proto.Clone(m)
		stripCredentials(c.ProtoReflect())
		msg = c
	}
	return protosanitizer.StripSecrets(msg)
}

// hasCredential says whether the message has a volume_context entry whose
// value is a credential.
func hasCredential(r protoreflect.Message) bool {
	f := r.Descriptor().Fields().ByName("volume_context")
	if f == nil || !f.IsMap() || !r.Has(f) {
		return false
	}
	vc := r.Get(f).Map()
	for _, k := range CredentialKeys {
		if vc.Has(protoreflect.ValueOfString(k).MapKey()) {
			return true
		}
	}
	return false
}

// stripCredentials replaces the credentials of r's volume_context.
func stripCredentials(r protoreflect.Message) {
	vc := r.Mutable(r.Descriptor().Fields().ByName("volume_context")).Map()
	for _, k := range CredentialKeys {
		if key := protoreflect.ValueOfString(k).MapKey(); vc.Has(key) {
			vc.Set(key, protoreflect.ValueOfString(Redacted))
		}
	}
}

// Verbosities below which the capped loggers of Quiet log nothing.
const (
	// APIBodies is the highest verbosity that is safe for a client-go call
	// whose request or response body holds a secret: client-go logs bodies
	// (and the response headers) from V(8), the URL from V(6).
	APIBodies = 7
	// CSIMessages keeps csi-lib-utils' LogGRPC (V(5)) quiet: it strips only
	// csi_secret fields; the caller logs the message with CSI instead.
	CSIMessages = 4
)

// Quiet returns ctx with its logger (klog.FromContext) capped at verbosity
// maxV: V(n) of it and of every logger derived from it is off for n > maxV.
func Quiet(ctx context.Context, maxV int) context.Context {
	sink := klog.FromContext(ctx).GetSink()
	if sink == nil {
		return ctx
	}
	if s, ok := sink.(logr.CallDepthLogSink); ok {
		sink = s.WithCallDepth(1) // capped's own frame
	}
	return klog.NewContext(ctx, logr.New(capped{sink: sink, maxV: maxV}))
}

// capped is a LogSink that turns off the verbosities above maxV.
type capped struct {
	sink logr.LogSink
	maxV int
}

// Init does nothing: the wrapped sink was initialized by its own Logger,
// and is shared with it.
func (capped) Init(logr.RuntimeInfo) {}

func (c capped) Enabled(level int) bool { return level <= c.maxV && c.sink.Enabled(level) }

func (c capped) Info(level int, msg string, kv ...any) {
	if level <= c.maxV {
		c.sink.Info(level, msg, kv...)
	}
}

func (c capped) Error(err error, msg string, kv ...any) { c.sink.Error(err, msg, kv...) }

func (c capped) WithValues(kv ...any) logr.LogSink {
	return capped{sink: c.sink.WithValues(kv...), maxV: c.maxV}
}

func (c capped) WithName(name string) logr.LogSink {
	return capped{sink: c.sink.WithName(name), maxV: c.maxV}
}

// WithCallDepth keeps the caller's line numbers right when the sink can.
func (c capped) WithCallDepth(depth int) logr.LogSink {
	if s, ok := c.sink.(logr.CallDepthLogSink); ok {
		return capped{sink: s.WithCallDepth(depth), maxV: c.maxV}
	}
	return c
}
