package lifecycle

import (
	"context"
	"fmt"

	authenticationv1 "k8s.io/api/authentication/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/csi-volmgr/csi-volmgr/csiclient/redact"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// tokenRequester issues pod-bound service account tokens through the
// TokenRequest API, for drivers whose CSIDriver has tokenRequests, as the
// kubelet does (one request per audience, bound to the pod).
type tokenRequester struct{ client kubernetes.Interface }

func (t tokenRequester) ServiceAccountToken(ctx context.Context, pod volume.PodInfo, req storagev1.TokenRequest) (authenticationv1.TokenRequestStatus, error) {
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: req.ExpirationSeconds,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID},
	}}
	if req.Audience != "" {
		tr.Spec.Audiences = []string{req.Audience}
	}
	sa := pod.ServiceAccount
	if sa == "" {
		sa = "default"
	}
	// client-go logs response bodies from V(8): not the token's.
	out, err := t.client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(redact.Quiet(ctx, redact.APIBodies), sa, tr, metav1.CreateOptions{})
	if err != nil {
		return authenticationv1.TokenRequestStatus{}, fmt.Errorf("requesting a token of service account %s/%s for audience %q: %w", pod.Namespace, sa, req.Audience, err)
	}
	return out.Status, nil
}
