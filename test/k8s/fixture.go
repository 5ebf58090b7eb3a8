package k8stest

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/nodeowner"
)

// cleanupTimeout bounds each cleanup call; cleanups run after t.Context()
// is canceled.
const cleanupTimeout = 30 * time.Second

// Fixture is one test's share of an environment.
type Fixture struct {
	// Env is the environment the fixture lives in.
	Env *Env
	// Config is a copy of Env.Config (admin) that the test may change.
	Config *rest.Config
	// Client is Env.Client.
	Client kubernetes.Interface
	// Namespace was created for this test and is deleted when it ends.
	Namespace string
	// NodeName is unique to this test and a valid Node name and label
	// value. No Node exists until the test creates one (see CreateNode).
	NodeName string
}

// NewFixture creates a namespace for tb and picks a node name; both are
// derived from tb.Name() plus a random suffix, so they are unique and tell
// which test made them. The namespace is deleted when tb ends; envtest runs
// no namespace controller, so its objects stay, but no other test sees them.
func (e *Env) NewFixture(tb testing.TB) *Fixture {
	tb.Helper()
	name := UniqueName(tb.Name())
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := e.Client.CoreV1().Namespaces().Create(tb.Context(), ns, metav1.CreateOptions{}); err != nil {
		tb.Fatalf("k8stest: creating namespace %s: %v", name, err)
	}
	tb.Cleanup(func() {
		deleteIgnoringNotFound(tb, "namespace", name, e.Client.CoreV1().Namespaces().Delete)
	})
	return &Fixture{
		Env:       e,
		Config:    rest.CopyConfig(e.Config),
		Client:    e.Client,
		Namespace: name,
		NodeName:  name,
	}
}

// CreateNode creates the Node named f.NodeName, labelled
// kubernetes.io/hostname=f.NodeName and nodeowner.Label=nodeowner.Value
// (the agent acts only on such a Node; mutate may delete it to make a
// kubelet's Node) and changed by mutate, and deletes it when tb ends. It
// returns the created Node (with UID and resourceVersion).
func (f *Fixture) CreateNode(tb testing.TB, mutate ...func(*corev1.Node)) *corev1.Node {
	tb.Helper()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:   f.NodeName,
		Labels: map[string]string{corev1.LabelHostname: f.NodeName, nodeowner.Label: nodeowner.Value},
	}}
	for _, fn := range mutate {
		fn(node)
	}
	created, err := f.Client.CoreV1().Nodes().Create(tb.Context(), node, metav1.CreateOptions{})
	if err != nil {
		tb.Fatalf("k8stest: creating Node %s: %v", node.Name, err)
	}
	tb.Cleanup(func() {
		deleteIgnoringNotFound(tb, "Node", created.Name, f.Client.CoreV1().Nodes().Delete)
	})
	return created
}

func deleteIgnoringNotFound(tb testing.TB, kind, name string,
	del func(ctx context.Context, name string, opts metav1.DeleteOptions) error) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(tb.Context()), cleanupTimeout)
	defer cancel()
	if err := del(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		tb.Errorf("k8stest: deleting %s %s: %v", kind, name, err)
	}
}

var invalidNameChars = regexp.MustCompile(`[^a-z0-9]+`)

// uniqueSuffixLen is the length of UniqueName's random suffix.
const uniqueSuffixLen = 5

// UniqueName turns testName into a DNS-1123 label (at most 63 characters,
// lower-case alphanumerics and '-') that ends in a random suffix, e.g.
// "TestInstall/two_drivers" → "testinstall-two-drivers-x7k2p". It is valid as
// a namespace, object name and label value.
func UniqueName(testName string) string {
	base := strings.Trim(invalidNameChars.ReplaceAllString(strings.ToLower(testName), "-"), "-")
	maxBase := validation.DNS1123LabelMaxLength - 1 - uniqueSuffixLen
	if len(base) > maxBase {
		base = strings.TrimRight(base[:maxBase], "-")
	}
	suffix := utilrand.String(uniqueSuffixLen)
	if base == "" {
		return "t-" + suffix
	}
	return base + "-" + suffix
}
