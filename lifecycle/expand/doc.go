// Package expand grows the file systems of volumes whose claims were
// resized, with NodeExpandVolume, and writes the claims' status as the
// kubelet does: in use (a claim resized while its pods run) and during
// the mount (a claim resized while no pod used it). See Expander.
//
// It runs in cluster mode only: the claim's status is the protocol with
// the external-resizer, and standalone mode has no API server to write it.
package expand
