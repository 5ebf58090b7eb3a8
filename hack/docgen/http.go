package main

import (
	"strings"

	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// httpReference lists every endpoint of the agent's HTTP API from
// volumemanager.Endpoints, the table its handler registers through.
func httpReference() ([]byte, error) {
	d := newDoc("HTTP API reference", `
The agent serves one HTTP API in two places:

- the unix socket `+"`<root-dir>/"+volumemanager.SocketName+"`"+` (mode 0600, root only): every
  endpoint below, without credentials. `+"`csi-volmgr status`, `drivers` and `probe`"+` use it.
- `+"`--http-endpoint`"+` (TCP, default `+"`127.0.0.1:9809`"+`, empty disables it), with TLS: a
  certificate of `+"`--tls-cert-file`"+` or a self-signed one in `+"`<cert-dir>/csi-volmgr-serving.crt`"+`
  (plain HTTP only on a loopback address, with `+"`--http-endpoint-plaintext`"+`). The endpoints marked
  *open* are served to anyone; /metrics to anyone on a loopback address, elsewhere only to callers
  authorized for get on `+"`nodes/metrics`"+` of the agent's Node (as the kubelet's); those marked
  *authorized* only to a caller authenticated by a client certificate of `+"`--client-ca-file`"+` or a
  bearer token issued for `+"`--api-audiences`"+` (default `+"`csi-volmgr`"+`; TokenReview), and
  authorized by the API server (SubjectAccessReview of get, create or update — the method's verb —
  on `+"`nodes/csi-volmgr`"+` of the agent's Node; ClusterRoles
  `+"`deploy/base/rbac-api-reader.yaml`"+` for GET and `+"`deploy/base/rbac-runtime-api.yaml`"+` for
  POST and PUT, the runtime's alone):
  401 without a valid credential, 403 without the grant. Without an API server (`+"`--manifests`"+`)
  the TCP endpoint serves no authorized endpoint, and /metrics only on a loopback address.
  [The API and its access](../operations.md#the-api-and-its-access) says how to call it.

Endpoints marked *profiling* exist only with `+"`--profiling`"+`. How a runtime uses the pod
API: [runtimes](../runtimes.md).`)
	var rows [][]string
	for _, e := range volumemanager.Endpoints {
		method, path, ok := strings.Cut(e.Pattern, " ")
		if !ok {
			method, path = "any", e.Pattern
		}
		access := string(e.Access)
		if e.Profiling {
			access += ", profiling"
		}
		rows = append(rows, []string{method, code(path), access, e.Doc})
	}
	d.table([]string{"method", "path", "TCP access", "what"}, rows)
	return d.Bytes(), nil
}
