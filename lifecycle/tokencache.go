package lifecycle

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/operations"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// The kubelet's token manager rules (pkg/kubelet/token/token_manager.go).
const (
	// tokenMaxTTL: a token older than this is refreshed whatever its
	// expiry.
	tokenMaxTTL = 24 * time.Hour
	// tokenMaxJitter spreads the refreshes of many tokens.
	tokenMaxJitter = 10 * time.Second
)

// cachedTokens serves pod-bound service account tokens from a cache and
// requests a new one only when the kubelet's token manager would: once
// less than 20% of its lifetime is left (minus a jitter of up to 10s), or
// it is older than 24h. So a driver with requiresRepublish gets the same
// token on every republish until the token nears its expiry, and a fresh
// one from then on, long before the old one expires. A failed refresh of a
// token that has not expired yet serves the cached token.
type cachedTokens struct {
	inner operations.Tokens
	clock clock.PassiveClock

	mu    sync.Mutex
	cache map[tokenKey]cachedToken
	// lastGC is when expired tokens were last dropped.
	lastGC time.Time
}

// tokenKey is what makes two token requests the same (the kubelet's
// keyFunc): the pod, its service account, the audience and the lifetime.
type tokenKey struct {
	pod            volume.PodInfo
	audience       string
	expirationSecs string
}

type cachedToken struct {
	status   authenticationv1.TokenRequestStatus
	issuedAt time.Time
}

func newCachedTokens(inner operations.Tokens, clk clock.PassiveClock) *cachedTokens {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &cachedTokens{inner: inner, clock: clk, cache: map[tokenKey]cachedToken{}}
}

// ServiceAccountToken implements operations.Tokens.
func (c *cachedTokens) ServiceAccountToken(ctx context.Context, pod volume.PodInfo, req storagev1.TokenRequest) (authenticationv1.TokenRequestStatus, error) {
	key := tokenKey{pod: pod, audience: req.Audience}
	if req.ExpirationSeconds != nil {
		key.expirationSecs = strconv.FormatInt(*req.ExpirationSeconds, 10)
	}
	now := c.clock.Now()
	c.mu.Lock()
	cached, ok := c.cache[key]
	c.gcLocked(now)
	c.mu.Unlock()
	if ok && !c.requiresRefresh(cached, now) {
		return cached.status, nil
	}
	st, err := c.inner.ServiceAccountToken(ctx, pod, req)
	if err != nil {
		if ok && now.Before(cached.status.ExpirationTimestamp.Time) {
			return cached.status, nil
		}
		return authenticationv1.TokenRequestStatus{}, err
	}
	c.mu.Lock()
	c.cache[key] = cachedToken{status: st, issuedAt: now}
	c.mu.Unlock()
	return st, nil
}

// requiresRefresh is the kubelet's rule: refresh within the last 20% of
// the token's lifetime, or after 24h, each less a jitter.
func (c *cachedTokens) requiresRefresh(t cachedToken, now time.Time) bool {
	exp := t.status.ExpirationTimestamp.Time
	ttl := exp.Sub(t.issuedAt)
	jitter := time.Duration(rand.Float64() * float64(tokenMaxJitter))
	if now.After(t.issuedAt.Add(tokenMaxTTL - jitter)) {
		return true
	}
	return now.After(exp.Add(-ttl/5 - jitter))
}

// forgetPod drops the tokens of a pod that left the desired state: it gets
// no publish any more, and a node that runs many short pods would keep
// their tokens until they expire. The kubelet's pod deletion does the same
// (DeleteServiceAccountToken).
func (c *cachedTokens) forgetPod(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.cache {
		if k.pod.UID == uid {
			delete(c.cache, k)
		}
	}
}

// forgetLeavingPods has the tokens of every pod that leaves desire
// dropped.
func (c *cachedTokens) forgetLeavingPods(desire *dsw.Store) {
	desire.Subscribe(dsw.Handler{Pod: func(uid types.UID) {
		if !desire.HasPod(uid) {
			c.forgetPod(uid)
		}
	}})
}

// size counts the cached tokens; for tests.
func (c *cachedTokens) size() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.cache)
}

// gcLocked drops expired tokens, so that the tokens of pods that are gone
// do not pile up; mu must be held.
func (c *cachedTokens) gcLocked(now time.Time) {
	if now.Sub(c.lastGC) < time.Minute {
		return
	}
	c.lastGC = now
	for k, t := range c.cache {
		if now.After(t.status.ExpirationTimestamp.Time) {
			delete(c.cache, k)
		}
	}
}
