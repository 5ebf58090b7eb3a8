package k8stest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/mod/modfile"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

const (
	// ModulePath is the module whose go.mod marks the repository root.
	ModulePath = "github.com/csi-volmgr/csi-volmgr"

	// AssetsEnv names the directory holding the binaries, as envtest and
	// setup-envtest use it. When unset, <repository root>/bin/k8s is used.
	AssetsEnv = "KUBEBUILDER_ASSETS"

	// DefaultStartTimeout bounds the start of etcd and of kube-apiserver
	// each. envtest's own default (20 s) is tight on a loaded 2-core machine.
	DefaultStartTimeout = 60 * time.Second

	// defaultStopTimeout bounds the graceful stop of each process.
	defaultStopTimeout = 20 * time.Second
)

// binaries are the files Start needs in the assets directory. kubectl is
// optional: only tests that shell out to it need it.
var binaries = []string{"kube-apiserver", "etcd"}

// Options configures an environment.
type Options struct {
	// AssetsDir holds kube-apiserver, etcd and kubectl. Empty means
	// $KUBEBUILDER_ASSETS if set, else <repository root>/bin/k8s. envtest's
	// per-binary overrides (TEST_ASSET_KUBE_APISERVER, ...) are not used.
	AssetsDir string

	// APIServerFlags are kube-apiserver flags (name without "--") that
	// replace envtest's value for the same flag or add to them, e.g.
	// {"feature-gates": {"SELinuxMount=true"}}.
	//
	// Authorization: envtest v0.25 already starts kube-apiserver with
	// --authorization-mode=RBAC (see controlplane.APIServer.defaultArgs), and
	// Env.Config authenticates as a member of system:masters, which RBAC
	// never restricts. RBAC is therefore enforced for any other identity:
	// a user from Env.AddUser, or a ServiceAccount impersonated with
	// Env.ImpersonateServiceAccount. {"authorization-mode": {"Node,RBAC"}}
	// adds the Node authorizer for tests that act as a kubelet.
	APIServerFlags map[string][]string

	// StartTimeout bounds the start of each of etcd and kube-apiserver.
	// Zero means DefaultStartTimeout.
	StartTimeout time.Duration

	// NodeClientSigner makes the API server trust a second client CA whose
	// key the Env holds (Env.Signer): kube-controller-manager signs
	// kubelet client certificates with it, and Env.NodeConfig issues a
	// system:node:<name> certificate directly.
	NodeClientSigner bool
}

// Env is a running etcd and kube-apiserver.
type Env struct {
	// Config authenticates as "admin" in group system:masters. Copy it
	// (rest.CopyConfig) before changing it.
	Config *rest.Config
	// Client is a clientset for Config.
	Client kubernetes.Interface
	// KubeConfig is a kubeconfig file's content for Config, for tools such
	// as kubectl.
	KubeConfig []byte
	// StartupDuration is the time from starting etcd until the API server
	// served the default namespace.
	StartupDuration time.Duration
	// Signer is the second client CA of Options.NodeClientSigner, nil
	// without it.
	Signer *Signer

	testEnv *envtest.Environment
	// certDir holds kube-apiserver's serving certificates and client CA.
	// It belongs to Env, not to envtest, so that it outlives a stop of the
	// API server and a restart serves with the same certificates.
	certDir string
	// apiServerMu serializes StopAPIServer and StartAPIServer and guards
	// apiServerDown.
	apiServerMu   sync.Mutex
	apiServerDown bool
}

// Start starts etcd and kube-apiserver and waits until the API server serves
// requests. The caller must call Stop (in a test: t.Cleanup). Most tests use
// the shared environment (Main, New) instead; Start is for tests that need
// different Options.
func Start(opts Options) (*Env, error) {
	dir, err := assetsDir(opts.AssetsDir)
	if err != nil {
		return nil, err
	}
	for _, name := range binaries {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return nil, fmt.Errorf("%s not found in %s: run \"make k8s-bins\": %w", name, dir, err)
		}
	}
	// envtest logs through controller-runtime's logger; route it to klog so
	// that it neither stays silent nor warns that no logger was set.
	ctrllog.SetLogger(klog.Background().WithName("envtest"))

	timeout := opts.StartTimeout
	if timeout == 0 {
		timeout = DefaultStartTimeout
	}
	certDir, err := os.MkdirTemp("", "k8stest-apiserver-")
	if err != nil {
		return nil, fmt.Errorf("creating the API server's certificate directory: %w", err)
	}
	apiServer := &envtest.APIServer{Path: filepath.Join(dir, "kube-apiserver"), CertDir: certDir}
	// Watches end within a second of SIGTERM rather than holding the
	// process for the whole stop timeout (see StopAPIServer).
	apiServer.Configure().Set("shutdown-watch-termination-grace-period", "1s")
	for name, values := range opts.APIServerFlags {
		apiServer.Configure().Set(name, values...)
	}
	testEnv := &envtest.Environment{
		ControlPlane: envtest.ControlPlane{
			APIServer:   apiServer,
			Etcd:        &envtest.Etcd{Path: filepath.Join(dir, "etcd")},
			KubectlPath: filepath.Join(dir, "kubectl"),
		},
		BinaryAssetsDirectory:    dir,
		ControlPlaneStartTimeout: timeout,
		ControlPlaneStopTimeout:  defaultStopTimeout,
	}

	began := time.Now()
	cfg, err := testEnv.Start()
	if err != nil {
		stopErr := testEnv.Stop()
		return nil, errors.Join(fmt.Errorf("starting etcd and kube-apiserver from %s: %w", dir, err), stopErr, os.RemoveAll(certDir))
	}
	startup := time.Since(began)

	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("creating clientset: %w", err), testEnv.Stop(), os.RemoveAll(certDir))
	}
	env := &Env{
		Config:          cfg,
		Client:          client,
		KubeConfig:      testEnv.KubeConfig,
		StartupDuration: startup,
		testEnv:         testEnv,
		certDir:         certDir,
	}
	if opts.NodeClientSigner {
		if env.Signer, err = newSigner(certDir); err == nil {
			err = env.trustSigner()
		}
		if err != nil {
			return nil, errors.Join(err, env.Stop())
		}
	}
	return env, nil
}

// Stop stops kube-apiserver and etcd and removes their data.
func (e *Env) Stop() error {
	e.apiServerMu.Lock()
	defer e.apiServerMu.Unlock()
	if err := e.testEnv.Stop(); err != nil {
		return fmt.Errorf("stopping etcd and kube-apiserver: %w", err)
	}
	if err := os.RemoveAll(e.certDir); err != nil {
		return fmt.Errorf("removing the API server's certificates: %w", err)
	}
	return nil
}

// StopAPIServer stops kube-apiserver the way a node drain or an upgrade
// does (SIGTERM, SIGKILL after 20 s) and leaves etcd running with all the
// data: an API server outage. Clients see refused connections until
// StartAPIServer; their watches end. Stopping a stopped API server does
// nothing.
func (e *Env) StopAPIServer() error {
	e.apiServerMu.Lock()
	defer e.apiServerMu.Unlock()
	if e.apiServerDown {
		return nil
	}
	if err := e.testEnv.ControlPlane.APIServer.Stop(); err != nil {
		return fmt.Errorf("stopping kube-apiserver: %w", err)
	}
	e.apiServerDown = true
	return nil
}

// StartAPIServer starts kube-apiserver again after StopAPIServer, on the
// same port, with the same certificates and client CA, over the same etcd,
// and waits until it serves: Config, Client and KubeConfig keep working, and
// the objects are all still there. Its watch cache starts afresh, so a
// client that resumes a watch at an old resourceVersion may be told 410
// Gone and must relist, as after a real API server restart. Starting a
// running API server does nothing.
func (e *Env) StartAPIServer() error {
	e.apiServerMu.Lock()
	defer e.apiServerMu.Unlock()
	if !e.apiServerDown {
		return nil
	}
	if err := e.testEnv.ControlPlane.APIServer.Start(); err != nil {
		return fmt.Errorf("starting kube-apiserver again: %w", err)
	}
	e.apiServerDown = false
	if e.Signer != nil {
		// envtest wrote its own client CA file again at the start.
		return e.trustSigner()
	}
	return nil
}

// AddUser provisions a client-certificate user with the given groups and
// returns a config that authenticates as that user. Unless a group grants
// more (system:masters), RBAC restricts what the user may do.
func (e *Env) AddUser(name string, groups ...string) (*rest.Config, error) {
	user, err := e.testEnv.AddUser(envtest.User{Name: name, Groups: groups}, rest.CopyConfig(e.Config))
	if err != nil {
		return nil, fmt.Errorf("adding user %q: %w", name, err)
	}
	return user.Config(), nil
}

// ImpersonateServiceAccount returns a copy of Config that acts as the
// ServiceAccount namespace/name: requests are authorized (by RBAC) for that
// account's user name and groups, exactly as for a pod running with it. The
// ServiceAccount object need not exist.
func (e *Env) ImpersonateServiceAccount(namespace, name string) *rest.Config {
	cfg := rest.CopyConfig(e.Config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: fmt.Sprintf("system:serviceaccount:%s:%s", namespace, name),
		Groups: []string{
			"system:serviceaccounts",
			"system:serviceaccounts:" + namespace,
			"system:authenticated",
		},
	}
	return cfg
}

// assetsDir returns dir, else $KUBEBUILDER_ASSETS, else <repo root>/bin/k8s.
func assetsDir(dir string) (string, error) {
	if dir != "" {
		return dir, nil
	}
	if dir, ok := os.LookupEnv(AssetsEnv); ok && dir != "" {
		return dir, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding the repository root: %w", err)
	}
	root, err := repoRoot(wd)
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "bin", "k8s"), nil
}

// repoRoot walks up from dir to the directory whose go.mod declares
// ModulePath; go.mod files of other modules (such as test/k8s/tools) are
// passed over.
func repoRoot(dir string) (string, error) {
	for d := dir; ; {
		data, err := os.ReadFile(filepath.Join(d, "go.mod"))
		switch {
		case err == nil:
			if modfile.ModulePath(data) == ModulePath {
				return d, nil
			}
		case !errors.Is(err, fs.ErrNotExist):
			return "", fmt.Errorf("reading %s: %w", filepath.Join(d, "go.mod"), err)
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", fmt.Errorf("no go.mod of module %s in %s or its parents; set %s", ModulePath, dir, AssetsEnv)
		}
		d = parent
	}
}
