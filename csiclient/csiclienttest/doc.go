// Package csiclienttest helps test code that talks to CSI drivers. It serves
// CSI services on a real unix socket (StartServer), provides a minimal
// scripted in-process CSI driver to serve (Driver), and a scripted stand-in
// for *csiclient.Client (Client) for unit tests that need no gRPC at all.
package csiclienttest
