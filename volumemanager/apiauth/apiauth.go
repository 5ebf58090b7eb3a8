// Package apiauth guards the agent's runtime API on its TCP endpoint as the
// kubelet guards its own (pkg/kubelet/server/auth.go): a client
// certificate of the client CA, or a bearer token the API server
// authenticates (TokenReview) for the agent's own audience, and a request
// the API server authorizes (SubjectAccessReview) as a verb on the
// subresource csi-volmgr of the agent's Node (nodes/metrics for the
// metrics), with k8s.io/apiserver's x509 authenticator, token webhook
// (whose reviews are never logged with their bodies) and
// authorizer; both answers are cached. A request that is not authenticated
// gets 401 and one that is not authorized 403, and neither reaches the API.
//
// A token is accepted only when it was issued for one of the audiences
// (DefaultAPIAudience: `kubectl create token SA --audience csi-volmgr`):
// such a token is refused by the API server itself, so the agent, or
// whoever reads it on its way, cannot replay it there.
//
// The subresource is the agent's own, not the kubelet's nodes/proxy, so
// that granting a runtime the agent's API never grants it the kubelet's.
package apiauth

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/group"
	"k8s.io/apiserver/pkg/authentication/request/union"
	"k8s.io/apiserver/pkg/authentication/request/x509"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// The attributes a request is authorized with: verb <the method's> on
// nodes/csi-volmgr of the agent's Node, in the core API group.
const (
	Resource    = "nodes"
	Subresource = "csi-volmgr"
	// MetricsSubresource is what /metrics is authorized as when it is
	// guarded: get on nodes/metrics, as the kubelet's /metrics, so that
	// the ClusterRole a Prometheus has for the kubelets' metrics serves.
	MetricsSubresource = "metrics"
)

// DefaultAPIAudience is the audience a token must be issued for when
// Config.APIAudiences is empty.
const DefaultAPIAudience = "csi-volmgr"

// The kubelet's cache lifetimes (its --authentication-token-webhook-cache-ttl
// and --authorization-webhook-cache-authorized-ttl / -unauthorized-ttl
// defaults) and the API server's delegating defaults for the webhook calls.
const (
	DefaultAuthenticationCacheTTL = 2 * time.Minute
	DefaultAllowCacheTTL          = 5 * time.Minute
	DefaultDenyCacheTTL           = 30 * time.Second
	reviewTimeout                 = 10 * time.Second
)

// Config configures a Guard.
type Config struct {
	// Client creates the TokenReviews and SubjectAccessReviews; its
	// identity needs create on both. Required.
	Client kubernetes.Interface
	// NodeName is the name of the Node the requests are authorized on.
	// Required.
	NodeName string
	// AuthenticationCacheTTL, AllowCacheTTL and DenyCacheTTL are how long
	// a token's review and an allowed or denied request's review are
	// cached; 0 means the Default of each.
	AuthenticationCacheTTL, AllowCacheTTL, DenyCacheTTL time.Duration
	// ClientCA, when set, authenticates client certificates it verifies
	// as the user of their common name in the groups of their
	// organizations, before any token.
	ClientCA dynamiccertificates.CAContentProvider
	// APIAudiences are the audiences a token is reviewed for: one of them
	// must be among the token's; empty means DefaultAPIAudience.
	APIAudiences []string
}

// Guard authenticates and authorizes requests. It is safe for concurrent
// use.
type Guard struct {
	authn     authenticator.Request
	authz     authorizer.Authorizer
	node      string
	audiences authenticator.Audiences
}

// New builds the Guard of cfg. Anonymous requests are never
// authenticated; the client certificates are tried before the token.
func New(cfg Config) (*Guard, error) {
	if cfg.Client == nil || cfg.NodeName == "" {
		return nil, errors.New("apiauth: a client and a node name are required")
	}
	// The API server's own defaults for delegated webhooks
	// (options.DefaultAuthWebhookRetryBackoff).
	backoff := wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}
	audiences := authenticator.Audiences(cfg.APIAudiences)
	if len(audiences) == 0 {
		audiences = authenticator.Audiences{DefaultAPIAudience}
	}
	tokens, err := newTokenAuthenticator(cfg.Client.AuthenticationV1(), audiences, backoff, reviewTimeout,
		orDefault(cfg.AuthenticationCacheTTL, DefaultAuthenticationCacheTTL))
	if err != nil {
		return nil, err
	}
	// As the delegating authenticator: a client certificate first, then
	// a bearer token; every authenticated user is in system:authenticated.
	var authenticators []authenticator.Request
	if cfg.ClientCA != nil {
		authenticators = append(authenticators, x509.NewDynamic(cfg.ClientCA.VerifyOptions, x509.CommonNameUserConversion))
	}
	authn := group.NewAuthenticatedGroupAdder(union.New(append(authenticators, tokens)...))
	authz, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: cfg.Client.AuthorizationV1(),
		AllowCacheTTL:             orDefault(cfg.AllowCacheTTL, DefaultAllowCacheTTL),
		DenyCacheTTL:              orDefault(cfg.DenyCacheTTL, DefaultDenyCacheTTL),
		WebhookRetryBackoff:       &backoff,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("apiauth: building the authorizer: %w", err)
	}
	return &Guard{authn: authn, authz: authz, node: cfg.NodeName, audiences: audiences}, nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// Wrap returns a handler that passes to next only the requests the API
// server authenticated and authorized: 401 without a valid credential (a
// client certificate of the client CA, or a token for one of the
// audiences; also when the token cannot be reviewed), 405 for a method
// without a verb, 403 when the caller may not use the verb on
// nodes/csi-volmgr of the Node, and 500 when the access cannot be
// reviewed. The request's context carries the logger.
func (g *Guard) Wrap(next http.Handler) http.Handler { return g.WrapAs(Subresource, next) }

// WrapAs is Wrap authorizing the requests on the subresource of the Node
// (e.g. MetricsSubresource) instead of nodes/csi-volmgr.
func (g *Guard) WrapAs(subresource string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		logger := klog.FromContext(r.Context())
		// The audiences go in the TokenReview (spec.audiences), and the
		// review's must intersect them: without them in the context the
		// API server would accept a token of its own audience.
		resp, ok, err := g.authn.AuthenticateRequest(r.WithContext(authenticator.WithAudiences(r.Context(), g.audiences)))
		if err != nil {
			logger.Error(err, "Cannot authenticate an API request", "path", r.URL.Path)
		}
		if err != nil || !ok {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		attrs, ok := Attributes(resp.User, r, g.node)
		attrs.Subresource = subresource
		if !ok {
			http.Error(w, fmt.Sprintf("method %s not allowed", r.Method), http.StatusMethodNotAllowed)
			return
		}
		decision, reason, err := g.authz.Authorize(r.Context(), attrs)
		who := fmt.Sprintf("user=%s, verb=%s, resource=%s, subresource=%s", attrs.User.GetName(), attrs.Verb, attrs.Resource, attrs.Subresource)
		if err != nil {
			logger.Error(err, "Cannot authorize an API request", "user", attrs.User.GetName(), "verb", attrs.Verb, "path", r.URL.Path)
			http.Error(w, "Authorization error ("+who+")", http.StatusInternalServerError)
			return
		}
		if decision != authorizer.DecisionAllow {
			logger.V(2).Info("Forbidden API request", "user", attrs.User.GetName(), "verb", attrs.Verb, "path", r.URL.Path, "reason", reason)
			http.Error(w, "Forbidden ("+who+")", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Attributes are what a request of u is authorized as: the verb of its
// method (GET and HEAD get, POST create, PUT update, PATCH patch, DELETE
// delete) on nodes/csi-volmgr named node, as the kubelet maps a request to
// nodes/proxy. ok is false for a method without a verb.
func Attributes(u user.Info, r *http.Request, node string) (attrs authorizer.AttributesRecord, ok bool) {
	var verb string
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		verb = "get"
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
	case http.MethodDelete:
		verb = "delete"
	default:
		return attrs, false
	}
	return authorizer.AttributesRecord{
		User: u, Verb: verb, APIGroup: "", APIVersion: "v1",
		Resource: Resource, Subresource: Subresource, Name: node,
		ResourceRequest: true, Path: r.URL.Path,
	}, true
}
