// Package k8stest runs a real kube-apiserver and etcd for integration tests,
// through controller-runtime's envtest, from binaries built from Go modules
// (make k8s-bins writes them to bin/k8s).
//
// One API server serves all tests of a test binary: TestMain calls Main, and
// each test calls New for its own namespace, node name and clients. Start
// runs further, independent environments, e.g. with other API server flags.
// Env.StopAPIServer and Env.StartAPIServer make an API server outage: etcd and
// the data stay, and the same clients work again once it is back.
package k8stest
