//go:build drivers

package secretsstore_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/mount-utils"

	"github.com/csi-volmgr/csi-volmgr/test/agent/agenttest"
	"github.com/csi-volmgr/csi-volmgr/test/drivers/drivertest"
	"github.com/csi-volmgr/csi-volmgr/test/process"
)

const (
	// nodeLabel is the label of a SecretProviderClassPodStatus naming the node (the driver's
	// --nodeid) that mounted it.
	nodeLabel = "internal.secrets-store.csi.k8s.io/node-name"
)

// providerMount is one line of the provider's record (tools/fakeprovider).
type providerMount struct {
	Time   time.Time `json:"time"`
	Pod    string    `json:"pod"`
	PodUID string    `json:"podUID"`
	Tokens string    `json:"tokens"`
}

// lifecycle is one run of the agent with the driver.
type lifecycle struct {
	t      *testing.T
	m      *matrix
	node   string
	agent  *agenttest.Agent
	driver *process.Process
	pod    *corev1.Pod
	target string
	// dev is the device of the tmpfs the driver mounted at target.
	dev uint64
}

func runLifecycle(t *testing.T, rec *drivertest.Recorder, m *matrix) {
	l := &lifecycle{t: t, m: m, node: uniqueNode()}
	rec.Step("node plugin registered with the agent acting as its Node", l.start)
	rec.Step("pod with an inline volume on the agent's Node: VolumesReady", l.podReady)
	rec.Step("the provider's files read through the pod's path", l.filesServed)
	rec.Step("SecretProviderClassPodStatus of the driver names the pod", l.podStatus)
	rec.Step("service account token minted for the pod, audience checked by TokenReview", l.token)
	rec.Step("the token is nowhere in the agent's log (-v=5)", l.tokenNotLogged)
	var intervals []time.Duration
	rec.Step("requiresRepublish: NodePublishVolume again every --republish-period, files rotated", func() error {
		var err error
		intervals, err = l.republish()
		return err
	})
	if len(intervals) > 0 {
		rec.Note("requiresRepublish: csi-volmgr called NodePublishVolume again every %v here (--republish-period=%v; "+
			"default 1m, as the kubelet's pod sync, about every 60-90s); the driver rotated the files on each call "+
			"(--enable-secret-rotation, --rotation-poll-interval=%v)", intervals, republishPeriod, rotationPollInterval)
	}
	rec.Step("node plugin SIGKILLed and restarted while published: the pod's path serves on, the same tmpfs", l.driverRestart)
	rec.Step("pod deleted: unpublished, nothing left mounted, the pod's deletion completed", l.teardown)
	rec.Step("SecretProviderClassPodStatus removed (garbage collector, ownerReference to the pod)", l.podStatusGone)
}

// start starts the agent as its Node, the provider, the node plugin with its production flags
// and its registrar, and waits until the agent published the driver in its CSINode.
func (l *lifecycle) start() error {
	t, m := l.t, l.m
	// The agent's Node certificate, as a bootstrap (CSR) would have left it in its --cert-dir:
	// the agent acts as system:node:<node> and asks for nothing more.
	a, err := drivertest.AgentAsNode(t, m.env, l.node, 5, "--republish-period="+republishPeriod.String())
	if err != nil {
		return err
	}
	l.agent = a

	providers := filepath.Join(l.agent.Dir, "providers")
	if err := os.MkdirAll(providers, 0o750); err != nil {
		return err
	}
	drivertest.StartProc(t, m.dir, "provider", drivertest.Binary(t, binDir, "secrets-store-e2e-provider"), nil,
		"--endpoint="+filepath.Join(providers, providerName+".sock"), "--record="+m.providerRecord)
	flags := pluginFlags(l.agent.RootDir, l.node, providers, filepath.Join(l.agent.Dir, "providers-extra"), "127.0.0.1:"+drivertest.FreePort(t), true)
	sock := filepath.Join(l.agent.RootDir, "plugins", "csi-secrets-store", "csi.sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o750); err != nil {
		return err
	}
	l.driver = drivertest.StartProc(t, m.dir, "secrets-store-csi-driver", drivertest.Binary(t, binDir, "secrets-store-csi-driver"), m.pluginEnv(), flags...)
	drivertest.ServeRegistration(t, l.agent.RegistrationDir, driverName, sock)
	if err := l.agent.Start(t.Context()); err != nil {
		return err
	}
	return l.poll("the driver in the Node's CSINode", drivertest.DriverInCSINode(m.env.Client, l.node, driverName, l.node))
}

func (l *lifecycle) podReady() error {
	ctx := l.t.Context()
	pod, err := l.m.env.Client.CoreV1().Pods(appNamespace).Create(ctx, appPod(l.node), metav1.CreateOptions{})
	if err != nil {
		return err
	}
	l.pod = pod
	l.target = targetPath(l.agent.RootDir, string(pod.UID))
	return l.poll("the pod's VolumesReady condition", func(ctx context.Context) (bool, error) {
		return l.ready(ctx)
	})
}

func (l *lifecycle) ready(ctx context.Context) (bool, error) {
	return drivertest.VolumesReady(ctx, l.m.env.Client, appNamespace, podName)
}

func (l *lifecycle) filesServed() error {
	mounted, err := mount.New("").IsMountPoint(l.target)
	if err != nil {
		return err
	}
	if !mounted {
		return fmt.Errorf("target path %s is not a mount point", l.target)
	}
	if err := l.expectFile("api-key", "first"); err != nil {
		return err
	}
	if err := l.expectFile("pod-name", podName); err != nil {
		return fmt.Errorf("%w (the pod's name reaches the provider only through podInfoOnMount)", err)
	}
	l.dev, err = drivertest.MountDevice(l.target)
	return err
}

func (l *lifecycle) expectFile(name, want string) error {
	b, err := os.ReadFile(filepath.Join(l.target, name))
	if err != nil {
		return err
	}
	if string(b) != want {
		return fmt.Errorf("%s in the pod's path is %q, want %q", name, b, want)
	}
	return nil
}

func (l *lifecycle) podStatus() error {
	return l.poll("the SecretProviderClassPodStatus of the pod", func(ctx context.Context) (bool, error) {
		list, err := l.m.dyn.Resource(spcpsGVR).Namespace(appNamespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, u := range list.Items {
			field := func(name string) string {
				v, _, _ := unstructured.NestedString(u.Object, "status", name)
				return v
			}
			mountedNow, _, _ := unstructured.NestedBool(u.Object, "status", "mounted")
			if field("podName") == podName && field("secretProviderClassName") == spcName && u.GetLabels()[nodeLabel] == l.node &&
				field("targetPath") == l.target && mountedNow {
				return true, nil
			}
		}
		return false, nil
	})
}

// mounts are the provider's Mount calls for the pod.
func (l *lifecycle) mounts() ([]providerMount, error) {
	f, err := os.Open(l.m.providerRecord)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []providerMount
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var pm providerMount
		if err := json.Unmarshal(sc.Bytes(), &pm); err != nil {
			return nil, err
		}
		if pm.PodUID == string(l.pod.UID) {
			out = append(out, pm)
		}
	}
	return out, sc.Err()
}

// podToken is the token the provider received for the audience.
func (l *lifecycle) podToken() (string, error) {
	ms, err := l.mounts()
	if err != nil {
		return "", err
	}
	if len(ms) == 0 {
		return "", errors.New("the provider got no Mount call for the pod")
	}
	var tokens map[string]struct {
		Token               string    `json:"token"`
		ExpirationTimestamp time.Time `json:"expirationTimestamp"`
	}
	if err := json.Unmarshal([]byte(ms[len(ms)-1].Tokens), &tokens); err != nil {
		return "", fmt.Errorf("csi.storage.k8s.io/serviceAccount.tokens as the provider got it: %w", err)
	}
	tok, ok := tokens[audience]
	if !ok || tok.Token == "" {
		keys := make([]string, 0, len(tokens))
		for k := range tokens {
			keys = append(keys, k)
		}
		return "", fmt.Errorf("no token for the audience %q (audiences %v)", audience, keys)
	}
	return tok.Token, nil
}

func (l *lifecycle) token() error {
	tok, err := l.podToken()
	if err != nil {
		return err
	}
	tr, err := l.m.env.Client.AuthenticationV1().TokenReviews().Create(l.t.Context(), &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: tok, Audiences: []string{audience}},
	}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	st := tr.Status
	if !st.Authenticated || !slices.Contains(st.Audiences, audience) {
		return fmt.Errorf("TokenReview for the audience %s: authenticated %v, audiences %v, error %q", audience, st.Authenticated, st.Audiences, st.Error)
	}
	if want := "system:serviceaccount:" + appNamespace + ":" + appServiceAccount; st.User.Username != want {
		return fmt.Errorf("the token is %s's, want %s's", st.User.Username, want)
	}
	if got := st.User.Extra["authentication.kubernetes.io/pod-name"]; len(got) != 1 || got[0] != podName {
		return fmt.Errorf("the token is bound to the pod %v, want %s", got, podName)
	}
	if got := st.User.Extra["authentication.kubernetes.io/node-name"]; len(got) != 1 || got[0] != l.node {
		return fmt.Errorf("the token names the node %v, want %s", got, l.node)
	}
	return nil
}

func (l *lifecycle) tokenNotLogged() error {
	tok, err := l.podToken()
	if err != nil {
		return err
	}
	return drivertest.TokenNotLogged(l.agent.LogFile, tok)
}

// republish changes the SecretProviderClass and waits until the new files are in the pod's
// path: the driver calls the provider again only on a NodePublishVolume, which only the agent's
// republish sends. It returns the intervals between the provider's calls for the pod.
func (l *lifecycle) republish() ([]time.Duration, error) {
	ctx := l.t.Context()
	u, err := l.m.dyn.Resource(spcGVR).Namespace(appNamespace).Get(ctx, spcName, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if err := unstructured.SetNestedField(u.Object, `{"api-key":"second"}`, "spec", "parameters", "files"); err != nil {
		return nil, err
	}
	if _, err := l.m.dyn.Resource(spcGVR).Namespace(appNamespace).Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		return nil, err
	}
	began := time.Now()
	if err := l.poll("the rotated file in the pod's path", func(context.Context) (bool, error) {
		return l.expectFile("api-key", "second") == nil, nil
	}); err != nil {
		return nil, err
	}
	if err := l.sameMount(); err != nil {
		return nil, err
	}
	// Two more republishes, to measure their period.
	var ms []providerMount
	if err := l.poll("two more republishes", func(context.Context) (bool, error) {
		ms, err = l.mounts()
		if err != nil {
			return false, err
		}
		n := 0
		for _, pm := range ms {
			if pm.Time.After(began) {
				n++
			}
		}
		return n >= 3, nil
	}); err != nil {
		return nil, err
	}
	var intervals []time.Duration
	for i := 1; i < len(ms); i++ {
		intervals = append(intervals, ms[i].Time.Sub(ms[i-1].Time).Round(100*time.Millisecond))
	}
	for _, d := range intervals {
		if d < republishPeriod/2 || d > 3*republishPeriod {
			return intervals, fmt.Errorf("republish intervals %v, want about --republish-period=%v", intervals, republishPeriod)
		}
	}
	return intervals, nil
}

// sameMount checks that the pod's path is still the tmpfs the driver mounted at first.
func (l *lifecycle) sameMount() error { return drivertest.SameMount(l.target, l.dev) }

func (l *lifecycle) driverRestart() error {
	before, err := l.mounts()
	if err != nil {
		return err
	}
	killed := time.Now()
	if err := l.driver.Kill(); err != nil {
		return err
	}
	<-l.driver.Exited()
	// With the plugin gone, the pod's files are still there: a tmpfs lives in the kernel.
	if err := l.expectFile("api-key", "second"); err != nil {
		return fmt.Errorf("with the node plugin killed: %w", err)
	}
	// A republish fails while the plugin is down; the mount must stay.
	if err := l.poll("a failed republish (FailedMount) with the node plugin killed",
		drivertest.WarningEventSince(l.m.env.Client, l.pod, "FailedMount", killed)); err != nil {
		return err
	}
	if err := l.sameMount(); err != nil {
		return fmt.Errorf("with the node plugin killed: %w", err)
	}
	if err := l.driver.Restart(l.t.Context()); err != nil {
		return err
	}
	restarted := time.Now()
	// The restarted plugin gets the republishes: the provider is called again for the pod.
	if err := l.poll("a republish through the restarted node plugin", func(context.Context) (bool, error) {
		ms, err := l.mounts()
		if err != nil {
			return false, err
		}
		return len(ms) > len(before) && ms[len(ms)-1].Time.After(restarted), nil
	}); err != nil {
		return err
	}
	if err := l.sameMount(); err != nil {
		return err
	}
	if err := l.expectFile("api-key", "second"); err != nil {
		return err
	}
	ok, _ := l.ready(l.t.Context())
	if !ok {
		return errors.New("VolumesReady is no longer True after the restart")
	}
	return nil
}

func (l *lifecycle) teardown() error {
	ctx := l.t.Context()
	if err := l.m.env.Client.CoreV1().Pods(appNamespace).Delete(ctx, podName, metav1.DeleteOptions{}); err != nil {
		return err
	}
	// --register-node: the agent tears the pod's volumes down and completes its deletion.
	if err := l.poll("the pod's deletion completed by the agent", drivertest.PodGone(l.m.env.Client, appNamespace, podName)); err != nil {
		return err
	}
	if err := drivertest.NothingLeft(l.agent, l.poll); err != nil {
		return err
	}
	return nil
}

func (l *lifecycle) podStatusGone() error {
	return l.poll("no SecretProviderClassPodStatus left", func(ctx context.Context) (bool, error) {
		list, err := l.m.dyn.Resource(spcpsGVR).Namespace(appNamespace).List(ctx, metav1.ListOptions{})
		return err == nil && len(list.Items) == 0, nil
	})
}

func (l *lifecycle) poll(what string, cond wait.ConditionWithContextFunc) error {
	return drivertest.Poll(l.t.Context(), what, cond)
}
