package app

import (
	// JSON logs (--logging-format=json), as the kubernetes-csi sidecars and
	// the kubelet offer them: component-base's JSON format registers itself.
	_ "k8s.io/component-base/logs/json/register"
)
