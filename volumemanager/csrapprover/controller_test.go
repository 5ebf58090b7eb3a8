package csrapprover

import (
	"context"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"
)

// newController returns a Controller on a fake clientset holding csrs,
// its cache seeded with them as sample-controller's tests do.
func newController(t *testing.T, csrs ...*certificatesv1.CertificateSigningRequest) (*Controller, *fake.Clientset) {
	t.Helper()
	objs := make([]runtime.Object, 0, len(csrs))
	for _, c := range csrs {
		objs = append(objs, c)
	}
	client := fake.NewClientset(objs...)
	c, err := New(Config{Client: client, Rules: DefaultRules()})
	if err != nil {
		t.Fatal(err)
	}
	indexer := c.factory.Certificates().V1().CertificateSigningRequests().Informer().GetIndexer()
	for _, csr := range csrs {
		if err := indexer.Add(csr); err != nil {
			t.Fatal(err)
		}
	}
	client.ClearActions()
	return c, client
}

// approvals returns the conditions written through the approval
// subresource.
func approvals(client *fake.Clientset) []certificatesv1.CertificateSigningRequestCondition {
	var out []certificatesv1.CertificateSigningRequestCondition
	for _, a := range client.Actions() {
		if u, ok := a.(k8stesting.UpdateAction); ok && a.GetSubresource() == "approval" {
			out = append(out, u.GetObject().(*certificatesv1.CertificateSigningRequest).Status.Conditions...)
		}
	}
	return out
}

func TestSyncWritesTheDecision(t *testing.T) {
	for name, tc := range map[string]struct {
		who    requester
		node   string
		want   certificatesv1.RequestConditionType
		reason string
	}{
		"approve":                 {who: agentPod("h1", "p"), node: "csi-volmgr-h1", want: certificatesv1.CertificateApproved, reason: ConditionReasonApprove},
		"deny":                    {who: agentPod("h1", "p"), node: "csi-volmgr-h2", want: certificatesv1.CertificateDenied, reason: ConditionReasonDeny},
		"leave a kubelet's alone": {who: nodeUser("worker1"), node: "worker1"},
	} {
		t.Run(name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			c, client := newController(t, newCSR(t, "csr-1", tc.who, nodeRequest(tc.node)))
			if err := c.sync(ctx, "csr-1"); err != nil {
				t.Fatal(err)
			}
			got := approvals(client)
			if tc.want == "" {
				if len(client.Actions()) > 0 {
					t.Fatalf("actions %v, want none", client.Actions())
				}
				return
			}
			if len(got) != 1 || got[0].Type != tc.want || got[0].Reason != tc.reason || got[0].Status != "True" || got[0].Message == "" {
				t.Fatalf("conditions written %+v, want one %s with reason %s", got, tc.want, tc.reason)
			}
			stored, err := client.CertificatesV1().CertificateSigningRequests().Get(ctx, "csr-1", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(stored.Status.Conditions) != 1 {
				t.Errorf("stored conditions %+v", stored.Status.Conditions)
			}
			cached, err := c.lister.Get("csr-1")
			if err != nil {
				t.Fatal(err)
			}
			if len(cached.Status.Conditions) != 0 {
				t.Errorf("the cache's copy was changed: %+v", cached.Status.Conditions)
			}
		})
	}
}

// TestSyncConflictIsRetried: a write on a request changed meanwhile fails
// with Conflict, which the worker retries.
func TestSyncConflictIsRetried(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	c, client := newController(t, newCSR(t, "csr-1", agentPod("h1", "p"), nodeRequest("csi-volmgr-h1")))
	client.PrependReactor("update", "certificatesigningrequests", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewConflict(schema.GroupResource{Group: "certificates.k8s.io", Resource: "certificatesigningrequests"}, "csr-1", nil)
	})
	if err := c.sync(ctx, "csr-1"); !apierrors.IsConflict(err) {
		t.Fatalf("sync: %v, want Conflict", err)
	}
	c.queue.Add("csr-1")
	c.processNext(ctx)
	if c.queue.NumRequeues("csr-1") != 1 {
		t.Errorf("requeues %d, want 1", c.queue.NumRequeues("csr-1"))
	}
}

// TestSyncDeletedRequest: a request gone from the cache needs nothing.
func TestSyncDeletedRequest(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	c, client := newController(t)
	if err := c.sync(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	if len(client.Actions()) > 0 {
		t.Errorf("actions %v", client.Actions())
	}
}

// TestRunDecidesWhatItWatches: Run's informer, queue and workers end to end
// on the fake clientset; a request created while it runs is decided, and
// Run returns once ctx ends.
func TestRunDecidesWhatItWatches(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	before := newCSR(t, "before", agentPod("h1", "p"), nodeRequest("csi-volmgr-h1"))
	client := fake.NewClientset(before)
	c, err := New(Config{Client: client, Rules: DefaultRules(), Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	csrs := client.CertificatesV1().CertificateSigningRequests()
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return c.Running(), nil
	}); err != nil {
		t.Fatal("not running:", err)
	}
	if _, err := csrs.Create(ctx, newCSR(t, "after", agentPod("h1", "p"), nodeRequest("csi-volmgr-h9")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want := map[string]certificatesv1.RequestConditionType{"before": certificatesv1.CertificateApproved, "after": certificatesv1.CertificateDenied}
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		for name, typ := range want {
			csr, err := csrs.Get(ctx, name, metav1.GetOptions{})
			if err != nil || len(csr.Status.Conditions) == 0 {
				return false, err
			}
			if got := csr.Status.Conditions[0].Type; got != typ {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("waiting for %v: %v (actions %v)", want, err, client.Actions())
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after ctx ended")
	}
	if c.Running() {
		t.Error("still running")
	}
	for _, cond := range approvals(client) {
		if !strings.HasPrefix(cond.Reason, "CSIVolmgr") {
			t.Errorf("reason %q", cond.Reason)
		}
	}
}
