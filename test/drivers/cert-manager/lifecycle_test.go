//go:build drivers

package certmanager_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/mount-utils"

	"github.com/csi-volmgr/csi-volmgr/test/agent/agenttest"
	"github.com/csi-volmgr/csi-volmgr/test/drivers/drivertest"
	"github.com/csi-volmgr/csi-volmgr/test/process"
)

// lifecycle is one run of the agent with the driver.
type lifecycle struct {
	t        *testing.T
	m        *matrix
	node     string
	agent    *agenttest.Agent
	driver   *process.Process
	dataRoot string
	pod      *corev1.Pod
	target   string
	dev      uint64
	serial   string
}

func runLifecycle(t *testing.T, rec *drivertest.Recorder, m *matrix) {
	l := &lifecycle{t: t, m: m, node: strings.ToLower("cm-" + fmt.Sprint(time.Now().UnixNano()%1000000))}
	rec.Step("node plugin registered with the agent acting as its Node", l.start)
	rec.Step("pod with an inline volume on the agent's Node: VolumesReady", l.podReady)
	rec.Step("key pair in the pod's path, signed by the CA for the pod's DNS name", l.keyPair)
	rec.Step("CertificateRequest created with the pod's own token (audit log)", l.createdAsPod)
	rec.Step("the pod's token is nowhere in the agent's log (-v=5)", l.tokenNotLogged)
	rec.Step("requiresRepublish: NodePublishVolume repeated; the certificate renewed with the pod's token, in the same mount", l.renewed)
	rec.Step("node plugin SIGKILLed and restarted while published: the key pair served on, renewals go on", l.driverRestart)
	rec.Step("pod deleted: unpublished, nothing left mounted, the driver's data removed", l.teardown)
}

func (l *lifecycle) start() error {
	t, m := l.t, l.m
	a, err := drivertest.AgentAsNode(t, m.env, l.node, 5, "--republish-period="+republishPeriod.String())
	if err != nil {
		return err
	}
	l.agent = a
	// The driver's data directory (the chart's csiDataDir), where it mounts its tmpfs: outside
	// the agent's root, unmounted when the test ends.
	l.dataRoot = filepath.Join(m.dir, "csi-data-dir")
	t.Cleanup(func() { _ = mount.CleanupMountPoint(filepath.Join(l.dataRoot, "inmemfs"), mount.New(""), false) })
	sock := filepath.Join(l.agent.RootDir, "plugins", "cert-manager-csi-driver", "csi.sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o750); err != nil {
		return err
	}
	l.driver = drivertest.StartProcIn(t, "/", m.dir, "cert-manager-csi-driver", drivertest.Binary(t, binDir, "cert-manager-csi-driver"),
		m.pluginEnv(), pluginFlags(l.agent.RootDir, l.node, dataRootFlag(l.dataRoot), true)...)
	drivertest.ServeRegistration(t, l.agent.RegistrationDir, driverName, sock)
	if err := l.agent.Start(t.Context()); err != nil {
		return err
	}
	return l.poll("the driver in the Node's CSINode", drivertest.DriverInCSINode(m.env.Client, l.node, driverName, l.node))
}

func (l *lifecycle) podReady() error {
	pod, err := l.m.env.Client.CoreV1().Pods(appNamespace).Create(l.t.Context(), appPod(l.node), metav1.CreateOptions{})
	if err != nil {
		return err
	}
	l.pod = pod
	l.target = filepath.Join(l.agent.RootDir, "pods", string(pod.UID), "volumes", "kubernetes.io~csi", volumeName, "mount")
	err = l.poll("the pod's VolumesReady condition", func(ctx context.Context) (bool, error) { return l.ready(ctx) })
	if err != nil && l.m.signer.lastErr.Load() != nil {
		err = fmt.Errorf("%w (the signer's last error: %v)", err, l.m.signer.lastErr.Load())
	}
	return err
}

func (l *lifecycle) ready(ctx context.Context) (bool, error) {
	return drivertest.VolumesReady(ctx, l.m.env.Client, appNamespace, podName)
}

// certificate verifies the key pair in the pod's path and returns its serial number.
func (l *lifecycle) certificate() (string, error) {
	crt, err := os.ReadFile(filepath.Join(l.target, "tls.crt"))
	if err != nil {
		return "", err
	}
	key, err := os.ReadFile(filepath.Join(l.target, "tls.key"))
	if err != nil {
		return "", err
	}
	ca, err := os.ReadFile(filepath.Join(l.target, "ca.crt"))
	if err != nil {
		return "", err
	}
	if string(ca) != string(l.m.signer.caPEM) {
		return "", errors.New("ca.crt in the pod's path is not the signer's CA")
	}
	cert, err := l.m.signer.verify(crt, key, dnsName)
	if err != nil {
		return "", err
	}
	return cert.SerialNumber.String(), nil
}

func (l *lifecycle) keyPair() error {
	mounted, err := mount.New("").IsMountPoint(l.target)
	if err != nil {
		return err
	}
	if !mounted {
		return fmt.Errorf("target path %s is not a mount point", l.target)
	}
	if l.serial, err = l.certificate(); err != nil {
		return err
	}
	l.dev, err = drivertest.MountDevice(l.target)
	return err
}

// podCreations are the CertificateRequest creations made with the pod's token.
func (l *lifecycle) podCreations() (int, error) {
	events, err := l.m.creations()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range events {
		if e.ObjectRef.Namespace != appNamespace {
			continue
		}
		if e.User.Username != "system:serviceaccount:"+appNamespace+":"+appServiceAccount {
			return 0, fmt.Errorf("a CertificateRequest of the pod was created by %s, not with the pod's token", e.User.Username)
		}
		if got := e.User.Extra["authentication.kubernetes.io/pod-name"]; len(got) != 1 || got[0] != podName {
			return 0, fmt.Errorf("the token that created a CertificateRequest is bound to the pod %v, want %s", got, podName)
		}
		if got := e.User.Extra["authentication.kubernetes.io/node-name"]; len(got) != 1 || got[0] != l.node {
			return 0, fmt.Errorf("the token that created a CertificateRequest names the node %v, want %s", got, l.node)
		}
		n++
	}
	return n, nil
}

func (l *lifecycle) createdAsPod() error {
	return l.poll("the audit event of the CertificateRequest's creation", func(context.Context) (bool, error) {
		n, err := l.podCreations()
		return n >= 1, err
	})
}

// podToken is the token the driver got for the pod (the empty audience), from the volume's
// metadata the driver keeps in its data directory.
func (l *lifecycle) podToken() (string, error) {
	var tok string
	err := filepath.WalkDir(l.dataRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "metadata.json" {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var meta struct {
			VolumeContext map[string]string `json:"volumeContext"`
		}
		if err := json.Unmarshal(b, &meta); err != nil {
			return err
		}
		var tokens map[string]struct {
			Token string `json:"token"`
		}
		if err := json.Unmarshal([]byte(meta.VolumeContext["csi.storage.k8s.io/serviceAccount.tokens"]), &tokens); err != nil {
			return fmt.Errorf("%s: the tokens: %w", path, err)
		}
		tok = tokens[""].Token
		return nil
	})
	if err != nil {
		return "", err
	}
	if tok == "" {
		return "", fmt.Errorf("no token for the empty audience in the driver's metadata under %s", l.dataRoot)
	}
	return tok, nil
}

func (l *lifecycle) tokenNotLogged() error {
	tok, err := l.podToken()
	if err != nil {
		return err
	}
	return drivertest.TokenNotLogged(l.agent.LogFile, tok)
}

// renewed waits for the driver's renewal (two thirds of certLifetime): a new certificate in the
// same mount, requested with the pod's token again.
func (l *lifecycle) renewed() error {
	before, err := l.podCreations()
	if err != nil {
		return err
	}
	if err := l.waitNewCertificate("the renewed certificate in the pod's path"); err != nil {
		return err
	}
	after, err := l.podCreations()
	if err != nil {
		return err
	}
	if after <= before {
		return fmt.Errorf("no new CertificateRequest created with the pod's token (%d before, %d after)", before, after)
	}
	// Each NodePublishVolume of the published volume is logged by the driver (csi-lib's node
	// server) as a volume already registered: the agent's republishes.
	n := 0
	if err := l.poll("two republishes in the driver's log", func(context.Context) (bool, error) {
		log, err := os.ReadFile(filepath.Join(l.m.dir, "cert-manager-csi-driver.log"))
		n = strings.Count(string(log), "Volume already registered with storage backend")
		return n >= 2, err
	}); err != nil {
		return fmt.Errorf("%w: the driver logged %d republishes (--republish-period=%v)", err, n, republishPeriod)
	}
	return l.sameMount()
}

func (l *lifecycle) waitNewCertificate(what string) error {
	return wait.PollUntilContextTimeout(l.t.Context(), 200*time.Millisecond, 3*certLifetime, true, func(context.Context) (bool, error) {
		serial, err := l.certificate()
		if err != nil || serial == l.serial {
			return false, nil
		}
		l.serial = serial
		return true, nil
	})
}

func (l *lifecycle) sameMount() error { return drivertest.SameMount(l.target, l.dev) }

func (l *lifecycle) driverRestart() error {
	killed := time.Now()
	if err := l.driver.Kill(); err != nil {
		return err
	}
	<-l.driver.Exited()
	if _, err := l.certificate(); err != nil {
		return fmt.Errorf("with the node plugin killed: %w", err)
	}
	// A republish fails while the plugin is down; the mount must stay.
	if err := l.poll("a failed republish (FailedMount) with the node plugin killed",
		drivertest.WarningEventSince(l.m.env.Client, l.pod, "FailedMount", killed)); err != nil {
		return err
	}
	if err := l.driver.Restart(l.t.Context()); err != nil {
		return err
	}
	// The restarted driver manages the volume again from its data directory, and renews.
	if err := l.waitNewCertificate("a certificate renewed by the restarted node plugin"); err != nil {
		return fmt.Errorf("waiting for a certificate renewed by the restarted node plugin: %w", err)
	}
	if err := l.sameMount(); err != nil {
		return err
	}
	if ok, _ := l.ready(l.t.Context()); !ok {
		return errors.New("VolumesReady is no longer True after the restart")
	}
	return nil
}

func (l *lifecycle) teardown() error {
	ctx := l.t.Context()
	if err := l.m.env.Client.CoreV1().Pods(appNamespace).Delete(ctx, podName, metav1.DeleteOptions{}); err != nil {
		return err
	}
	if err := l.poll("the pod's deletion completed by the agent", drivertest.PodGone(l.m.env.Client, appNamespace, podName)); err != nil {
		return err
	}
	if err := drivertest.NothingLeft(l.agent, l.poll); err != nil {
		return err
	}
	if _, err := l.podToken(); err == nil {
		return errors.New("the driver's data directory still holds the volume's metadata")
	}
	return nil
}

func (l *lifecycle) poll(what string, cond wait.ConditionWithContextFunc) error {
	return drivertest.Poll(l.t.Context(), what, cond)
}
