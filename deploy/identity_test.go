package deploy_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

// nodeClientRoles are the ClusterRoles whose holders kube-controller-manager's
// own approver approves node client certificates for: any Node's
// (nodeclient), or the holder's own Node's (selfnodeclient). No subject of
// the manifests may hold them.
var nodeClientRoles = []string{
	"system:certificates.k8s.io:certificatesigningrequests:nodeclient",
	"system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
}

// bootstrapRole is the built-in ClusterRole the agent's bootstrap
// identities are bound to.
const bootstrapRole = "system:node-bootstrapper"

// TestAgentIdentityManifests checks, in deploy/base, deploy/kind and
// deploy/systemd, how the agent gets its Node identity without a grant
// that outlives its host: the DaemonSet's ServiceAccount and the edge
// hosts' bootstrap group are bound to system:node-bootstrapper and nothing
// else, nothing binds the node client approval roles, the approver serves
// exactly the DaemonSet's Node names and ServiceAccount and never runs on an
// agent's host, and its ClusterRole approves only node client certificates.
func TestAgentIdentityManifests(t *testing.T) {
	for _, dir := range []string{"base", "kind", "systemd"} {
		t.Run(dir, func(t *testing.T) {
			objs := render(t, dir)
			for _, b := range ofKind[rbacv1.ClusterRoleBinding](t, objs, "ClusterRoleBinding") {
				if slices.Contains(nodeClientRoles, b.RoleRef.Name) {
					t.Errorf("ClusterRoleBinding %s binds %s to %v: kube-controller-manager would approve their node certificates", b.Name, b.RoleRef.Name, b.Subjects)
				}
			}
			for _, b := range ofKind[rbacv1.RoleBinding](t, objs, "RoleBinding") {
				if slices.Contains(nodeClientRoles, b.RoleRef.Name) {
					t.Errorf("RoleBinding %s/%s binds %s", b.Namespace, b.Name, b.RoleRef.Name)
				}
			}
			if dir == "systemd" {
				g := grantsOf(t, nil, objs, rbacv1.Subject{Kind: rbacv1.GroupKind, Name: "system:bootstrappers:csi-volmgr"})
				if len(g) != 1 || g[0].Name != bootstrapRole || !g[0].BuiltIn {
					t.Errorf("the bootstrap tokens' group is bound to %+v, want %s alone", g, bootstrapRole)
				}
				return
			}
			ds, agent := agentDaemonSet(t, objs)
			if g := agentGrants(t, nil, objs, ds.Namespace, ds.Spec.Template.Spec.ServiceAccountName); len(g) != 1 || g[0].Name != bootstrapRole || !g[0].BuiltIn {
				t.Errorf("the agent's ServiceAccount is bound to %+v, want %s alone: as its Node it needs no RBAC", g, bootstrapRole)
			}

			dep := convert[appsv1.Deployment](t, find(t, objs, "Deployment", agentNamespace, approverName))
			spec := dep.Spec.Template.Spec
			c := spec.Containers[0]
			if spec.ServiceAccountName == ds.Spec.Template.Spec.ServiceAccountName {
				t.Errorf("the approver runs as the agent's ServiceAccount %s", spec.ServiceAccountName)
			}
			prefix, _ := flagValue(c.Args, "node-name-prefix")
			if name, _ := flagValue(agent.Args, "node-name"); prefix == "" || name != prefix+"$(NODE_NAME)" {
				t.Errorf("the approver's --node-name-prefix=%q does not name the DaemonSet's --node-name=%s: no agent would get a certificate", prefix, name)
			}
			if sa, _ := flagValue(c.Args, "agent-service-account"); sa != ds.Namespace+"/"+ds.Spec.Template.Spec.ServiceAccountName {
				t.Errorf("the approver's --agent-service-account=%q, want the DaemonSet's %s/%s", sa, ds.Namespace, ds.Spec.Template.Spec.ServiceAccountName)
			}
			if group, _ := flagValue(c.Args, "bootstrap-group-prefix"); group != "system:bootstrappers:csi-volmgr:" {
				t.Errorf("the approver's --bootstrap-group-prefix=%q, want the group bootstrap-token.sh gives a token, system:bootstrappers:csi-volmgr:", group)
			}
			if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 1 {
				t.Errorf("the approver has %v replicas, want 1", dep.Spec.Replicas)
			}
			checkApproverOffAgentHosts(t, spec, ds.Spec.Template.Spec.NodeSelector)

			role := clusterRole(t, nil, objs, approverName)
			want := []rbacv1.PolicyRule{
				{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests"}, Verbs: []string{"list", "watch"}},
				{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests/approval"}, Verbs: []string{"update"}},
				{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"signers"}, ResourceNames: []string{"kubernetes.io/kube-apiserver-client-kubelet"}, Verbs: []string{"approve"}},
			}
			if fmt.Sprint(role.Rules) != fmt.Sprint(want) {
				t.Errorf("the approver's ClusterRole: %v, want %v", role.Rules, want)
			}
		})
	}
}

// checkApproverOffAgentHosts fails t unless the approver's pod can never
// be scheduled to a host the agents' nodeSelector selects: whoever is root
// there could approve any agent's certificate. It runs on the control
// plane, and a required node affinity keeps it off the agents' hosts.
func checkApproverOffAgentHosts(t *testing.T, spec corev1.PodSpec, agentSelector map[string]string) {
	t.Helper()
	if _, ok := spec.NodeSelector["node-role.kubernetes.io/control-plane"]; !ok {
		t.Errorf("the approver's nodeSelector %v: want the control plane by default", spec.NodeSelector)
	}
	a := spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		t.Fatal("the approver has no required node affinity that keeps it off the agents' hosts")
	}
	// A host the agents select has every label of agentSelector: it must
	// match none of the terms.
	agentHost := map[string]string{"node-role.kubernetes.io/control-plane": ""}
	for k, v := range agentSelector {
		agentHost[k] = v
	}
	for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		matches := len(term.MatchExpressions) > 0
		for _, e := range term.MatchExpressions {
			v, has := agentHost[e.Key]
			switch e.Operator {
			case corev1.NodeSelectorOpNotIn:
				matches = matches && (!has || !slices.Contains(e.Values, v))
			case corev1.NodeSelectorOpDoesNotExist:
				matches = matches && !has
			default:
				t.Errorf("the approver's node affinity uses %s; the test reads NotIn and DoesNotExist", e.Operator)
			}
		}
		if matches {
			t.Errorf("the approver's node affinity term %v admits a host of the agents' nodeSelector %v", term, agentSelector)
		}
	}
}

// sar asks the API server whether user in groups may do attrs.
func sar(ctx context.Context, env *k8stest.Env, user string, groups []string, attrs authorizationv1.ResourceAttributes) (bool, error) {
	got, err := env.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{User: user, Groups: groups, ResourceAttributes: &attrs},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, err
	}
	return got.Status.Allowed, nil
}

// escalations are what a stolen agent credential was good for before the
// agent acted as its Node (issue 36): each is denied to the agent's
// ServiceAccount and to the bootstrap tokens' group.
var escalations = []authorizationv1.ResourceAttributes{
	{Namespace: "kube-system", Verb: "create", Resource: "serviceaccounts", Subresource: "token", Name: "generic-garbage-collector"},
	{Namespace: "kube-system", Verb: "get", Resource: "secrets", Name: "anything"},
	{Namespace: "default", Verb: "list", Resource: "pods"},
	{Namespace: "default", Verb: "delete", Resource: "pods", Name: "anything"},
	{Namespace: "default", Verb: "patch", Resource: "pods", Subresource: "status", Name: "anything"},
	{Namespace: "default", Verb: "patch", Resource: "persistentvolumeclaims", Subresource: "status", Name: "anything"},
	{Verb: "get", Resource: "persistentvolumes", Name: "anything"},
	{Verb: "create", Resource: "nodes"},
	{Verb: "patch", Resource: "nodes", Name: "any-node"},
	{Verb: "patch", Resource: "nodes", Subresource: "status", Name: "any-node"},
	{Verb: "delete", Group: "storage.k8s.io", Resource: "csinodes", Name: "any-node"},
	{Namespace: "kube-node-lease", Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Name: "any-node"},
	{Verb: "create", Group: "certificates.k8s.io", Resource: "certificatesigningrequests", Subresource: "nodeclient"},
	{Verb: "create", Group: "certificates.k8s.io", Resource: "certificatesigningrequests", Subresource: "selfnodeclient"},
	{Verb: "approve", Group: "certificates.k8s.io", Resource: "signers", Name: "kubernetes.io/kube-apiserver-client-kubelet"},
	{Verb: "update", Group: "certificates.k8s.io", Resource: "certificatesigningrequests", Subresource: "approval", Name: "anything"},
}

// bootstrapAccess is what the bootstrap identities may do: ask for a
// certificate and wait for it.
var bootstrapAccess = []authorizationv1.ResourceAttributes{
	{Verb: "create", Group: "certificates.k8s.io", Resource: "certificatesigningrequests"},
	{Verb: "list", Group: "certificates.k8s.io", Resource: "certificatesigningrequests"},
	{Verb: "watch", Group: "certificates.k8s.io", Resource: "certificatesigningrequests"},
}

// TestAgentCredentialsCannotEscalate installs the RBAC of deploy/base (for
// the agent's ServiceAccount, moved to the test's namespace) and of
// deploy/systemd (for the bootstrap tokens' group) and asks the API server
// what each may do: ask for a certificate, and none of what made a stolen
// agent credential a cluster's (a token of any ServiceAccount, any Secret,
// any Node's objects, approving node certificates). The agent's Node
// identity is held by the Node authorizer to its own Node (its Node, not
// another; the Secret its pod's volume names, not another).
func TestAgentCredentialsCannotEscalate(t *testing.T) {
	env, _ := apiServer(t)
	f := env.NewFixture(t)
	ctx := t.Context()

	base := render(t, "base")
	ds, _ := agentDaemonSet(t, base)
	installGrants(t, env, agentGrants(t, env, base, ds.Namespace, ds.Spec.Template.Spec.ServiceAccountName), f.Namespace, f.Namespace, agentName)
	sa := env.ImpersonateServiceAccount(f.Namespace, agentName).Impersonate

	systemd := render(t, "systemd")
	binding := convert[rbacv1.ClusterRoleBinding](t, find(t, systemd, "ClusterRoleBinding", "", "csi-volmgr-bootstrappers"))
	if _, err := env.Client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ignoreNotFound(t, env.Client.RbacV1().ClusterRoleBindings().Delete(cleanupContext(t), binding.Name, metav1.DeleteOptions{}))
	})
	bootstrapGroups := []string{"system:bootstrappers", "system:bootstrappers:csi-volmgr", "system:bootstrappers:csi-volmgr:csi-volmgr-edge-1", "system:authenticated"}

	for who, id := range map[string]struct {
		user   string
		groups []string
	}{
		"ServiceAccount":  {sa.UserName, sa.Groups},
		"bootstrap token": {"system:bootstrap:abcdef", bootstrapGroups},
	} {
		t.Run(who, func(t *testing.T) {
			for _, attrs := range bootstrapAccess {
				// New bindings reach the authorizer through its informers.
				err := wait.PollUntilContextTimeout(ctx, pollInterval, authorizeTimeout, true, func(ctx context.Context) (bool, error) {
					ok, err := sar(ctx, env, id.user, id.groups, attrs)
					return err == nil && ok, nil
				})
				if err != nil {
					t.Errorf("%s may not %s %s: it cannot ask for its Node's certificate", id.user, attrs.Verb, attrs.Resource)
				}
			}
			for _, attrs := range escalations {
				if ok, err := sar(ctx, env, id.user, id.groups, attrs); err != nil || ok {
					t.Errorf("%s may %s %s/%s %s/%s (%v)", id.user, attrs.Verb, attrs.Resource, attrs.Subresource, attrs.Namespace, attrs.Name, err)
				}
			}
		})
	}

	// The Node identity: the Node authorizer, not RBAC, answers.
	node := "csi-volmgr-" + f.NodeName
	asNode := func(attrs authorizationv1.ResourceAttributes) bool {
		ok, err := sar(ctx, env, "system:node:"+node, []string{"system:nodes", "system:authenticated"}, attrs)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	for _, tc := range []struct {
		attrs authorizationv1.ResourceAttributes
		want  bool
	}{
		{authorizationv1.ResourceAttributes{Verb: "get", Resource: "nodes", Name: node}, true},
		{authorizationv1.ResourceAttributes{Verb: "get", Resource: "nodes", Name: f.NodeName}, false},
		{authorizationv1.ResourceAttributes{Namespace: "kube-node-lease", Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Name: f.NodeName}, false},
		{authorizationv1.ResourceAttributes{Verb: "delete", Group: "storage.k8s.io", Resource: "csinodes", Name: f.NodeName}, false},
		{authorizationv1.ResourceAttributes{Namespace: f.Namespace, Verb: "get", Resource: "secrets", Name: "anything"}, false},
		{authorizationv1.ResourceAttributes{Namespace: "kube-system", Verb: "create", Resource: "serviceaccounts", Subresource: "token", Name: "generic-garbage-collector"}, false},
		{authorizationv1.ResourceAttributes{Namespace: f.Namespace, Verb: "list", Resource: "pods"}, false},
	} {
		a := tc.attrs
		if got := asNode(a); got != tc.want {
			t.Errorf("may system:node:%s %s %s %s/%s: %v, want %v", node, a.Verb, strings.TrimSuffix(a.Resource+"/"+a.Subresource, "/"), a.Namespace, a.Name, got, tc.want)
		}
	}
}
