package volumemanager_test

import (
	"context"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/mount-utils"
	"sigs.k8s.io/yaml"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
	"github.com/csi-volmgr/csi-volmgr/volumemanager/apiauth"
)

// The ClusterRoles deploy/base documents for callers of the TCP endpoint's
// API: the reader's (get) and the runtime's word (create, update).
const (
	apiReaderRole  = "../deploy/base/rbac-api-reader.yaml"
	runtimeAPIRole = "../deploy/base/rbac-runtime-api.yaml"
)

// TestRuntimeAPINeedsCredentials runs the volume manager for a runtime
// (WaitForContainersStopped) with a TCP endpoint (TLS, its self-signed
// certificate) against a real API server, and tries the containers-stopped
// signal of a pod whose volume is published: over TCP without a token
// (401) and with the token of a ServiceAccount without the documented
// grant (403) nothing happens;
// with the grant (TokenReview and SubjectAccessReview by the API server)
// the API answers; once the pod is deleted, the signal over the root-only
// socket tears the volume down. The socket is 0600 and the agent's.
func TestRuntimeAPINeedsCredentials(t *testing.T) {
	f := k8stest.New(t)
	ctx := t.Context()
	f.CreateNode(t)
	tcp := freeAddress(t)
	var root string
	n := startClusterNode(t, f, func(c *volumemanager.Config) {
		c.RemoveTerminatingPods, c.WaitForContainersStopped = true, true
		c.HTTPEndpoint, c.Profiling = tcp, true
		root = c.RootDir
	})
	socket := volumemanager.SocketPath(root)
	fi, err := os.Lstat(socket)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o600 || st.Uid != 0 {
		t.Errorf("API socket %s: mode %v, owner %d; want a socket of mode 0600 owned by root", socket, fi.Mode(), st.Uid)
	}

	// The callers: a runtime's ServiceAccount bound to both documented
	// ClusterRoles, a reader bound to the read-only one, and one without
	// either.
	allowed, stranger := serviceAccountToken(t, f, "runtime"), serviceAccountToken(t, f, "stranger")
	reader := serviceAccountToken(t, f, "reader")
	bindRole(t, f, "runtime", apiReaderRole, "get")
	bindRole(t, f, "runtime", runtimeAPIRole, "create")
	bindRole(t, f, "reader", apiReaderRole, "get")

	pods := f.Client.CoreV1().Pods(f.Namespace)
	app, err := pods.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: f.Namespace},
		Spec: corev1.PodSpec{NodeName: f.NodeName,
			Containers: []corev1.Container{{Name: "c", Image: "i", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"},
			}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.vm.WaitForAttachAndMount(ctx, app); err != nil {
		t.Fatal(err)
	}
	target := n.vm.GetMountedVolumesForPod(app.UID)["data"].HostPath
	if target == "" {
		t.Fatalf("no host path of the pod's volume: %+v", n.vm.GetMountedVolumesForPod(app.UID))
	}
	stopped := "/api/v1/pods/" + f.Namespace + "/app/containers-stopped?uid=" + string(app.UID)
	tcpURL := "https://" + tcp
	tcpClient := tlsClient(t, selfSignedCA(t, root))

	// Open to anyone over TCP: the metrics and health checks.
	for _, p := range []string{"/metrics", "/healthz", "/readyz"} {
		if code := call(t, tcpClient, http.MethodGet, tcpURL+p, ""); code != http.StatusOK {
			t.Errorf("GET %s over TCP answered %d, want 200", p, code)
		}
	}
	// Not without credentials, and not without the grant: nothing happens.
	for _, tc := range []struct {
		who, token string
		want       int
	}{{"no token", "", http.StatusUnauthorized}, {"a bad token", "not-a-token", http.StatusUnauthorized}, {"a token without the grant", stranger, http.StatusForbidden}} {
		if code := call(t, tcpClient, http.MethodPost, tcpURL+stopped, tc.token); code != tc.want {
			t.Errorf("POST containers-stopped over TCP with %s answered %d, want %d", tc.who, code, tc.want)
		}
		// An empty running-pods report would release every held pod.
		if code := call(t, tcpClient, http.MethodPut, tcpURL+volumemanager.RunningPodsPath, tc.token); code != tc.want {
			t.Errorf("PUT running-pods over TCP with %s answered %d, want %d", tc.who, code, tc.want)
		}
		for _, p := range []string{volumemanager.PodsPath, "/debug/pprof/"} {
			if code := call(t, tcpClient, http.MethodGet, tcpURL+p, tc.token); code != tc.want {
				t.Errorf("GET %s over TCP with %s answered %d, want %d", p, tc.who, code, tc.want)
			}
		}
	}
	// The reader reads, and may not give the runtime's word.
	if code := call(t, tcpClient, http.MethodGet, tcpURL+volumemanager.PodsPath, reader); code != http.StatusOK {
		t.Errorf("GET %s over TCP with the reader's token answered %d, want 200", volumemanager.PodsPath, code)
	}
	for _, w := range []struct{ method, path string }{
		{http.MethodPost, stopped}, {http.MethodPost, volumemanager.RunningPodsBeginPath}, {http.MethodPut, volumemanager.RunningPodsPath},
	} {
		if code := call(t, tcpClient, w.method, tcpURL+w.path, reader); code != http.StatusForbidden {
			t.Errorf("%s %s over TCP with the reader's token answered %d, want 403", w.method, w.path, code)
		}
	}
	time.Sleep(3 * time.Second)
	if isMnt, err := mount.New("").IsMountPoint(target); err != nil || !isMnt {
		t.Fatalf("volume unmounted after refused signals (mount point %v, %v)", isMnt, err)
	}
	if slices.Contains(n.okCalls(t), "NodeUnpublishVolume") {
		t.Fatal("NodeUnpublishVolume after refused signals")
	}

	// With the grant, the API answers over TCP (get and create): the
	// signal for a live pod without volumes, which the agent refuses (409,
	// not 401 or 403: authorized).
	if code := call(t, tcpClient, http.MethodGet, tcpURL+volumemanager.PodsPath+"/"+f.Namespace+"/app", allowed); code != http.StatusOK {
		t.Errorf("GET the pod over TCP with the granted token answered %d, want 200", code)
	}
	other, err := pods.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: f.Namespace},
		Spec:       corev1.PodSpec{NodeName: f.NodeName, Containers: []corev1.Container{{Name: "c", Image: "i"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if code := call(t, tcpClient, http.MethodPost, tcpURL+"/api/v1/pods/"+f.Namespace+"/other/containers-stopped?uid="+string(other.UID), allowed); code != http.StatusConflict {
		t.Errorf("POST containers-stopped of a live pod over TCP with the granted token answered %d, want 409", code)
	}

	// Deleted gracefully: the volume stays until the runtime's signal,
	// which root gives on the socket without credentials.
	if err := pods.Delete(ctx, app.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	onSocket := unixClient(socket)
	// 409 until the agent's cache has the deletion, as a runtime that
	// saw it first finds: it asks again.
	var code int
	poll(t, "containers-stopped on the socket to be taken", func(context.Context) (bool, error) {
		code = call(t, onSocket, http.MethodPost, "http://csi-volmgr"+stopped, "")
		return code == http.StatusAccepted || code != http.StatusConflict, nil
	})
	if code != http.StatusAccepted {
		t.Fatalf("POST containers-stopped on the socket answered %d, want 202", code)
	}
	if err := n.vm.WaitForUnmount(ctx, app); err != nil {
		t.Fatal(err)
	}
	if isMnt, _ := mount.New("").IsMountPoint(target); isMnt {
		t.Errorf("target %s still mounted after the signal on the socket", target)
	}
}

// TestStandaloneServesNoAPIOverTCP: without an API server nobody can be
// authenticated, so the TCP endpoint (here plain HTTP on the loopback)
// serves no /api/ and no profiles; the socket serves them.
func TestStandaloneServesNoAPIOverTCP(t *testing.T) {
	n := startStandaloneWith(t, func(c *volumemanager.Config) {
		c.HTTPEndpoint, c.Profiling, c.HTTPAccess.Plaintext = freeAddress(t), true, true
	})
	tcpURL := "http://" + n.httpEndpoint
	for _, p := range []string{volumemanager.PodsPath, volumemanager.VolumesPath, "/debug/pprof/"} {
		if code := call(t, http.DefaultClient, http.MethodGet, tcpURL+p, ""); code != http.StatusNotFound {
			t.Errorf("GET %s over TCP answered %d, want 404", p, code)
		}
		if code := call(t, unixClient(volumemanager.SocketPath(n.root)), http.MethodGet, "http://csi-volmgr"+p, ""); code != http.StatusOK {
			t.Errorf("GET %s on the socket answered %d, want 200", p, code)
		}
	}
	if code := call(t, http.DefaultClient, http.MethodGet, tcpURL+"/readyz", ""); code != http.StatusOK {
		t.Errorf("GET /readyz over TCP answered %d, want 200", code)
	}
	n.stop()
	if _, err := os.Lstat(volumemanager.SocketPath(n.root)); err == nil {
		t.Error("the API socket is still there after the agent stopped")
	}
}

// freeAddress returns a loopback address whose port was free a moment ago.
func freeAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// unixClient returns a client whose every connection goes to socket.
func unixClient(socket string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}}
}

// call sends a request with the bearer token, if any, and returns the
// status code.
func call(t *testing.T, client *http.Client, method, url, token string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

// serviceAccountToken creates the ServiceAccount name in the fixture's
// namespace and returns a token of it for the agent's audience
// (csi-volmgr) from the TokenRequest API.
func serviceAccountToken(t *testing.T, f *k8stest.Fixture, name string) string {
	t.Helper()
	sas := f.Client.CoreV1().ServiceAccounts(f.Namespace)
	if _, err := sas.Create(t.Context(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return tokenFor(t, f, name, apiauth.DefaultAPIAudience)
}

// tokenFor returns a token of the ServiceAccount name for the audiences;
// none means the API server's own.
func tokenFor(t *testing.T, f *k8stest.Fixture, name string, audiences ...string) string {
	t.Helper()
	tr, err := f.Client.CoreV1().ServiceAccounts(f.Namespace).CreateToken(t.Context(), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: audiences}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// bindRole creates the ClusterRole of deploy/base's file under a name of
// the test and the ServiceAccount sa, binds it to sa and waits until the
// API server's authorizer allows sa verb on the agent's Node's
// nodes/csi-volmgr (the agent would cache a denial).
func bindRole(t *testing.T, f *k8stest.Fixture, sa, file, verb string) {
	t.Helper()
	ctx := t.Context()
	data, err := os.ReadFile(filepath.FromSlash(file))
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.Unmarshal(data, &role); err != nil {
		t.Fatal(err)
	}
	role.ObjectMeta = metav1.ObjectMeta{Name: f.Namespace + "-" + sa + "-" + role.Name}
	rbac := f.Client.RbacV1()
	if _, err := rbac.ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: f.Namespace, Name: sa}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.WithoutCancel(t.Context())
		_ = rbac.ClusterRoleBindings().Delete(ctx, role.Name, metav1.DeleteOptions{})
		_ = rbac.ClusterRoles().Delete(ctx, role.Name, metav1.DeleteOptions{})
	})
	user := "system:serviceaccount:" + f.Namespace + ":" + sa
	poll(t, "the API server to authorize "+user, func(ctx context.Context) (bool, error) {
		got, err := f.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:serviceaccounts", "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: verb, Resource: "nodes", Subresource: "csi-volmgr", Name: f.NodeName},
		}}, metav1.CreateOptions{})
		return err == nil && got.Status.Allowed, nil
	})
}
