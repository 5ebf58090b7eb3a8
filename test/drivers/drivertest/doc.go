// Package drivertest is what the driver matrix's tests (test/drivers/<name>, make drivers) share
// to run a stock CSI driver beside csi-volmgr: a Recorder that fills the driver's
// driverresult.Result step by step, an Applier that creates a driver's manifests from its module,
// a registrar standing in for node-driver-registrar, processes with logs, kubeconfigs.
package drivertest
