package volumemanager_test

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// TestRegisterNodeServesProbesThroughAnAPIServerOutage: the agent starts
// with RegisterNode while its API server is unreachable (nothing listens
// on the address its client has). The API socket answers at once, as the
// exec probes ask it: /livez and /healthz pass — waiting for the API
// server is no reason to restart — and /readyz fails saying the Node is
// not registered yet and why. Once the API server is reachable, the agent
// registers its Node and /readyz passes.
func TestRegisterNodeServesProbesThroughAnAPIServerOutage(t *testing.T) {
	f := k8stest.New(t)
	t.Cleanup(func() {
		_ = f.Client.CoreV1().Nodes().Delete(context.WithoutCancel(t.Context()), f.NodeName, metav1.DeleteOptions{})
	})
	apiServer, err := url.Parse(f.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	// The agent's API server address: nothing listens there until the
	// proxy to the real one starts on it.
	addr := freeAddress(t)
	cfg := *f.Config
	cfg.Host = "https://" + addr
	client, err := kubernetes.NewForConfig(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	n := startClusterNode(t, f, func(c *volumemanager.Config) {
		registerNodeFast(c)
		c.KubeClient = client
	})

	onSocket := unixClient(volumemanager.SocketPath(n.root))
	get := func(path string) (int, string, error) {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://csi-volmgr"+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := onSocket.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), err
	}

	// The socket answers while the Node cannot be registered, and /readyz
	// says why once a try failed.
	var code int
	var body string
	var getErr error
	err = wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		code, body, getErr = get("/readyz")
		return getErr == nil && strings.Contains(body, "refused"), nil
	})
	if err != nil {
		t.Fatalf("/readyz on the API socket while the API server is unreachable: %d %q (%v); "+
			"want 503 saying the Node is not registered yet and why", code, body, getErr)
	}
	if want := "node " + f.NodeName + " not registered yet"; code != http.StatusServiceUnavailable || !strings.Contains(body, want) {
		t.Errorf("/readyz while the API server is unreachable: %d %q, want 503 saying %q", code, body, want)
	}
	for _, path := range []string{volumemanager.LivezPath, volumemanager.HealthzPath} {
		if code, body, err := get(path + "?verbose"); err != nil || code != http.StatusOK {
			t.Errorf("%s while the agent waits for the API server: %d %q (%v), want 200", path, code, body, err)
		}
	}
	// The node's pods are not listed yet: a runtime's containers-stopped
	// is not taken (a live pod not read yet would look gone), but asked
	// again later.
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://csi-volmgr"+volumemanager.PodsPath+"/ns/app/containers-stopped?uid=u-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := onSocket.Do(req); err != nil {
		t.Errorf("containers-stopped while the agent waits for the API server: %v", err)
	} else {
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
			t.Errorf("containers-stopped before the node's pods were listed: %d (Retry-After %q), want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	}
	if _, err := f.Client.CoreV1().Nodes().Get(t.Context(), f.NodeName, metav1.GetOptions{}); err == nil {
		t.Fatal("the Node exists before its API server was reachable")
	}

	// The API server becomes reachable: the agent registers its Node and
	// becomes ready.
	startProxyOn(t, addr, apiServer.Host)
	err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, standaloneTimeout, true, func(context.Context) (bool, error) {
		code, body, getErr = get("/readyz")
		return getErr == nil && code == http.StatusOK, nil
	})
	if err != nil {
		t.Fatalf("/readyz after the API server became reachable: %d %q (%v), want 200", code, body, getErr)
	}
	node, err := f.Client.CoreV1().Nodes().Get(t.Context(), f.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if node.Labels[volumemanager.OwnerLabel] != volumemanager.OwnerLabelValue {
		t.Errorf("registered Node's labels %v lack %s=%s", node.Labels, volumemanager.OwnerLabel, volumemanager.OwnerLabelValue)
	}
}
