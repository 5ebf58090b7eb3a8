package deploy_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	certutil "k8s.io/client-go/util/cert"

	"github.com/csi-volmgr/csi-volmgr/volumemanager"
	"github.com/csi-volmgr/csi-volmgr/volumemanager/servingcert"
)

// runtimeAPIRoleName is the ClusterRole deploy/base documents for readers
// of the agent's TCP API (get on nodes/csi-volmgr); the runtime's word
// (create, update) is csi-volmgr-runtime-api's.
const runtimeAPIRoleName = "csi-volmgr-api-reader"

var (
	runtimeAPIRoleMu    sync.Mutex
	runtimeAPIRoleRules []rbacv1.PolicyRule
)

// runtimeAPIRules returns the rules of the ClusterRole csi-volmgr-api-reader
// as deploy/base renders it, rendered once per test binary.
func runtimeAPIRules(tb testing.TB) []rbacv1.PolicyRule {
	tb.Helper()
	runtimeAPIRoleMu.Lock()
	defer runtimeAPIRoleMu.Unlock()
	if runtimeAPIRoleRules == nil {
		role := convert[rbacv1.ClusterRole](tb, find(tb, render(tb, "base"), "ClusterRole", "", runtimeAPIRoleName))
		runtimeAPIRoleRules = role.Rules
	}
	return runtimeAPIRoleRules
}

// runtimeAPIAnswers asks the agent's TCP endpoint (TLS, the agent's
// self-signed certificate from its <root-dir>/pki as the CA) for its
// volumes as a runtime beside it would: without a token the answer is 401;
// with a token of a ServiceAccount bound to csi-volmgr-api-reader, which
// the agent reviews with the API server (TokenReview, SubjectAccessReview,
// as its Node: rights of every node, no RBAC), the answer is 401 for the
// API server's audience and lists the pod's volume for csi-volmgr's, and a
// running-pods report with it is refused (403): reading does not give the
// runtime's word.
func (s *scenario) runtimeAPIAnswers(ctx context.Context) error {
	t, c, ns := s.t, s.f.Client, s.f.Namespace
	url := "https://" + s.agent.HTTPEndpoint + volumemanager.VolumesPath
	roots, err := certutil.NewPool(filepath.Join(s.agent.Root, "pki", servingcert.CertFileName))
	if err != nil {
		return fmt.Errorf("the agent's self-signed certificate: %w", err)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	code, body, err := get(ctx, client, url, "")
	if err != nil {
		return err
	}
	if code != http.StatusUnauthorized {
		return fmt.Errorf("GET %s without a token answered %d %q, want 401", url, code, body)
	}

	sa, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "runtime"}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating the runtime's ServiceAccount: %w", err)
	}
	name := ns + "-" + runtimeAPIRoleName
	rbac := c.RbacV1()
	if _, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: runtimeAPIRules(t)}, metav1.CreateOptions{}); err != nil {
		return err
	}
	t.Cleanup(func() { ignoreNotFound(t, rbac.ClusterRoles().Delete(cleanupContext(t), name, metav1.DeleteOptions{})) })
	if _, err := rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa.Name}},
	}, metav1.CreateOptions{}); err != nil {
		return err
	}
	t.Cleanup(func() {
		ignoreNotFound(t, rbac.ClusterRoleBindings().Delete(cleanupContext(t), name, metav1.DeleteOptions{}))
	})
	// The agent caches a denial for 30 s: ask it only once the API server
	// itself allows the access.
	user := "system:serviceaccount:" + ns + ":" + sa.Name
	if err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
		got, err := c.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "get", Resource: "nodes", Subresource: "csi-volmgr", Name: s.Node},
		}}, metav1.CreateOptions{})
		return err == nil && got.Status.Allowed, nil
	}); err != nil {
		return fmt.Errorf("waiting for the API server to authorize %s on nodes/csi-volmgr: %w", user, err)
	}
	apiToken, err := c.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa.Name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating the runtime's token: %w", err)
	}
	if code, body, err := get(ctx, client, url, apiToken.Status.Token); err != nil {
		return err
	} else if code != http.StatusUnauthorized {
		return fmt.Errorf("GET %s with a token for the API server's audience answered %d %q, want 401", url, code, body)
	}
	token, err := c.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa.Name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{"csi-volmgr"}},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating the runtime's token: %w", err)
	}
	return s.eventually(ctx, func(ctx context.Context) error {
		code, body, err := get(ctx, client, url, token.Status.Token)
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("GET %s with the runtime's token answered %d: %s", url, code, body)
		}
		var vols []volumemanager.VolumeStatus
		if err := json.Unmarshal([]byte(body), &vols); err != nil {
			return err
		}
		if len(vols) != 1 || vols[0].Handle != s.Handle {
			return fmt.Errorf("GET %s listed %+v, want the volume %s", url, vols, s.Handle)
		}
		put := "https://" + s.agent.HTTPEndpoint + volumemanager.RunningPodsPath
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, put, strings.NewReader(`{"mark": "x.0", "uids": []}`))
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+token.Status.Token)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			return fmt.Errorf("PUT %s with the reader's token answered %d, want 403", put, resp.StatusCode)
		}
		return nil
	})
}

// get asks url with client and the bearer token, if any, and returns the
// status code and the body.
func get(ctx context.Context, client *http.Client, url, token string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(body)), err
}
