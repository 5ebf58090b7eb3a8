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
- `+"`--http-endpoint`"+` (TCP, default `+"`127.0.0.1:9809`"+`, empty disables it): the endpoints
  marked *open* to anyone; those marked *authorized* only to a bearer token that the API server
  authenticates (TokenReview) and authorizes (SubjectAccessReview of get, create or update — the
  method's verb — on `+"`nodes/csi-volmgr`"+` of the agent's Node; ClusterRoles
  `+"`deploy/base/rbac-api-reader.yaml`"+` for GET and `+"`deploy/base/rbac-runtime-api.yaml`"+` for
  POST and PUT, the runtime's alone): 401 without a valid token, 403 without the grant.
  Without an API server (`+"`--manifests`"+`) the TCP endpoint serves no authorized endpoint.

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
