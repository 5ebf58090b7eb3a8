package volumemanager

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/csi-volmgr/csi-volmgr/volumemanager/apiauth"
)

// TestEndpointsAreWhatHandlerServes: with profiling, Handler registers
// exactly the routes of Endpoints, each once; without, all but the
// profiling ones.
func TestEndpointsAreWhatHandlerServes(t *testing.T) {
	for _, profiling := range []bool{true, false} {
		vm := &VolumeManager{cfg: Config{Profiling: profiling}}
		r := newRoutes(http.NewServeMux())
		vm.register(r)
		var want []string
		for _, e := range Endpoints {
			if profiling || !e.Profiling {
				want = append(want, e.Pattern)
			}
		}
		got := slices.Clone(r.registered)
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("profiling=%v: Handler registers\n%q\nEndpoints lists\n%q", profiling, got, want)
		}
	}
}

// TestRouteMissingFromEndpointsPanics: a route added without its row in
// Endpoints stops the agent at once, in every test that builds a Handler.
func TestRouteMissingFromEndpointsPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("registering a route missing from Endpoints did not panic")
		}
	}()
	newRoutes(http.NewServeMux()).HandleFunc("GET /api/v1/new", func(http.ResponseWriter, *http.Request) {})
}

// TestEndpointsAccessIsTheTCPHandlers: the Access of every endpoint is
// what tcpHandler does with it: open paths reach the handler directly,
// authorized ones only through the guard, which refuses a request without
// credentials here; the metrics are open on a loopback endpoint only.
func TestEndpointsAccessIsTheTCPHandlers(t *testing.T) {
	reached := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })
	// A request without a bearer token is refused before the API server
	// is asked, so this one is never reached.
	client, err := kubernetes.NewForConfig(&rest.Config{Host: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	guard, err := apiauth.New(apiauth.Config{Client: client, NodeName: "node"})
	if err != nil {
		t.Fatal(err)
	}
	for _, loopback := range []bool{true, false} {
		h := tcpHandler(reached, guard, nil, loopback)
		for _, e := range Endpoints {
			method, path, ok := strings.Cut(e.Pattern, " ")
			if !ok {
				method, path = http.MethodGet, e.Pattern
			}
			path = strings.NewReplacer("{namespace}", "ns", "{name}", "pod").Replace(path)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), method, path, nil))
			open := rec.Code == http.StatusTeapot
			if want := e.Access == AccessOpen || e.Access == AccessMetrics && loopback; open != want {
				t.Errorf("%s (Access %s), loopback %v: the TCP endpoint answered %d without credentials", e.Pattern, e.Access, loopback, rec.Code)
			}
		}
	}
}
