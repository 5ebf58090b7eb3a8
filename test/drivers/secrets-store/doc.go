// Package secretsstore runs the stock secrets-store-csi-driver (sigs.k8s.io/secrets-store-csi-driver,
// its own node plugin binary with its production flags) beside csi-volmgr, for the driver matrix of
// `make drivers` (docs/drivers.md).
//
// The driver stands in the matrix for the ephemeral-inline drivers that the kubelet feeds with pod
// information and service account tokens: its CSIDriver has podInfoOnMount, volumeLifecycleModes
// Ephemeral only, requiresRepublish and (here, as its chart's tokenRequests value sets it) a
// tokenRequests audience. It talks to the API server itself (SecretProviderClass,
// SecretProviderClassPodStatus, the pods of its node) and to a provider over a unix socket.
//
// The test (build tag drivers) runs, on a real kube-apiserver with Node,RBAC authorization and
// NodeRestriction:
//
//   - `csi-volmgr check --driver-command ...` against the node plugin;
//   - the agent's lifecycle as its Node (`--node-identity --register-node`): a SecretProviderClass
//     and a pod with an inline volume of the driver on the agent's Node, VolumesReady, the
//     provider's files read through the pod's path, the driver's SecretProviderClassPodStatus, the
//     service account token the agent minted (its audience checked by a TokenReview, never in the
//     agent's log), the periodic republish rotating the files, the node plugin SIGKILLed and
//     restarted while published, the pod deleted and everything torn down;
//
// and records every step in a driverresult.Result, written to $DRIVERS_RESULTS/secrets-store.json
// when that variable is set.
//
// The binaries come from the build-only module tools/ (make drivers-bins-secrets-store), into
// bin/drivers/secrets-store/: the driver, and secrets-store-e2e-provider, a provider that serves the
// driver's provider API and records what each Mount received.
package secretsstore
