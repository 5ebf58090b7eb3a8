package volumemanager_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// requestLog records the requests of one clientset as "VERB path".
type requestLog struct {
	mu   sync.Mutex
	reqs []string
}

func (l *requestLog) client(t *testing.T, cfg *rest.Config) kubernetes.Interface {
	t.Helper()
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			l.mu.Lock()
			l.reqs = append(l.reqs, r.Method+" "+r.URL.Path)
			l.mu.Unlock()
			return rt.RoundTrip(r)
		})
	})
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (l *requestLog) has(pred func(string) bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.ContainsFunc(l.reqs, pred)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestReportClientWritesTheConditions: with a ReportClient (a rate limiter
// of its own), the pod's VolumesReady condition is written through it, and
// the KubeClient, whose budget the reads of a burst of pods need, writes
// no pod status.
func TestReportClientWritesTheConditions(t *testing.T) {
	f := k8stest.New(t)
	f.CreateNode(t)
	var main, report requestLog
	startClusterNode(t, f, func(c *volumemanager.Config) {
		c.KubeClient, c.ReportClient = main.client(t, f.Config), report.client(t, f.Config)
	})
	pods := f.Client.CoreV1().Pods(f.Namespace)
	if _, err := pods.Create(t.Context(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: f.Namespace},
		Spec: corev1.PodSpec{
			NodeName:   f.NodeName,
			Containers: []corev1.Container{{Name: "app", Image: "i", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"},
			}}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, "VolumesReady=True on the pod", func(ctx context.Context) (bool, error) {
		pod, err := pods.Get(ctx, "app", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return slices.ContainsFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool {
			return c.Type == status.ConditionVolumesReady && c.Status == corev1.ConditionTrue
		}), nil
	})
	statusWrite := func(r string) bool {
		return !strings.HasPrefix(r, "GET ") && strings.HasSuffix(r, "/pods/app/status")
	}
	if !report.has(statusWrite) {
		t.Error("the report client wrote no status of the pod")
	}
	if main.has(statusWrite) {
		t.Error("the main client wrote the pod's status")
	}
	if !main.has(func(r string) bool {
		return strings.HasPrefix(r, "GET ") && strings.Contains(r, "/persistentvolumeclaims/data")
	}) {
		t.Error("the main client did not read the claim")
	}
}
