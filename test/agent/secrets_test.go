package agent_test

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/test/plugin"
)

// tokenAudience is the audience of the service account token the test's
// CSIDriver asks for.
const tokenAudience = "csi-volmgr-secrets-test"

// TestNoSecretsInVerboseLog runs the real agent at -v=10 (client-go logs
// request and response bodies, csi-lib-utils logs every CSI message)
// through a volume with a node-stage Secret, a node-publish Secret and a
// service account token in volume_context, calls its TCP API with a
// made-up bearer token and with a real service account token (each sent
// to the API server in a TokenReview), and searches its whole log for any
// of them: raw, base64-encoded and inside the hex dumps client-go writes
// for binary bodies.
func TestNoSecretsInVerboseLog(t *testing.T) {
	t.Parallel()
	n := newNode(t, nodeOptions{verbosity: 10})
	ctx := t.Context()
	c := n.f.Client
	// The driver asks for a token of the pod's service account in
	// volume_context (not in the secrets field, which protosanitizer
	// strips), and for the pod's info.
	d, err := c.StorageV1().CSIDrivers().Get(ctx, n.driver, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d.Spec.TokenRequests = []storagev1.TokenRequest{{Audience: tokenAudience}}
	d.Spec.PodInfoOnMount = ptr.To(true)
	if _, err := c.StorageV1().CSIDrivers().Update(ctx, d, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	stageValue, publishValue := "stage-s3cr3t-"+utilrand.String(12), "publish-s3cr3t-"+utilrand.String(12)
	for name, value := range map[string]string{"stage-creds": stageValue, "publish-creds": publishValue} {
		_, err := c.CoreV1().Secrets(n.f.Namespace).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: n.f.Namespace},
			Data:       map[string][]byte{"password": []byte(value)},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.CoreV1().ServiceAccounts(n.f.Namespace).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: n.f.Namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	n.startAgent(t)
	vol := n.createClaimedVolumeWith(t, "data", func(pv *corev1.PersistentVolume) {
		pv.Spec.CSI.NodeStageSecretRef = &corev1.SecretReference{Namespace: n.f.Namespace, Name: "stage-creds"}
		pv.Spec.CSI.NodePublishSecretRef = &corev1.SecretReference{Namespace: n.f.Namespace, Name: "publish-creds"}
	})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: n.f.Namespace, Name: "app"},
		Spec: corev1.PodSpec{
			NodeName: n.f.NodeName, ServiceAccountName: "app",
			Containers: []corev1.Container{{Name: "c", Image: "busybox", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: vol.claim}}}},
		},
	}
	pod, err = c.CoreV1().Pods(n.f.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.waitVolumesReady(t, pod, corev1.ConditionTrue)

	// The token the driver got: the secret the log must not hold.
	var token string
	for _, e := range journalEntries(t, n) {
		if e.Method != "NodePublishVolume" || e.Event != plugin.EventBegin {
			continue
		}
		var tokens map[string]authenticationv1.TokenRequestStatus
		if err := json.Unmarshal([]byte(e.VolumeContext["csi.storage.k8s.io/serviceAccount.tokens"]), &tokens); err != nil {
			t.Fatalf("the driver's volume_context holds no tokens: %v (%v)", err, e.VolumeContext)
		}
		token = tokens[tokenAudience].Token
	}
	if len(token) < 20 {
		t.Fatalf("no service account token reached the driver (%q); the test proves nothing", token)
	}

	// Callers of the TCP API: their tokens go to the API server in
	// TokenReviews, whose bodies client-go logs at -v>=8.
	made := "caller-s3cr3t-" + utilrand.String(24)
	tr, err := c.CoreV1().ServiceAccounts(n.f.Namespace).CreateToken(ctx, "app", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{"csi-volmgr"}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	callerToken := tr.Status.Token
	tcp, err := n.agent.TCPClient()
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.CloseIdleConnections()
	for _, bearer := range []string{made, callerToken} {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, n.agent.URL("/api/v1/pods"), nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+bearer)
		resp, err := tcp.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusForbidden {
			t.Errorf("GET /api/v1/pods over TCP with a token the agent may not grant answered %d, want 401 or 403", resp.StatusCode)
		}
	}

	n.deletePod(t, pod)
	n.waitJournal(t, "unstage", func(calls []plugin.Call) bool {
		return len(succeeded(callsOf(calls, "NodeUnstageVolume", ""))) == 1
	})
	if err := n.agent.Stop(); err != nil {
		t.Fatal(err)
	}
	log, err := os.ReadFile(n.agent.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	// The log is as verbose as promised: bodies of other responses are there.
	if !bytes.Contains(log, []byte("Response Body")) || !bytes.Contains(log, []byte("GRPC call")) {
		t.Fatal("the -v=10 log holds no response bodies or CSI calls; the test proves nothing")
	}
	if !bytes.Contains(log, []byte("tokenreviews")) || !bytes.Contains(log, []byte("subjectaccessreviews")) {
		t.Fatal("the -v=10 log holds no TokenReview or SubjectAccessReview request; the TCP API callers prove nothing")
	}
	secrets := map[string]string{"node-stage Secret": stageValue, "node-publish Secret": publishValue, "service account token": token,
		"made-up caller token": made, "caller's service account token": callerToken}
	for what, value := range secrets {
		forms := map[string][]byte{
			"raw":        []byte(value),
			"base64":     []byte(base64.StdEncoding.EncodeToString([]byte(value))),
			"base64 url": []byte(base64.RawURLEncoding.EncodeToString([]byte(value))),
		}
		for form, b := range forms {
			if i := bytes.Index(log, b); i >= 0 {
				t.Errorf("the %s is in the agent's log (%s) at byte %d: %q", what, form, i, excerpt(log, i))
			}
		}
		for _, dump := range hexDumps(log) {
			if bytes.Contains(dump, []byte(value)) {
				t.Errorf("the %s is in a hex dump of a body in the agent's log", what)
			}
		}
	}
	if !bytes.Contains(log, []byte(`csi.storage.k8s.io/serviceAccount.tokens":"***stripped***"`)) &&
		!bytes.Contains(log, []byte(`csi.storage.k8s.io/serviceAccount.tokens\":\"***stripped***\"`)) {
		t.Error("the NodePublishVolume request in the log does not show the token key stripped")
	}
}

// journalEntries reads the plugin's journal.
func journalEntries(t *testing.T, n *node) []plugin.Entry {
	t.Helper()
	entries, err := n.plugin.ReadJournal()
	if err != nil {
		t.Fatal(err)
	}
	return entries
}

// hexLine is one line of a hex.Dump, as klog writes a multi-line value:
// an offset, up to 16 bytes in hex, the printable form.
var hexLine = regexp.MustCompile(`^\s*[0-9a-f]{8}\s{2}((?:[0-9a-f]{2}\s{1,2}){1,16})`)

// hexDumps decodes every hex dump in log (client-go dumps bodies that are
// not printable, e.g. protobuf), one byte slice per dump.
func hexDumps(log []byte) [][]byte {
	var out [][]byte
	var cur []byte
	s := bufio.NewScanner(bytes.NewReader(log))
	s.Buffer(make([]byte, 1<<20), 64<<20)
	for s.Scan() {
		// klog may quote a multi-line value into one line with \n escapes.
		for _, line := range strings.Split(s.Text(), `\n`) {
			m := hexLine.FindStringSubmatch(line)
			if m == nil {
				if len(cur) > 0 {
					out, cur = append(out, cur), nil
				}
				continue
			}
			b, err := hex.DecodeString(strings.Join(strings.Fields(m[1]), ""))
			if err == nil {
				cur = append(cur, b...)
			}
		}
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// excerpt is the log around byte i, for a failure message.
func excerpt(log []byte, i int) []byte {
	return log[max(0, i-120):min(len(log), i+60)]
}
