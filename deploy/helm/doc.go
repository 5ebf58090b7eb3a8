// Package helm holds the tests of the Helm chart csi-volmgr/ (deploy/base as
// a chart): helm lint and helm template through Helm's Go SDK with the
// default values and with every option set, a server-side dry-run of the
// rendered objects on a real kube-apiserver, and the proof that the chart
// with its default values renders the objects of deploy/base. The package
// has no code of its own; `make test-helm` runs its tests.
package helm
