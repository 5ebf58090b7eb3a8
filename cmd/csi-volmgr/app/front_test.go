package app

import (
	"strings"
	"testing"
)

func TestValidateFront(t *testing.T) {
	for name, tc := range map[string]struct {
		endpoint, driver string
		wantErr          string
	}{
		"disabled":          {},
		"both":              {endpoint: "/run/csi-volmgr/front.sock", driver: "hostpath.csi.k8s.io"},
		"unix URL":          {endpoint: "unix:///run/front.sock", driver: "d"},
		"endpoint only":     {endpoint: "/run/front.sock", wantErr: "must be set together"},
		"driver only":       {driver: "d", wantErr: "must be set together"},
		"relative endpoint": {endpoint: "front.sock", driver: "d", wantErr: "--front-endpoint"},
		"tcp endpoint":      {endpoint: "tcp://127.0.0.1:10000", driver: "d", wantErr: "--front-endpoint"},
	} {
		t.Run(name, func(t *testing.T) {
			o := NewRunOptions()
			o.FrontEndpoint, o.FrontDriver = tc.endpoint, tc.driver
			err := o.validateFront()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("validateFront = %v, want nil", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("validateFront = %v, want an error mentioning %q", err, tc.wantErr)
			}
		})
	}
}
