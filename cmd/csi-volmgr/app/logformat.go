package app

// JSON logs (--logging-format=json), as the kubernetes-csi sidecars and the
// kubelet offer them: component-base's JSON format registers itself.
import _ "k8s.io/component-base/logs/json/register"
