package kubeletvm

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/kubernetes/pkg/kubelet/kubeletconfig"
	"k8s.io/kubernetes/pkg/kubelet/token"
	"k8s.io/kubernetes/pkg/volume"
	"k8s.io/kubernetes/pkg/volume/util/hostutil"
	"k8s.io/kubernetes/pkg/volume/util/subpath"
	"k8s.io/mount-utils"
)

// volumeHost stands in for the kubelet's kubeletVolumeHost
// (pkg/kubelet/volume_host.go), which is unexported and wraps the whole
// *kubelet.Kubelet. Every method does what the kubelet's does, reading the
// same things:
//
//   - directories: the kubelet's layout below RootDir (kubelet_getters.go);
//   - the CSIDriver lister from its own informer factory, started by
//     VolumePluginMgr.Run as in the kubelet;
//   - the Node from the kubelet's one-node informer (GetNode reads
//     kl.nodeLister);
//   - service account tokens from the kubelet's real token.Manager;
//   - SetKubeletError records the storage error that keeps the kubelet's
//     node NotReady (here: /readyz) until CSINode is initialized.
//
// What it does not have: the secret and ConfigMap managers (as a kubelet
// without them, e.g. standalone, it answers "not supported"), the
// ClusterTrustBundle and PodCertificate managers (errors). The pods of the
// benchmarks use none of them; PVC-backed CSI volumes never call them.
type volumeHost struct {
	pluginMgr volume.VolumePluginMgr

	client     kubernetes.Interface
	nodeName   types.NodeName
	rootDir    string
	nodeLister corelisters.NodeLister
	recorder   record.EventRecorder
	mounter    mount.Interface
	hostUtil   hostutil.HostUtils
	subpather  subpath.Interface
	tokens     *token.Manager

	informerFactory  informers.SharedInformerFactory
	csiDriverLister  storagelisters.CSIDriverLister
	csiDriversSynced cache.InformerSynced

	// mu guards storageErr.
	mu         sync.Mutex
	storageErr error
}

var (
	_ volume.VolumeHost        = &volumeHost{}
	_ volume.KubeletVolumeHost = &volumeHost{}
)

func newVolumeHost(client kubernetes.Interface, nodeName types.NodeName, rootDir string,
	nodeLister corelisters.NodeLister, recorder record.EventRecorder, mounter mount.Interface) *volumeHost {
	// As NewInitializedVolumePluginMgr: a factory of its own, resync 0.
	factory := informers.NewSharedInformerFactory(client, 0)
	csiDrivers := factory.Storage().V1().CSIDrivers()
	return &volumeHost{
		client:           client,
		nodeName:         nodeName,
		rootDir:          rootDir,
		nodeLister:       nodeLister,
		recorder:         recorder,
		mounter:          mounter,
		hostUtil:         hostutil.NewHostUtil(),
		subpather:        subpath.New(mounter),
		tokens:           token.NewManager(client),
		informerFactory:  factory,
		csiDriverLister:  csiDrivers.Lister(),
		csiDriversSynced: csiDrivers.Informer().HasSynced,
	}
}

// Directories, as kubelet_getters.go lays them out.

func (h *volumeHost) podsDir() string {
	return filepath.Join(h.rootDir, kubeletconfig.DefaultKubeletPodsDirName)
}
func (h *volumeHost) pluginsDir() string {
	return filepath.Join(h.rootDir, kubeletconfig.DefaultKubeletPluginsDirName)
}
func (h *volumeHost) podDir(uid types.UID) string { return filepath.Join(h.podsDir(), string(uid)) }

func (h *volumeHost) GetPluginDir(pluginName string) string {
	return filepath.Join(h.pluginsDir(), pluginName)
}

func (h *volumeHost) GetVolumeDevicePluginDir(pluginName string) string {
	return filepath.Join(h.pluginsDir(), pluginName, kubeletconfig.DefaultKubeletVolumeDevicesDirName)
}

func (h *volumeHost) GetPodsDir() string { return h.podsDir() }

func (h *volumeHost) GetPodVolumeDir(podUID types.UID, pluginName, volumeName string) string {
	return filepath.Join(h.podDir(podUID), kubeletconfig.DefaultKubeletVolumesDirName, pluginName, volumeName)
}

func (h *volumeHost) GetPodVolumeDeviceDir(podUID types.UID, pluginName string) string {
	return filepath.Join(h.podDir(podUID), kubeletconfig.DefaultKubeletVolumeDevicesDirName, pluginName)
}

func (h *volumeHost) GetPodPluginDir(podUID types.UID, pluginName string) string {
	return filepath.Join(h.podDir(podUID), kubeletconfig.DefaultKubeletPluginsDirName, pluginName)
}

// Clients, mounters, informers.

func (h *volumeHost) GetKubeClient() kubernetes.Interface                 { return h.client }
func (h *volumeHost) GetSubpather() subpath.Interface                     { return h.subpather }
func (h *volumeHost) GetHostUtil() hostutil.HostUtils                     { return h.hostUtil }
func (h *volumeHost) GetMounter() mount.Interface                         { return h.mounter }
func (h *volumeHost) GetInformerFactory() informers.SharedInformerFactory { return h.informerFactory }
func (h *volumeHost) CSIDriverLister() storagelisters.CSIDriverLister     { return h.csiDriverLister }
func (h *volumeHost) CSIDriversSynced() cache.InformerSynced              { return h.csiDriversSynced }
func (h *volumeHost) GetNodeName() types.NodeName                         { return h.nodeName }
func (h *volumeHost) GetEventRecorder() record.EventRecorder              { return h.recorder }

// WaitForCacheSync waits for the CSIDriver informer, as the kubelet's does.
func (h *volumeHost) WaitForCacheSync() error {
	if !cache.WaitForCacheSync(wait.NeverStop, h.csiDriversSynced) {
		return errors.New("failed to wait for cache sync for CSIDriverLister")
	}
	return nil
}

// SetKubeletError records the storage error (nil clears it).
func (h *volumeHost) SetKubeletError(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.storageErr = err
}

func (h *volumeHost) storageError() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.storageErr
}

// NewWrapperMounter is the kubelet's: the wrapped volume's plugin makes
// the mounter (kubelet_volumes.go newVolumeMounterFromPlugins).
func (h *volumeHost) NewWrapperMounter(volName string, spec volume.Spec, pod *corev1.Pod) (volume.Mounter, error) {
	if spec.Volume != nil {
		spec.Volume.Name = "wrapped_" + volName
	}
	plugin, err := h.pluginMgr.FindPluginBySpec(&spec)
	if err != nil {
		return nil, fmt.Errorf("can't use volume plugins for %s: %w", spec.Name(), err)
	}
	return plugin.NewMounter(&spec, pod)
}

// NewWrapperUnmounter is the kubelet's.
func (h *volumeHost) NewWrapperUnmounter(volName string, spec volume.Spec, podUID types.UID) (volume.Unmounter, error) {
	if spec.Volume != nil {
		spec.Volume.Name = "wrapped_" + volName
	}
	plugin, err := h.pluginMgr.FindPluginBySpec(&spec)
	if err != nil {
		return nil, err
	}
	return plugin.NewUnmounter(spec.Name(), podUID)
}

// The Node, from the node informer (kubelet GetNode).

func (h *volumeHost) node() (*corev1.Node, error) {
	node, err := h.nodeLister.Get(string(h.nodeName))
	if err != nil {
		return nil, fmt.Errorf("error retrieving node: %w", err)
	}
	return node, nil
}

func (h *volumeHost) GetNodeAllocatable() (corev1.ResourceList, error) {
	node, err := h.node()
	if err != nil {
		return nil, err
	}
	return node.Status.Allocatable, nil
}

func (h *volumeHost) GetNodeLabels() (map[string]string, error) {
	node, err := h.node()
	if err != nil {
		return nil, err
	}
	return node.Labels, nil
}

func (h *volumeHost) GetAttachedVolumesFromNodeStatus() (map[corev1.UniqueVolumeName]string, error) {
	node, err := h.node()
	if err != nil {
		return nil, err
	}
	out := make(map[corev1.UniqueVolumeName]string, len(node.Status.VolumesAttached))
	for _, av := range node.Status.VolumesAttached {
		out[av.Name] = av.DevicePath
	}
	return out, nil
}

// Managers the benchmarks' pods do not use.

var errNoManager = errors.New("not supported by the kubeletvm harness (no secret, ConfigMap, ClusterTrustBundle or PodCertificate manager)")

func (h *volumeHost) GetSecretFunc() func(namespace, name string) (*corev1.Secret, error) {
	return func(string, string) (*corev1.Secret, error) { return nil, errNoManager }
}

func (h *volumeHost) GetConfigMapFunc() func(namespace, name string) (*corev1.ConfigMap, error) {
	return func(string, string) (*corev1.ConfigMap, error) { return nil, errNoManager }
}

func (h *volumeHost) GetServiceAccountTokenFunc() func(namespace, name string, tr *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error) {
	return h.tokens.GetServiceAccountToken
}

func (h *volumeHost) DeleteServiceAccountTokenFunc() func(podUID types.UID) {
	return h.tokens.DeleteServiceAccountToken
}

func (h *volumeHost) GetTrustAnchorsByName(context.Context, string, bool) ([]byte, error) {
	return nil, errNoManager
}

func (h *volumeHost) GetTrustAnchorsBySigner(context.Context, string, *metav1.LabelSelector, bool) ([]byte, error) {
	return nil, errNoManager
}

func (h *volumeHost) GetPodCertificateCredentialBundle(context.Context, string, string, string, string, int) ([]byte, []byte, error) {
	return nil, nil, errNoManager
}
