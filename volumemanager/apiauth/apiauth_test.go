package apiauth_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/csi-volmgr/csi-volmgr/volumemanager/apiauth"
)

// TestAttributes maps each method to its verb on nodes/csi-volmgr of the
// node, as the kubelet maps its requests to nodes/proxy, and refuses a
// method without a verb.
func TestAttributes(t *testing.T) {
	u := &user.DefaultInfo{Name: "runtime"}
	for method, want := range map[string]string{
		http.MethodGet: "get", http.MethodHead: "get", http.MethodPost: "create",
		http.MethodPut: "update", http.MethodPatch: "patch", http.MethodDelete: "delete",
		http.MethodOptions: "", "PROPFIND": "",
	} {
		attrs, ok := apiauth.Attributes(u, httptest.NewRequest(method, "/api/v1/pods", nil), "node-a")
		if ok != (want != "") {
			t.Errorf("%s: ok = %v", method, ok)
			continue
		}
		if !ok {
			continue
		}
		if attrs.Verb != want || attrs.Resource != "nodes" || attrs.Subresource != "csi-volmgr" || attrs.Name != "node-a" ||
			attrs.APIGroup != "" || !attrs.ResourceRequest || attrs.Namespace != "" || attrs.User != u || attrs.Path != "/api/v1/pods" {
			t.Errorf("%s: attributes %+v, want verb %s on nodes/csi-volmgr node-a", method, attrs, want)
		}
	}
}

// TestGuardAsksForTheAudience: the TokenReview carries the audiences
// (spec.audiences), a review whose audiences do not intersect them is
// refused (401) even when the API server authenticated the token, and
// WrapAs authorizes on its subresource. A fake API server answers the
// reviews.
func TestGuardAsksForTheAudience(t *testing.T) {
	for name, tc := range map[string]struct {
		configured, reviewed []string
		want                 int
	}{
		"default audience":          {reviewed: []string{"csi-volmgr"}, want: http.StatusTeapot},
		"the API server's":          {reviewed: []string{"https://kubernetes.default.svc"}, want: http.StatusUnauthorized},
		"configured":                {configured: []string{"a", "b"}, reviewed: []string{"b"}, want: http.StatusTeapot},
		"configured, not the API's": {configured: []string{"a"}, reviewed: []string{"csi-volmgr"}, want: http.StatusUnauthorized},
	} {
		t.Run(name, func(t *testing.T) {
			var (
				mu       sync.Mutex
				asked    []string
				sarAttrs *authorizationv1.ResourceAttributes
			)
			apiServer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				defer mu.Unlock()
				var out any
				switch r.URL.Path {
				case "/apis/authentication.k8s.io/v1/tokenreviews":
					var tr authenticationv1.TokenReview
					if err := json.NewDecoder(r.Body).Decode(&tr); err != nil {
						t.Error(err)
					}
					asked = tr.Spec.Audiences
					tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, Audiences: tc.reviewed, User: authenticationv1.UserInfo{Username: "runtime"}}
					out = &tr
				case "/apis/authorization.k8s.io/v1/subjectaccessreviews":
					var sar authorizationv1.SubjectAccessReview
					if err := json.NewDecoder(r.Body).Decode(&sar); err != nil {
						t.Error(err)
					}
					sarAttrs = sar.Spec.ResourceAttributes
					sar.Status.Allowed = true
					out = &sar
				default:
					http.NotFound(w, r)
					return
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusCreated)
				_ = json.NewEncoder(w).Encode(out)
			}))
			t.Cleanup(apiServer.Close)
			client, err := kubernetes.NewForConfig(&rest.Config{Host: apiServer.URL})
			if err != nil {
				t.Fatal(err)
			}
			g, err := apiauth.New(apiauth.Config{Client: client, NodeName: "node-a", APIAudiences: tc.configured})
			if err != nil {
				t.Fatal(err)
			}
			h := g.WrapAs(apiauth.MetricsSubresource, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) }))
			req := httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/metrics", nil)
			req.Header.Set("Authorization", "Bearer a-token")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.want {
				t.Errorf("answered %d, want %d", rec.Code, tc.want)
			}
			mu.Lock()
			defer mu.Unlock()
			want := tc.configured
			if want == nil {
				want = []string{apiauth.DefaultAPIAudience}
			}
			if !slices.Equal(asked, want) {
				t.Errorf("TokenReview spec.audiences %q, want %q", asked, want)
			}
			if tc.want == http.StatusTeapot && (sarAttrs == nil || sarAttrs.Verb != "get" || sarAttrs.Resource != "nodes" || sarAttrs.Subresource != "metrics" || sarAttrs.Name != "node-a") {
				t.Errorf("SubjectAccessReview of %+v, want get on nodes/metrics node-a", sarAttrs)
			}
		})
	}
}
