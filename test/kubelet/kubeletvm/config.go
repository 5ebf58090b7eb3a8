package kubeletvm

import (
	"errors"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	kubeletconfig "k8s.io/kubelet/config/v1beta1"
	kubeletdefaults "k8s.io/kubernetes/pkg/kubelet/apis/config/v1beta1"
)

// Config says where the kubelet's volume manager runs.
type Config struct {
	// Client is the kubelet's API client: the populator's PVC and PV reads,
	// the operation executor's reads, the pod source and the node and
	// CSIDriver informers. ClientConfigs builds its config.
	Client kubernetes.Interface
	// HeartbeatClient writes the node status (the kubelet's heartbeat
	// client: no client-side rate limit).
	HeartbeatClient kubernetes.Interface
	// EventClient records Events (EventRecordQPS, EventBurst).
	EventClient kubernetes.Interface
	// NodeName is the Node whose pods the kubelet serves; it must exist.
	NodeName string
	// RootDir is the kubelet's --root-dir (pods/, plugins/ below it).
	RootDir string
	// RegistrationDir is where the plugin manager watches for
	// registration sockets; empty means <RootDir>/plugins_registry, the
	// kubelet's own.
	RegistrationDir string
	// Kubelet is the kubelet configuration; Defaults returns the kubelet's
	// defaults. Used: SyncFrequency, NodeStatusUpdateFrequency,
	// NodeStatusReportFrequency, EnableControllerAttachDetach,
	// VolumeStatsAggPeriod.
	Kubelet kubeletconfig.KubeletConfiguration
}

// Defaults returns the kubelet's configuration defaults, from the kubelet's
// own defaulting (pkg/kubelet/apis/config/v1beta1), as a kubelet started
// without a config file has them: KubeAPIQPS 50, KubeAPIBurst 100,
// protobuf, SyncFrequency 1m, NodeStatusUpdateFrequency 10s, ...
func Defaults() kubeletconfig.KubeletConfiguration {
	var c kubeletconfig.KubeletConfiguration
	kubeletdefaults.SetDefaults_KubeletConfiguration(&c)
	return c
}

// ClientConfigs derives the kubelet's three client configs from base (a
// kubeconfig's), as cmd/kubelet/app does: the main client with KubeAPIQPS,
// KubeAPIBurst and ContentType; the event client with EventRecordQPS and
// EventBurst; the heartbeat client without a rate limit and with a timeout
// of min(NodeStatusUpdateFrequency, NodeLeaseDurationSeconds).
func ClientConfigs(base *rest.Config, kc *kubeletconfig.KubeletConfiguration) (client, heartbeat, events *rest.Config) {
	client = rest.CopyConfig(base)
	if kc.ContentType != "" {
		client.ContentType = kc.ContentType
		if kc.ContentType == runtime.ContentTypeProtobuf {
			client.AcceptContentTypes = strings.Join([]string{runtime.ContentTypeProtobuf, runtime.ContentTypeJSON}, ",")
		}
	}
	client.QPS = float32(*kc.KubeAPIQPS)
	client.Burst = int(kc.KubeAPIBurst)

	events = rest.CopyConfig(client)
	events.QPS = float32(*kc.EventRecordQPS)
	if int(events.QPS) == 0 {
		events.QPS = -1
	}
	events.Burst = int(kc.EventBurst)

	heartbeat = rest.CopyConfig(client)
	heartbeat.Timeout = kc.NodeStatusUpdateFrequency.Duration
	if lease := time.Duration(kc.NodeLeaseDurationSeconds) * time.Second; heartbeat.Timeout > lease {
		heartbeat.Timeout = lease
	}
	heartbeat.QPS = -1
	return client, heartbeat, events
}

func (c *Config) validate() error {
	switch {
	case c.Client == nil || c.HeartbeatClient == nil || c.EventClient == nil:
		return errors.New("kubeletvm: the three clients are required")
	case c.NodeName == "":
		return errors.New("kubeletvm: NodeName is required")
	case c.RootDir == "" || !filepath.IsAbs(c.RootDir):
		return errors.New("kubeletvm: RootDir must be an absolute path")
	case c.Kubelet.SyncFrequency.Duration <= 0 || c.Kubelet.NodeStatusUpdateFrequency.Duration <= 0:
		return errors.New("kubeletvm: Kubelet is not defaulted (use Defaults)")
	}
	if c.RegistrationDir == "" {
		c.RegistrationDir = filepath.Join(c.RootDir, "plugins_registry")
	}
	return nil
}
