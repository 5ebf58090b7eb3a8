// Package certmanager runs cert-manager's stock csi-driver (github.com/cert-manager/csi-driver,
// its own node plugin binary with its chart's flags) beside csi-volmgr, for the driver matrix of
// `make drivers` (docs/drivers.md).
//
// The driver serves only CSI inline volumes: for each pod it generates a key, creates a
// cert-manager CertificateRequest and, once it is signed, mounts the key pair into the pod. With
// its chart's useTokenRequest it creates the request with the pod's own service account token,
// which the volume manager mints (CSIDriver tokenRequests with the empty audience) and republishes
// (requiresRepublish). No cert-manager controller runs: the test approves and signs the requests
// with a CA of its own, as an issuer would.
//
// The test (build tag drivers) runs, on a real kube-apiserver with Node,RBAC authorization,
// NodeRestriction and an audit log, `csi-volmgr check --ephemeral --read-only` against the node
// plugin, then the agent's lifecycle as its Node, and records every step in a
// driverresult.Result, written to $DRIVERS_RESULTS/cert-manager.json when that variable is set.
package certmanager
