package agent_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/tools/clientcmd"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// TestUnreadableClaimDoesNotBlockTheNode is issue 23's defect 1 against
// the real API server: the agent may read one of the namespace's claims
// but not the other (RBAC: its user's Role names the readable one only),
// and a pod of each is on the node when it starts. A pod whose claim
// cannot be read stayed unresolved for ever, and so did the node: the
// desired state never counted as populated, /readyz stayed false, nothing
// was torn down. Now the agent becomes ready, the other pod's volume is
// published and, once that pod is deleted, torn down; the blocked pod's
// condition and a Warning Event say why.
func TestUnreadableClaimDoesNotBlockTheNode(t *testing.T) {
	t.Parallel()
	user := "restricted-agent-" + utilrand.String(6)
	n := newNode(t, nodeOptions{kubeConfig: impersonating(t, k8stest.Shared(t).KubeConfig, user)})
	open := n.createClaimedVolume(t, "open")
	hidden := n.createClaimedVolume(t, "hidden")
	grantAllButClaims(t, n, user, open.claim)
	blocked := n.createPod(t, "blocked", hidden.claim)
	app := n.createPod(t, "app", open.claim)

	n.startAgent(t) // ready: the desired state is populated
	n.logStep(t, "agent ready")
	n.waitVolumesReady(t, app, corev1.ConditionTrue)
	cond := n.waitVolumesReady(t, blocked, corev1.ConditionFalse)
	if cond.Reason != "ObjectUnreadable" || !strings.Contains(cond.Message, `cannot read PVC "`+n.f.Namespace+`/hidden"`) ||
		!strings.Contains(cond.Message, "forbidden") {
		t.Errorf("blocked pod's condition: %s %q; want ObjectUnreadable naming the claim and the API server's answer", cond.Reason, cond.Message)
	}
	n.waitEvent(t, blocked, "FailedMount", "forbidden")

	// The other pod's volume is torn down when it goes: nothing waits for
	// the blocked pod.
	n.deletePod(t, app)
	n.waitJournal(t, "NodeUnstageVolume of the deleted pod's volume", func(calls []plugin.Call) bool {
		return len(succeeded(callsOf(calls, "NodeUnstageVolume", n.stagingPath(open.handle)))) == 1
	})
	n.waitVolumes(t, "no volume", func(vols []volumemanager.VolumeStatus) bool { return len(vols) == 0 })
	for _, c := range n.calls(t) {
		if c.Begin.Method == "NodeStageVolume" && c.Begin.VolumeID == hidden.handle {
			t.Errorf("the volume of the claim the agent may not read was staged:%s", describeCalls([]plugin.Call{c}))
		}
	}
}

// impersonating returns kubeConfig acting as user (in system:authenticated
// only): RBAC decides what it may do.
func impersonating(t *testing.T, kubeConfig []byte, user string) []byte {
	t.Helper()
	cfg, err := clientcmd.Load(kubeConfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range cfg.AuthInfos {
		a.Impersonate = user
		a.ImpersonateGroups = []string{"system:authenticated"}
	}
	out, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// grantAllButClaims lets user do what the agent does, but read only the
// claim named readable of the test's namespace.
func grantAllButClaims(t *testing.T, n *node, user, readable string) {
	t.Helper()
	ctx := t.Context()
	rbac := n.f.Client.RbacV1()
	name := user
	subjects := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}
	all := []string{"*"}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Verbs: all, Resources: []string{"pods", "pods/status", "nodes", "nodes/status", "events",
			"persistentvolumes", "secrets", "serviceaccounts", "serviceaccounts/token", "namespaces", "configmaps"}},
		{APIGroups: []string{"storage.k8s.io", "coordination.k8s.io", "events.k8s.io", "authentication.k8s.io",
			"authorization.k8s.io"}, Verbs: all, Resources: all},
	}}
	if _, err := rbac.ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name}, Subjects: subjects,
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.WithoutCancel(ctx)
		_ = rbac.ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{})
		_ = rbac.ClusterRoles().Delete(ctx, name, metav1.DeleteOptions{})
	})
	claims := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: n.f.Namespace, Name: name}, Rules: []rbacv1.PolicyRule{{
		APIGroups: []string{""}, Verbs: all, Resources: []string{"persistentvolumeclaims", "persistentvolumeclaims/status"},
		ResourceNames: []string{readable},
	}}}
	if _, err := rbac.Roles(n.f.Namespace).Create(ctx, claims, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	claimsBinding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: n.f.Namespace, Name: name}, Subjects: subjects,
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}}
	if _, err := rbac.RoleBindings(n.f.Namespace).Create(ctx, claimsBinding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitEvent waits for a Warning Event on pod with reason and a message
// that contains text.
func (n *node) waitEvent(t *testing.T, pod *corev1.Pod, reason, text string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	var last []string
	err := pollUntil(ctx, func() bool {
		events, err := n.f.Client.CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.uid": string(pod.UID), "type": corev1.EventTypeWarning}.String()})
		if err != nil {
			return false
		}
		last = last[:0]
		for _, e := range events.Items {
			last = append(last, e.Reason+": "+e.Message)
			if e.Reason == reason && strings.Contains(e.Message, text) {
				return true
			}
		}
		return false
	})
	if err != nil {
		t.Fatalf("no Warning %s Event mentioning %q on pod %s: %v; Events: %q", reason, text, pod.Name, err, last)
	}
}
