package plugin

import (
	"context"

	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// supportedVersions are the CSI versions announced to the kubelet's plugin watcher, as node-driver-registrar does.
var supportedVersions = []string{"1.0.0"}

// registrationServer answers the kubelet plugin-registration API the way node-driver-registrar does:
// GetInfo names the plugin and its CSI endpoint, NotifyRegistrationStatus is logged and journaled
// (by the journal interceptor) instead of ending the process.
type registrationServer struct {
	registerapi.UnimplementedRegistrationServer
	name     string
	endpoint string
}

var _ registerapi.RegistrationServer = &registrationServer{}

// GetInfo describes the plugin to the registering agent.
func (s *registrationServer) GetInfo(ctx context.Context, _ *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	klog.FromContext(ctx).V(2).Info("Registration info requested", "driver", s.name)
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              s.name,
		Endpoint:          s.endpoint,
		SupportedVersions: supportedVersions,
	}, nil
}

// NotifyRegistrationStatus records the agent's verdict on the registration.
func (s *registrationServer) NotifyRegistrationStatus(ctx context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	logger := klog.FromContext(ctx)
	if st.GetPluginRegistered() {
		logger.Info("Plugin registered", "driver", s.name)
	} else {
		logger.Error(nil, "Plugin registration failed", "driver", s.name, "reason", st.GetError())
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// NewRegistrationServer returns the plugin-registration API of a node plugin named name whose CSI
// endpoint is endpoint: a registrar apart from the plugin process, as node-driver-registrar is in
// a real node plugin pod, which keeps serving while the driver restarts.
func NewRegistrationServer(name, endpoint string) registerapi.RegistrationServer {
	return &registrationServer{name: name, endpoint: endpoint}
}
