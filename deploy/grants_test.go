package deploy_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

// authorizeTimeout bounds the wait for new grants to take effect.
const authorizeTimeout = 30 * time.Second

// grant is one ClusterRole or Role that the manifests bind to a subject
// (the agent's ServiceAccount, the approver's, a group of bootstrap
// tokens), with the namespace of the binding for a Role.
type grant struct {
	// Kind is ClusterRole or Role.
	Kind string
	// Namespace is the Role's namespace; empty for a ClusterRole.
	Namespace string
	Name      string
	Rules     []rbacv1.PolicyRule
	// BuiltIn is a ClusterRole of the API server's bootstrap policy
	// (system:node-bootstrapper), which the manifests bind but do not
	// define: its rules are read from the API server.
	BuiltIn bool
}

// agentGrants returns the roles that objs bind to the ServiceAccount
// saNamespace/saName.
func agentGrants(tb testing.TB, env *k8stest.Env, objs []*unstructured.Unstructured, saNamespace, saName string) []grant {
	tb.Helper()
	return grantsOf(tb, env, objs, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: saName, Namespace: saNamespace})
}

// grantsOf returns the roles that objs bind to subject. A ClusterRole that
// objs bind but do not define must be one of the API server's built-in
// roles (system:...): its rules are read from env, or left empty when env
// is nil. A RoleBinding to a ClusterRole is not used by the manifests and
// is refused, so that no grant escapes the test.
func grantsOf(tb testing.TB, env *k8stest.Env, objs []*unstructured.Unstructured, subject rbacv1.Subject) []grant {
	tb.Helper()
	boundTo := func(subjects []rbacv1.Subject) bool {
		return slices.ContainsFunc(subjects, func(s rbacv1.Subject) bool {
			return s.Kind == subject.Kind && s.Name == subject.Name && s.Namespace == subject.Namespace
		})
	}
	var grants []grant
	for _, b := range ofKind[rbacv1.ClusterRoleBinding](tb, objs, "ClusterRoleBinding") {
		if !boundTo(b.Subjects) {
			continue
		}
		if b.RoleRef.Kind != "ClusterRole" {
			tb.Fatalf("ClusterRoleBinding %s refers to a %s", b.Name, b.RoleRef.Kind)
		}
		grants = append(grants, clusterRole(tb, env, objs, b.RoleRef.Name))
	}
	for _, b := range ofKind[rbacv1.RoleBinding](tb, objs, "RoleBinding") {
		if !boundTo(b.Subjects) {
			continue
		}
		if b.RoleRef.Kind != "Role" {
			tb.Fatalf("RoleBinding %s/%s refers to a %s; the test handles Roles only", b.Namespace, b.Name, b.RoleRef.Kind)
		}
		role := convert[rbacv1.Role](tb, find(tb, objs, "Role", b.Namespace, b.RoleRef.Name))
		grants = append(grants, grant{Kind: "Role", Namespace: role.Namespace, Name: role.Name, Rules: role.Rules})
	}
	if len(grants) == 0 {
		tb.Fatalf("no role is bound to %s %s/%s", subject.Kind, subject.Namespace, subject.Name)
	}
	return grants
}

// clusterRole returns the ClusterRole name of objs, or the API server's
// built-in one.
func clusterRole(tb testing.TB, env *k8stest.Env, objs []*unstructured.Unstructured, name string) grant {
	tb.Helper()
	for _, o := range objs {
		if o.GetKind() == "ClusterRole" && o.GetName() == name {
			role := convert[rbacv1.ClusterRole](tb, o)
			return grant{Kind: "ClusterRole", Name: role.Name, Rules: role.Rules}
		}
	}
	if !strings.HasPrefix(name, "system:") {
		tb.Fatalf("the manifests bind the ClusterRole %s, which they do not define and which is not a built-in one", name)
	}
	g := grant{Kind: "ClusterRole", Name: name, BuiltIn: true}
	if env != nil {
		role, err := env.Client.RbacV1().ClusterRoles().Get(tb.Context(), name, metav1.GetOptions{})
		if err != nil {
			tb.Fatalf("the built-in ClusterRole %s: %v", name, err)
		}
		g.Rules = role.Rules
	}
	return g
}

// accesses lists every (verb, group, resource) the grants allow, in order.
func accesses(grants []grant) []access {
	var out []access
	for _, g := range grants {
		for _, r := range g.Rules {
			for _, group := range r.APIGroups {
				for _, res := range r.Resources {
					for _, verb := range r.Verbs {
						a := access{Verb: verb, Group: group, Resource: res}
						if !slices.Contains(out, a) {
							out = append(out, a)
						}
					}
				}
			}
		}
	}
	return out
}

// without returns a copy of grants in which no rule allows acc; every other
// (verb, group, resource) stays allowed, with its resourceNames.
func without(grants []grant, acc access) []grant {
	out := make([]grant, 0, len(grants))
	for _, g := range grants {
		g.Rules = slices.Clone(g.Rules)
		var rules []rbacv1.PolicyRule
		for _, r := range g.Rules {
			if !slices.Contains(r.APIGroups, acc.Group) || !slices.Contains(r.Resources, acc.Resource) || !slices.Contains(r.Verbs, acc.Verb) {
				rules = append(rules, r)
				continue
			}
			// Split the rule: the other groups and resources keep every
			// verb; the group/resource of acc keeps the other verbs.
			if others := slices.DeleteFunc(slices.Clone(r.APIGroups), func(s string) bool { return s == acc.Group }); len(others) > 0 {
				rest := *r.DeepCopy()
				rest.APIGroups = others
				rules = append(rules, rest)
			}
			if others := slices.DeleteFunc(slices.Clone(r.Resources), func(s string) bool { return s == acc.Resource }); len(others) > 0 {
				rest := *r.DeepCopy()
				rest.APIGroups, rest.Resources = []string{acc.Group}, others
				rules = append(rules, rest)
			}
			if verbs := slices.DeleteFunc(slices.Clone(r.Verbs), func(s string) bool { return s == acc.Verb }); len(verbs) > 0 {
				rest := *r.DeepCopy()
				rest.APIGroups, rest.Resources, rest.Verbs = []string{acc.Group}, []string{acc.Resource}, verbs
				rules = append(rules, rest)
			}
		}
		g.Rules = rules
		out = append(out, g)
	}
	return out
}

// installGrants creates the grants under names prefixed with prefix (a
// built-in role as a copy of its rules, so that a test can remove one) and
// binds them to the ServiceAccount saNamespace/saName, for the rest of the
// test.
func installGrants(t testing.TB, env *k8stest.Env, grants []grant, prefix, saNamespace, saName string) {
	t.Helper()
	ctx := t.Context()
	rbac := env.Client.RbacV1()
	subjects := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: saName, Namespace: saNamespace}}
	labels := map[string]string{"csi-volmgr.io/test": prefix}
	for _, g := range grants {
		name := fmt.Sprintf("%s-%s", prefix, strings.ReplaceAll(g.Name, ":", "-"))
		meta := metav1.ObjectMeta{Name: name, Namespace: g.Namespace, Labels: labels}
		ref := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: g.Kind, Name: name}
		var err error
		switch g.Kind {
		case "ClusterRole":
			if _, err = rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: meta, Rules: g.Rules}, metav1.CreateOptions{}); err == nil {
				_, err = rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: meta, RoleRef: ref, Subjects: subjects}, metav1.CreateOptions{})
			}
			t.Cleanup(func() {
				ctx := cleanupContext(t)
				ignoreNotFound(t, rbac.ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{}))
				ignoreNotFound(t, rbac.ClusterRoles().Delete(ctx, name, metav1.DeleteOptions{}))
			})
		case "Role":
			if _, err = rbac.Roles(g.Namespace).Create(ctx, &rbacv1.Role{ObjectMeta: meta, Rules: g.Rules}, metav1.CreateOptions{}); err == nil {
				_, err = rbac.RoleBindings(g.Namespace).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: meta, RoleRef: ref, Subjects: subjects}, metav1.CreateOptions{})
			}
			t.Cleanup(func() {
				ctx := cleanupContext(t)
				ignoreNotFound(t, rbac.RoleBindings(g.Namespace).Delete(ctx, name, metav1.DeleteOptions{}))
				ignoreNotFound(t, rbac.Roles(g.Namespace).Delete(ctx, name, metav1.DeleteOptions{}))
			})
		}
		if err != nil {
			t.Fatalf("installing %s %s: %v", g.Kind, name, err)
		}
	}
	waitAuthorized(t, env, grants, saNamespace, saName)
}

// waitAuthorized waits until the API server's authorizer, which learns of
// new roles and bindings through its informers, allows the ServiceAccount
// one access of every grant. Until then the agent would see Forbidden for
// requests its grants do allow.
func waitAuthorized(tb testing.TB, env *k8stest.Env, grants []grant, saNamespace, saName string) {
	tb.Helper()
	imp := env.ImpersonateServiceAccount(saNamespace, saName).Impersonate
	for _, g := range grants {
		acc := accesses([]grant{g})
		if len(acc) == 0 {
			continue
		}
		resource, subresource, _ := strings.Cut(acc[0].Resource, "/")
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: imp.UserName, Groups: imp.Groups,
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: g.Namespace, Verb: acc[0].Verb, Group: acc[0].Group, Resource: resource, Subresource: subresource,
			},
		}}
		err := wait.PollUntilContextTimeout(tb.Context(), pollInterval, authorizeTimeout, true, func(ctx context.Context) (bool, error) {
			got, err := env.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
			return err == nil && got.Status.Allowed, nil
		})
		if err != nil {
			tb.Fatalf("the API server does not authorize %s for %s after %v: %v", acc[0], imp.UserName, authorizeTimeout, err)
		}
	}
}

// cleanupContext is a context for cleanups, which run after t.Context() is
// canceled.
func cleanupContext(tb testing.TB) context.Context {
	return context.WithoutCancel(tb.Context())
}

// ignoreNotFound reports err unless it is nil or NotFound.
func ignoreNotFound(tb testing.TB, err error) {
	tb.Helper()
	if err != nil && !apierrors.IsNotFound(err) {
		tb.Errorf("cleanup: %v", err)
	}
}
