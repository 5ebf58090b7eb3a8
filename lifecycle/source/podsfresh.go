package source

import (
	"context"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/klog/v2"
)

// The pod cache can fall behind the API server: while its watch is broken
// (an API server outage, then the reflector's backoff before it watches and
// lists again: seconds, up to half a minute, and client-go tells nobody) a
// pod created meanwhile is not in the cache, and a volume only it wants
// looks unwanted (a chaos run's finding: a volume unstaged under a pod
// created 6 s earlier, right after an outage). So before a volume is
// unstaged the cache is checked against a consistent LIST of the node's
// pods: one request per check, at most one check per freshWindow, and only
// when the reconciler is about to unstage.

// freshWindow is how long a check that found the cache complete answers
// for: a pod created since then reaches the cache through a working watch
// within milliseconds; a watch that broke since then is caught by the next
// check.
const freshWindow = 500 * time.Millisecond

// freshTimeout bounds one check.
const freshTimeout = 5 * time.Second

// podsFreshness remembers the last check of the pod cache.
type podsFreshness struct {
	mu sync.Mutex
	// checked is when the last check that found the cache complete began.
	checked time.Time
}

// PodsCurrent tells whether the pod cache holds every pod the API server
// has on the node, checked with a consistent LIST (or by one that began
// less than freshWindow ago). An error, an API server that is down, or a
// pod the cache lacks is false. The populator calls the desired state
// settled only when it is true.
func (s *Source) PodsCurrent(ctx context.Context) bool {
	s.fresh.mu.Lock()
	defer s.fresh.mu.Unlock()
	if time.Since(s.fresh.checked) < freshWindow {
		return true
	}
	began := time.Now()
	missing, err := s.missingPods(ctx)
	logger := klog.FromContext(ctx)
	switch {
	case err != nil:
		logger.V(4).Info("Checking the pod cache against the API server failed", "err", err)
		return false
	case missing > 0:
		logger.V(2).Info("The pod cache is behind the API server", "missingPods", missing)
		return false
	}
	s.fresh.checked = began
	return true
}

// missingPods lists the node's pods from the API server (a consistent
// read) and counts those the cache does not have.
func (s *Source) missingPods(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, freshTimeout)
	defer cancel()
	list, err := s.cfg.Client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", s.cfg.NodeName).String(),
	})
	if err != nil {
		return 0, err
	}
	missing := 0
	for i := range list.Items {
		pod := &list.Items[i]
		if !s.ours(pod) {
			continue
		}
		if cached, ok := s.PodByName(pod.Namespace, pod.Name); !ok || cached.UID != pod.UID {
			missing++
		}
	}
	return missing, nil
}
