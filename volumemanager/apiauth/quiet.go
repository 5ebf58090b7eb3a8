package apiauth

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authentication/request/bearertoken"
	tokencache "k8s.io/apiserver/pkg/authentication/token/cache"
	webhooktoken "k8s.io/apiserver/plugin/pkg/authenticator/token/webhook"
	authenticationv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"

	"github.com/csi-volmgr/csi-volmgr/csiclient/redact"
)

// newTokenAuthenticator is the bearer-token half of k8s.io/apiserver's
// delegating authenticator (authenticatorfactory.DelegatingAuthenticatorConfig
// with a TokenAccessReviewClient: the same webhook, audiences, retries,
// cache and metrics; New adds system:authenticated), with one difference: every
// TokenReview runs with its logger capped at redact.APIBodies. A
// TokenReview's request body, and the API server's answer, hold the
// caller's bearer token, which client-go logs with the bodies from -v=8;
// the cached authenticator runs each review on a context of its own
// (context.Background, the global logger), never below a caller's
// redact.Quiet, so the cap is put on that context, the one client-go logs
// with.
func newTokenAuthenticator(client authenticationv1client.AuthenticationV1Interface, audiences authenticator.Audiences, backoff wait.Backoff, timeout, ttl time.Duration) (authenticator.Request, error) {
	authenticatorfactory.RegisterMetrics()
	webhook, err := webhooktoken.NewFromInterface(client, audiences, backoff, timeout, webhooktoken.AuthenticatorMetrics{
		RecordRequestTotal:   authenticatorfactory.RecordRequestTotal,
		RecordRequestLatency: authenticatorfactory.RecordRequestLatency,
	})
	if err != nil {
		return nil, fmt.Errorf("apiauth: building the token authenticator: %w", err)
	}
	quiet := authenticator.TokenFunc(func(ctx context.Context, token string) (*authenticator.Response, bool, error) {
		return webhook.AuthenticateToken(redact.Quiet(ctx, redact.APIBodies), token)
	})
	cached := tokencache.New(quiet, false, ttl, ttl)
	return bearertoken.New(cached), nil
}
