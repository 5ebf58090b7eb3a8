package kubeletvm

import (
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/volume"
	"k8s.io/kubernetes/pkg/volume/configmap"
	"k8s.io/kubernetes/pkg/volume/csi"
	"k8s.io/kubernetes/pkg/volume/downwardapi"
	"k8s.io/kubernetes/pkg/volume/emptydir"
	"k8s.io/kubernetes/pkg/volume/fc"
	"k8s.io/kubernetes/pkg/volume/git_repo"
	"k8s.io/kubernetes/pkg/volume/hostpath"
	"k8s.io/kubernetes/pkg/volume/image"
	"k8s.io/kubernetes/pkg/volume/iscsi"
	"k8s.io/kubernetes/pkg/volume/local"
	"k8s.io/kubernetes/pkg/volume/nfs"
	"k8s.io/kubernetes/pkg/volume/projected"
	"k8s.io/kubernetes/pkg/volume/secret"
)

// probeVolumePlugins is the kubelet's list of volume plugins, in its order
// (cmd/kubelet/app/plugins.go ProbeVolumePlugins, which lives in a package
// main-only code imports): the volume plugin manager asks each of them
// whether it supports a volume, so all of them are here, not only CSI. The
// flexvolume prober (GetDynamicPluginProber) is left out: it watches the
// kubelet's flexvolume directory, which has nothing in it here.
func probeVolumePlugins() []volume.VolumePlugin {
	var all []volume.VolumePlugin
	all = append(all, emptydir.ProbeVolumePlugins()...)
	all = append(all, git_repo.ProbeVolumePlugins()...)
	all = append(all, hostpath.ProbeVolumePlugins(volume.VolumeConfig{})...)
	all = append(all, nfs.ProbeVolumePlugins(volume.VolumeConfig{})...)
	all = append(all, secret.ProbeVolumePlugins()...)
	all = append(all, iscsi.ProbeVolumePlugins()...)
	all = append(all, downwardapi.ProbeVolumePlugins()...)
	all = append(all, fc.ProbeVolumePlugins()...)
	all = append(all, configmap.ProbeVolumePlugins()...)
	all = append(all, projected.ProbeVolumePlugins()...)
	all = append(all, local.ProbeVolumePlugins()...)
	all = append(all, csi.ProbeVolumePlugins()...)
	if utilfeature.DefaultFeatureGate.Enabled(features.ImageVolume) {
		all = append(all, image.ProbeVolumePlugins()...)
	}
	return all
}
