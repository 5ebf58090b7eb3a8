// Command secrets-store-e2e-provider is a secrets-store-csi-driver provider for the driver matrix
// (make drivers): it serves the driver's provider API (sigs.k8s.io/secrets-store-csi-driver
// provider/v1alpha1, the API every real provider serves) on <provider-volume>/<name>.sock, as a
// provider DaemonSet does, and answers Mount with the files its SecretProviderClass names.
//
// The driver's own test provider (test/e2eprovider) is a module of its own that the module proxy
// does not serve, and provider/fake of the driver's module records nothing; this one records what
// each Mount received so that the test can check it: one JSON line per call in --record (mode
// 0600), with the service account tokens the driver passed on (the test needs them to verify their
// audience and to look for them in the logs; they are short-lived tokens of a throw-away cluster).
//
// SecretProviderClass parameters it reads:
//
//	files: a JSON object {"relative/path": "contents", ...}: the files of the volume.
//
// Every Mount adds the file "pod-name" with the pod's name from the volume context (the driver's
// CSIDriver has podInfoOnMount), and reports each file as an object at version "v<n>", n counting
// the Mount calls, so that a republish shows in the SecretProviderClassPodStatus.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"sort"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"sigs.k8s.io/secrets-store-csi-driver/provider/v1alpha1"
)

const (
	podNameKey = "csi.storage.k8s.io/pod.name"
	tokensKey  = "csi.storage.k8s.io/serviceAccount.tokens"
)

// Record is one Mount call, as written to --record.
type Record struct {
	Time       time.Time `json:"time"`
	Pod        string    `json:"pod"`
	Namespace  string    `json:"namespace"`
	PodUID     string    `json:"podUID"`
	TargetPath string    `json:"targetPath"`
	// Tokens is the value of csi.storage.k8s.io/serviceAccount.tokens, as the driver passed it.
	Tokens string `json:"tokens,omitempty"`
	Files  int    `json:"files"`
}

type server struct {
	v1alpha1.UnimplementedCSIDriverProviderServer
	record string
	mu     sync.Mutex
	mounts int
}

func (s *server) Version(context.Context, *v1alpha1.VersionRequest) (*v1alpha1.VersionResponse, error) {
	return &v1alpha1.VersionResponse{Version: "v1alpha1", RuntimeName: "secrets-store-e2e-provider", RuntimeVersion: "0.1.0"}, nil
}

func (s *server) Mount(_ context.Context, req *v1alpha1.MountRequest) (*v1alpha1.MountResponse, error) {
	var attrs map[string]string
	if err := json.Unmarshal([]byte(req.GetAttributes()), &attrs); err != nil {
		return nil, fmt.Errorf("attributes: %w", err)
	}
	var perm os.FileMode
	if err := json.Unmarshal([]byte(req.GetPermission()), &perm); err != nil {
		return nil, fmt.Errorf("permission: %w", err)
	}
	files := map[string]string{}
	if f := attrs["files"]; f != "" {
		if err := json.Unmarshal([]byte(f), &files); err != nil {
			return nil, fmt.Errorf("parameter files: %w", err)
		}
	}
	if attrs[podNameKey] == "" {
		return nil, errors.New("no pod name in the volume context: is podInfoOnMount set in the CSIDriver?")
	}
	files["pod-name"] = attrs[podNameKey]

	s.mu.Lock()
	defer s.mu.Unlock()
	s.mounts++
	version := fmt.Sprintf("v%d", s.mounts)
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	resp := &v1alpha1.MountResponse{}
	for _, name := range names {
		resp.Files = append(resp.Files, &v1alpha1.File{Path: name, Mode: int32(perm), Contents: []byte(files[name])})
		resp.ObjectVersion = append(resp.ObjectVersion, &v1alpha1.ObjectVersion{Id: name, Version: version})
	}
	rec := Record{Time: time.Now().UTC(), Pod: attrs[podNameKey], Namespace: attrs["csi.storage.k8s.io/pod.namespace"],
		PodUID: attrs["csi.storage.k8s.io/pod.uid"], TargetPath: req.GetTargetPath(), Tokens: attrs[tokensKey], Files: len(files)}
	if err := s.append(rec); err != nil {
		return nil, err
	}
	return resp, nil
}

func (s *server) append(rec Record) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(s.record, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func main() {
	endpoint := flag.String("endpoint", "", "unix socket to serve the provider API on: <the driver's --provider-volume>/<provider name>.sock")
	record := flag.String("record", "", "file to append one JSON line per Mount call to")
	flag.Parse()
	if *endpoint == "" || *record == "" {
		fmt.Fprintln(os.Stderr, "--endpoint and --record are required")
		os.Exit(2)
	}
	if err := os.Remove(*endpoint); err != nil && !errors.Is(err, os.ErrNotExist) {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	l, err := net.Listen("unix", *endpoint)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	g := grpc.NewServer()
	v1alpha1.RegisterCSIDriverProviderServer(g, &server{record: *record})
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sig
		g.GracefulStop()
	}()
	fmt.Fprintln(os.Stderr, "serving the provider API on", *endpoint)
	if err := g.Serve(l); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
