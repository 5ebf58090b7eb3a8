package config

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
)

// DefaultNodePods is the pod capacity of a registered Node: the kubelet's
// default maxPods, so that the scheduler places pods on a virtual node
// without a patch.
const DefaultNodePods = 110

// DefaultNodeTaint is the taint of a registered Node unless nodeTaints
// says otherwise: with a pod capacity the scheduler would place any pod on
// a node that may run no containers, so only pods that tolerate it land
// there, as virtual-kubelet's default provider taint does.
var DefaultNodeTaint = corev1.Taint{Key: "csi-volmgr.io/virtual", Value: "true", Effect: corev1.TaintEffectNoSchedule}

// Defaults returns the configuration of `csi-volmgr run` without flags.
func Defaults() *CSIVolmgrConfiguration {
	c := &CSIVolmgrConfiguration{
		TypeMeta:     metav1.TypeMeta{APIVersion: APIVersion, Kind: Kind},
		RootDir:      "/var/lib/csi-volmgr",
		HTTPEndpoint: "127.0.0.1:9809",
		// TLS 1.2 at least; tokens for the agent's own audience and the
		// kubelet's cache lifetimes: apiauth's defaults (app's
		// TestHTTPAccessDefaults keeps them equal).
		TLSMinVersion:                            "VersionTLS12",
		TLSCipherSuites:                          []string{},
		APIAudiences:                             []string{"csi-volmgr"},
		AuthenticationTokenWebhookCacheTTL:       metav1.Duration{Duration: 2 * time.Minute},
		AuthorizationWebhookCacheAuthorizedTTL:   metav1.Duration{Duration: 5 * time.Minute},
		AuthorizationWebhookCacheUnauthorizedTTL: metav1.Duration{Duration: 30 * time.Second},
		// volumemanager.DefaultHTTPMaxConnections.
		HTTPMaxConnections: 256,
		// The agent's whole client budget (the kubelet's is 50/100, shared
		// with its status, events and node heartbeats): its reads, the
		// condition writes and the Events share one token bucket. Its
		// requests follow the pods: a GET per newly referenced object (a
		// LIST when a burst needs a large share of a namespace), a status
		// write per pod, a GET per settled object and period. The burst lets
		// a node start or restart its 110 pods without queueing; the rate
		// bounds a runaway.
		KubeAPIQPS:   100,
		KubeAPIBurst: 400,
		// The kubelet's default: protobuf costs the API server and the
		// agent a fraction of JSON's CPU to encode and decode, which counts
		// when a restart or a burst reads thousands of claims and volumes.
		KubeAPIContentType: runtime.ContentTypeProtobuf,
		// A referenced object is watched only until it settles (a claim or
		// volume bound, an attachment attached), then read again every 2
		// minutes ± 50 %: no standing watch per volume on the API server
		// and 1 GET per pod and minute, against the kubelet's 1.6 (its pod
		// syncs), with an expansion seen about as soon as the kubelet sees
		// it (docs/performance.md measures both ways; 0 watches every
		// referenced object while it is referenced).
		// volumemanager.DefaultSettledObjectResync (app's
		// TestSettledObjectResyncDefault keeps them equal).
		SettledObjectResync: metav1.Duration{Duration: 2 * time.Minute},
		ResyncPeriod:        metav1.Duration{Duration: 5 * time.Minute},
		CSITimeout:          metav1.Duration{Duration: csiclient.DefaultTimeout},
		NodePods:            DefaultNodePods,
		StatsPeriod:         metav1.Duration{Duration: time.Minute},
		StatsConcurrency:    4,
		RepublishPeriod:     metav1.Duration{Duration: time.Minute},
		// Empty, not nil: print-defaults shows every field ([] and {}).
		NodeLabels:        map[string]string{},
		NodeTaints:        []corev1.Taint{DefaultNodeTaint},
		ExpectedDrivers:   []string{},
		MountCheckDrivers: []string{},
	}
	logsapi.SetRecommendedLoggingConfiguration(&c.Logging)
	return c
}
