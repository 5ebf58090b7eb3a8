package agenttest

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	certutil "k8s.io/client-go/util/cert"

	"github.com/csi-volmgr/csi-volmgr/volumemanager"
	"github.com/csi-volmgr/csi-volmgr/volumemanager/servingcert"
)

// requestTimeout bounds one request to the agent's HTTP endpoint.
const requestTimeout = 10 * time.Second

// Paths of the agent's API. The API socket serves them all; the TCP
// --http-endpoint (TLS, the agent's self-signed certificate) serves the
// health checks and, on the loopback, the metrics to anyone and the JSON
// API only with credentials.
const (
	HealthzPath = "/healthz"
	ReadyzPath  = "/readyz"
	MetricsPath = "/metrics"
	VolumesPath = "/api/v1/volumes"
	DriversPath = "/api/v1/drivers"
)

// URL returns the URL of path on the agent's TCP endpoint.
func (a *Agent) URL(path string) string { return "https://" + a.HTTPEndpoint + path }

// Get asks the agent for path on its API socket, as root, and returns the
// HTTP status code and body.
func (a *Agent) Get(ctx context.Context, path string) (int, []byte, error) {
	return a.get(ctx, a.socketClient(), "http://csi-volmgr"+path)
}

// GetTCP asks the agent for path on its TCP endpoint, without credentials,
// trusting its self-signed certificate in <root-dir>/pki as
// --certificate-authority does.
func (a *Agent) GetTCP(ctx context.Context, path string) (int, []byte, error) {
	client, err := a.TCPClient()
	if err != nil {
		return 0, nil, err
	}
	defer client.CloseIdleConnections()
	return a.get(ctx, client, a.URL(path))
}

// TCPClient returns a client of the agent's TCP endpoint that trusts its
// self-signed certificate in <root-dir>/pki, as --certificate-authority
// does.
func (a *Agent) TCPClient() (*http.Client, error) {
	roots, err := certutil.NewPool(filepath.Join(a.RootDir, "pki", servingcert.CertFileName))
	if err != nil {
		return nil, fmt.Errorf("the agent's serving certificate: %w", err)
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}}, nil
}

// socketClient returns a client whose every connection goes to the API
// socket.
func (a *Agent) socketClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", a.SocketPath)
		},
	}}
}

func (a *Agent) get(ctx context.Context, client *http.Client, url string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("GET %s: %w", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, nil, fmt.Errorf("GET %s: %w", url, err)
	}
	return resp.StatusCode, body, nil
}

// getJSON asks for path and decodes a 200 answer into v.
func (a *Agent) getJSON(ctx context.Context, path string, v any) error {
	code, body, err := a.Get(ctx, path)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("GET %s: status %d: %s", path, code, bytes.TrimSpace(body))
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("GET %s: decode: %w", path, err)
	}
	return nil
}

// Volumes returns the agent's volumes from its JSON status API.
func (a *Agent) Volumes(ctx context.Context) ([]volumemanager.VolumeStatus, error) {
	var vols []volumemanager.VolumeStatus
	return vols, a.getJSON(ctx, VolumesPath, &vols)
}

// Drivers returns the agent's registered drivers from its JSON status API.
func (a *Agent) Drivers(ctx context.Context) ([]volumemanager.DriverStatus, error) {
	var drivers []volumemanager.DriverStatus
	return drivers, a.getJSON(ctx, DriversPath, &drivers)
}

// StatusCommand runs `csi-volmgr status -o json --root-dir <root>`, the client a user runs on
// the node (it talks to the API socket of the root directory), and decodes its output.
func (a *Agent) StatusCommand(ctx context.Context) ([]volumemanager.VolumeStatus, error) {
	var vols []volumemanager.VolumeStatus
	return vols, a.runClient(ctx, "status", &vols)
}

// DriversCommand runs `csi-volmgr drivers -o json --root-dir <root>` and decodes its output.
func (a *Agent) DriversCommand(ctx context.Context) ([]volumemanager.DriverStatus, error) {
	var drivers []volumemanager.DriverStatus
	return drivers, a.runClient(ctx, "drivers", &drivers)
}

// runClient runs a client command of the binary against the agent with -o json and decodes
// its standard output into v.
func (a *Agent) runClient(ctx context.Context, command string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, a.binary, command, "-o", "json", "--root-dir", a.RootDir)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("csi-volmgr %s: %w: %s", command, err, bytes.TrimSpace(stderr.Bytes()))
	}
	if err := json.Unmarshal(stdout.Bytes(), v); err != nil {
		return fmt.Errorf("csi-volmgr %s -o json printed something else than JSON: %w:\n%s", command, err, stdout.Bytes())
	}
	return nil
}

// Metrics scrapes /metrics and parses the text exposition.
func (a *Agent) Metrics(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	code, body, err := a.Get(ctx, MetricsPath)
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("GET %s: status %d", MetricsPath, code)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", MetricsPath, err)
	}
	return families, nil
}

// WaitForVolumes asks the status API until done returns true for the volumes, and returns them.
// Errors (e.g. while the agent restarts) count as not done. It fails when ctx ends first,
// returning the volumes it saw last.
func (a *Agent) WaitForVolumes(ctx context.Context, done func([]volumemanager.VolumeStatus) bool) ([]volumemanager.VolumeStatus, error) {
	var last []volumemanager.VolumeStatus
	var lastErr error
	err := pollUntil(ctx, func(ctx context.Context) (bool, error) {
		vols, err := a.Volumes(ctx)
		if err != nil {
			lastErr = err
			return false, nil
		}
		last, lastErr = vols, nil
		return done(vols), nil
	})
	if err != nil && lastErr != nil {
		err = fmt.Errorf("%w (last error: %w)", err, lastErr)
	}
	return last, err
}

// WaitReady waits until /readyz answers 200.
func (a *Agent) WaitReady(ctx context.Context) error {
	return pollUntil(ctx, func(ctx context.Context) (bool, error) {
		code, _, err := a.Get(ctx, ReadyzPath)
		return err == nil && code == http.StatusOK, nil
	})
}

// pollUntil calls cond every pollInterval until it returns true or an error, or ctx ends.
func pollUntil(ctx context.Context, cond func(context.Context) (bool, error)) error {
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for {
		ok, err := cond(ctx)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the agent: %w", ctx.Err())
		case <-t.C:
		}
	}
}
