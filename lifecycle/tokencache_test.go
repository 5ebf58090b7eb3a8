package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	testclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// countingTokens issues numbered tokens that expire after the requested
// lifetime, or fails.
type countingTokens struct {
	clk    *testclock.FakePassiveClock
	issued int
	fail   bool
}

func (c *countingTokens) ServiceAccountToken(_ context.Context, _ volume.PodInfo, req storagev1.TokenRequest) (authenticationv1.TokenRequestStatus, error) {
	if c.fail {
		return authenticationv1.TokenRequestStatus{}, errors.New("API server unreachable")
	}
	c.issued++
	ttl := time.Hour
	if req.ExpirationSeconds != nil {
		ttl = time.Duration(*req.ExpirationSeconds) * time.Second
	}
	return authenticationv1.TokenRequestStatus{Token: "t" + strconv.Itoa(c.issued), ExpirationTimestamp: metav1.NewTime(c.clk.Now().Add(ttl))}, nil
}

// TestCachedTokensRefreshRules: the same token until the last fifth of its
// lifetime (less up to 10s of jitter), a fresh one after; a failed refresh
// serves the cached token while it has not expired, and fails after.
func TestCachedTokensRefreshRules(t *testing.T) {
	clk := testclock.NewFakePassiveClock(time.Unix(1_000_000, 0))
	inner := &countingTokens{clk: clk}
	c := newCachedTokens(inner, clk)
	pod := volume.PodInfo{UID: "u", Namespace: "ns", Name: "p", ServiceAccount: "sa"}
	req := storagev1.TokenRequest{Audience: "vault", ExpirationSeconds: ptr.To[int64](600)}
	get := func() string {
		t.Helper()
		st, err := c.ServiceAccountToken(t.Context(), pod, req)
		if err != nil {
			t.Fatal(err)
		}
		return st.Token
	}
	if got := get(); got != "t1" {
		t.Fatalf("first token = %s", got)
	}
	clk.SetTime(clk.Now().Add(470 * time.Second)) // 78%: still fresh, whatever the jitter
	if got := get(); got != "t1" {
		t.Errorf("token at 78%% of its lifetime = %s, want the cached t1", got)
	}
	if other := (storagev1.TokenRequest{Audience: "other", ExpirationSeconds: ptr.To[int64](600)}); true {
		if st, _ := c.ServiceAccountToken(t.Context(), pod, other); st.Token != "t2" {
			t.Errorf("another audience got %s, want its own token t2", st.Token)
		}
	}
	clk.SetTime(clk.Now().Add(10 * time.Second)) // 80%: refreshed
	if got := get(); got != "t3" {
		t.Errorf("token at 80%% of its lifetime = %s, want a fresh t3", got)
	}
	inner.fail = true
	clk.SetTime(clk.Now().Add(590 * time.Second)) // t3 near its expiry, the refresh fails
	if got := get(); got != "t3" {
		t.Errorf("token when the refresh fails before expiry = %s, want the cached t3", got)
	}
	clk.SetTime(clk.Now().Add(20 * time.Second)) // expired
	if _, err := c.ServiceAccountToken(t.Context(), pod, req); err == nil {
		t.Error("an expired token was served when the refresh failed")
	}
}

// TestCachedTokensOfLeavingPodsDropped is issue 23's unbounded growth for
// the token cache: 2,000 pods each get a token while in the desired state
// and leave it; the cache is back to empty, not waiting for the tokens'
// expiry.
func TestCachedTokensOfLeavingPodsDropped(t *testing.T) {
	clk := testclock.NewFakePassiveClock(time.Unix(1_000_000, 0))
	c := newCachedTokens(&countingTokens{clk: clk}, clk)
	desire := dsw.New()
	c.forgetLeavingPods(desire)
	req := storagev1.TokenRequest{Audience: "vault", ExpirationSeconds: ptr.To[int64](3600)}
	for i := range 2000 {
		pod := volume.PodInfo{UID: types.UID(fmt.Sprintf("u%d", i)), Namespace: "ns", Name: fmt.Sprintf("p%d", i), ServiceAccount: "sa"}
		desire.SetPod(dsw.Pod{Info: pod})
		if _, err := c.ServiceAccountToken(t.Context(), pod, req); err != nil {
			t.Fatal(err)
		}
		desire.DeletePod(pod.UID)
	}
	if n := c.size(); n != 0 {
		t.Errorf("after 2,000 pods came and went the token cache holds %d tokens, want 0", n)
	}
}
