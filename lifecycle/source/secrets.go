package source

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/csi-volmgr/csi-volmgr/csiclient/redact"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// Secrets reads the Secrets named by nodeStageSecretRef,
// nodePublishSecretRef and nodeExpandSecretRef when an operation needs them.
// They are read live, as the kubelet does, and deliberately not cached: a
// cache would keep every referenced Secret in memory and watch it. Values
// are never logged; errors name the Secret, never its content.
type Secrets struct {
	client kubernetes.Interface
}

// NewSecrets returns a Secrets reader using client.
func NewSecrets(client kubernetes.Interface) *Secrets {
	return &Secrets{client: client}
}

// GetSecret returns the data of the Secret namespace/name as the string
// map a CSI request carries. Errors wrap the API error (apierrors.IsNotFound,
// IsForbidden, ... still work) and never contain secret data.
func (s *Secrets) GetSecret(ctx context.Context, namespace, name string) (map[string]string, error) {
	if name == "" || namespace == "" {
		return nil, fmt.Errorf("%w: Secret reference %q/%q needs a namespace and a name",
			volume.ErrInvalidSpec, namespace, name)
	}
	// client-go logs response bodies from V(8): not this one's.
	secret, err := s.client.CoreV1().Secrets(namespace).Get(redact.Quiet(ctx, redact.APIBodies), name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("getting Secret %s/%s: %w", namespace, name, err)
	}
	data := make(map[string]string, len(secret.Data))
	for k, v := range secret.Data {
		data[k] = string(v)
	}
	return data, nil
}
