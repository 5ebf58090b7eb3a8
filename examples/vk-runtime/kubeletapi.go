package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strconv"
	"time"

	certutil "k8s.io/client-go/util/cert"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/volumemanager/vkubelet"
)

// serveKubeletAPI serves the kubelet API's stats summary (/stats/summary)
// over HTTPS at --internal-ip:--kubelet-port, the Node's kubelet endpoint,
// until ctx ends: the API server's node proxy (kubectl get --raw
// /api/v1/nodes/NODE/proxy/stats/summary) and metrics pipelines read it
// there. The certificate is self-signed, made at start: the API server
// checks a kubelet's serving certificate only when told to
// (--kubelet-certificate-authority). A test runtime: no authentication.
//
// A provider would mount virtual-kubelet's node/api routes
// (api.PodHandlerConfig.GetStatsSummary takes vkubelet.WithVolumeStats
// as it is); that package brings k8s.io/apiserver into the module, whose
// test dependencies make `go mod tidy` fail on an ambiguous genproto
// import, so the example serves its one route itself, as
// api.HandlePodStatsSummary does.
func serveKubeletAPI(ctx context.Context, o options, summary vkubelet.SummaryFunc) error {
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey(o.nodeName, []net.IP{net.ParseIP(o.internalIP)}, nil)
	if err != nil {
		return err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Addr:              net.JoinHostPort(o.internalIP, strconv.Itoa(o.kubeletPort)),
		Handler:           statsSummaryHandler(summary),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	klog.FromContext(ctx).Info("Serving the kubelet API's stats summary", "address", srv.Addr)
	if err := srv.ListenAndServeTLS("", ""); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// statsSummaryHandler serves GET /stats/summary with summary's answer.
func statsSummaryHandler(summary vkubelet.SummaryFunc) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /stats/summary", func(w http.ResponseWriter, r *http.Request) {
		s, err := summary(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s)
	})
	return mux
}
