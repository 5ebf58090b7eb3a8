// Module mlog stands in for monis.app/mlog v0.0.2, which the module proxy here does not serve
// (the host monis.app is not on its allowlist). secrets-store-csi-driver's main uses only the
// calls below to set up klog; they keep klog's own text output.
module monis.app/mlog

go 1.22

require k8s.io/klog/v2 v2.120.1
