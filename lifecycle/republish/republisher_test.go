package republish

import (
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

func TestPeriodOfFollowsTokenLifetimes(t *testing.T) {
	p := volume.DefaultPolicy()
	p.RequiresRepublish = true
	if got := PeriodOf(p, time.Minute); got != time.Minute {
		t.Errorf("without tokens: %v, want the period", got)
	}
	p.TokenRequests = []storagev1.TokenRequest{{Audience: "a", ExpirationSeconds: ptr.To[int64](600)}, {Audience: "b"}}
	if got := PeriodOf(p, 10*time.Minute); got != time.Minute {
		t.Errorf("with a 10m token and a 10m period: %v, want a tenth of the token's lifetime", got)
	}
	if got := PeriodOf(p, 30*time.Second); got != 30*time.Second {
		t.Errorf("with a period shorter than a tenth of the tokens: %v, want the period", got)
	}
	p.TokenRequests = []storagev1.TokenRequest{{Audience: "b"}}
	if got := PeriodOf(p, time.Hour); got != 6*time.Minute {
		t.Errorf("with a token of the API's default hour: %v, want 6m", got)
	}
}
