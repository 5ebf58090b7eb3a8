package apiauth_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"k8s.io/apiserver/pkg/authentication/user"

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
