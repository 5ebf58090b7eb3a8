package deploy_test

import (
	"slices"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// workloadsNamespace is the example namespace of
// deploy/namespaced-secrets/secrets-role.yaml: where the users' Secrets are.
const workloadsNamespace = "workloads"

// inNamespace moves the grants of the manifests' example workloads
// namespace into ns, the scenario's namespace, where its Secret is.
func inNamespace(grants []grant, ns string) []grant {
	out := slices.Clone(grants)
	for i := range out {
		if out[i].Kind == "Role" && out[i].Namespace == workloadsNamespace {
			out[i].Namespace = ns
		}
	}
	return out
}

// TestAgentWithNamespacedSecretsRBAC: deploy/namespaced-secrets grants no
// cluster-wide Secret access, only "get" in the workloads' namespace. The
// agent of deploy/kind, whose scenario the RBAC tests run (a virtual node,
// --register-node), with its grants but Secrets granted as
// namespaced-secrets grants them, still publishes the scenario's volume
// with its node-publish Secret and tears it down without one denied
// request, and may read no Secret of another namespace.
func TestAgentWithNamespacedSecretsRBAC(t *testing.T) {
	env, audit := apiServer(t)
	objs := render(t, "namespaced-secrets")
	ds, _ := agentDaemonSet(t, objs)
	overlay := agentGrants(t, objs, ds.Namespace, ds.Spec.Template.Spec.ServiceAccountName)
	for _, a := range accesses(overlay) {
		if a.Resource == "secrets" {
			for _, g := range overlay {
				if g.Kind == "ClusterRole" && slices.Contains(accesses([]grant{g}), a) {
					t.Errorf("ClusterRole %s still grants %s", g.Name, a)
				}
			}
		}
	}
	grants, roles := []grant(nil), []grant(nil)
	for _, g := range overlay {
		if g.Kind == "Role" && g.Namespace == workloadsNamespace {
			roles = append(roles, g)
		}
	}
	if len(roles) == 0 {
		t.Fatalf("no Role in namespace %s is bound to the agent: %+v", workloadsNamespace, overlay)
	}
	agent, kind := kindAgent(t)
	grants = append(without(kind, access{Verb: "get", Group: "", Resource: "secrets"}), roles...)

	s := runWithoutDenials(t, env, audit, agent, grants, true)
	for ns, want := range map[string]bool{s.f.Namespace: true, "kube-system": false, "default": false} {
		review, err := env.Client.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{
				User:               s.User,
				Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + s.f.Namespace, "system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: "get", Resource: "secrets", Name: "anything"},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if review.Status.Allowed != want {
			t.Errorf("may the agent get a Secret in %s: %v, want %v", ns, review.Status.Allowed, want)
		}
	}
}
