package csrapprover

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	certificateslisters "k8s.io/client-go/listers/certificates/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// Config configures a Controller.
type Config struct {
	// Client reads the requests and writes their approval.
	Client kubernetes.Interface
	// Rules decide each request.
	Rules Rules
	// Workers is how many requests are decided at once; 0 means 1.
	Workers int
}

// Controller approves or denies the requests of SignerName as its Rules
// say: an informer on the requests of that signer, a rate-limited queue of
// their names, and workers that decide each from the cache and write the
// decision with UpdateApproval.
type Controller struct {
	client  kubernetes.Interface
	rules   Rules
	workers int

	factory informers.SharedInformerFactory
	lister  certificateslisters.CertificateSigningRequestLister
	synced  cache.InformerSynced
	queue   workqueue.TypedRateLimitingInterface[string]
	// running is set once the cache synced and the workers started.
	running atomic.Bool
}

// New returns a Controller; Run starts it.
func New(cfg Config) (*Controller, error) {
	if cfg.Client == nil {
		return nil, errors.New("csrapprover: no client")
	}
	if err := cfg.Rules.Validate(); err != nil {
		return nil, err
	}
	if cfg.Workers < 0 {
		return nil, fmt.Errorf("csrapprover: %d workers", cfg.Workers)
	}
	c := &Controller{
		client:  cfg.Client,
		rules:   cfg.Rules,
		workers: max(cfg.Workers, 1),
		factory: informers.NewSharedInformerFactoryWithOptions(cfg.Client, 0,
			informers.WithTweakListOptions(func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("spec.signerName", SignerName).String()
			})),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "csrapprover"}),
	}
	informer := c.factory.Certificates().V1().CertificateSigningRequests()
	c.lister, c.synced = informer.Lister(), informer.Informer().HasSynced
	// A deleted request needs nothing: no delete handler.
	if _, err := informer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: c.enqueue,
		UpdateFunc: func(old, obj any) {
			if o, n := old.(*certificatesv1.CertificateSigningRequest), obj.(*certificatesv1.CertificateSigningRequest); o.ResourceVersion != n.ResourceVersion {
				c.enqueue(obj)
			}
		},
	}); err != nil {
		return nil, fmt.Errorf("csrapprover: %w", err)
	}
	return c, nil
}

func (c *Controller) enqueue(obj any) {
	if csr, ok := obj.(*certificatesv1.CertificateSigningRequest); ok {
		c.queue.Add(csr.Name)
	}
}

// Running tells whether the cache synced and the workers run: a health
// check.
func (c *Controller) Running() bool { return c.running.Load() }

// Run decides requests until ctx ends, then waits for the decisions in
// flight. It fails when the cache does not sync before ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	logger := klog.FromContext(ctx)
	c.factory.Start(ctx.Done())
	defer c.factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), c.synced) {
		return errors.New("csrapprover: the CertificateSigningRequest cache did not sync")
	}
	logger.Info("Deciding node client certificate requests", "signer", SignerName,
		"nodeNamePrefix", c.rules.NodeNamePrefix, "agentServiceAccounts", c.rules.AgentServiceAccounts,
		"bootstrapGroupPrefix", c.rules.BootstrapGroupPrefix, "workers", c.workers)
	var wg sync.WaitGroup
	for range c.workers {
		wg.Go(func() {
			for c.processNext(ctx) {
			}
		})
	}
	c.running.Store(true)
	<-ctx.Done()
	c.running.Store(false)
	c.queue.ShutDown()
	wg.Wait()
	return nil
}

// processNext decides one request; false once the queue shut down.
func (c *Controller) processNext(ctx context.Context) bool {
	name, shutdown := c.queue.Get()
	if shutdown {
		return false
	}
	defer c.queue.Done(name)
	if err := c.sync(ctx, name); err != nil {
		if ctx.Err() == nil {
			logger := klog.FromContext(ctx)
			if apierrors.IsConflict(err) {
				logger.V(4).Info("The CSR changed meanwhile; deciding again", "csr", name)
			} else {
				logger.Error(err, "Cannot write the CSR's approval; will retry", "csr", name)
			}
			c.queue.AddRateLimited(name)
		}
		return true
	}
	c.queue.Forget(name)
	return true
}

// sync decides the request name from the cache and writes the decision.
// A request decided already is left alone, so a repeat does nothing; a
// write on a request changed meanwhile fails with Conflict and is retried
// on the cache's newer copy.
func (c *Controller) sync(ctx context.Context, name string) error {
	csr, err := c.lister.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	d := c.rules.Decide(csr)
	logger := klog.FromContext(ctx)
	cond := certificatesv1.CertificateSigningRequestCondition{
		Status:  corev1.ConditionTrue,
		Message: d.Message,
	}
	switch d.Verdict {
	case Approve:
		cond.Type, cond.Reason = certificatesv1.CertificateApproved, ConditionReasonApprove
	case Deny:
		cond.Type, cond.Reason = certificatesv1.CertificateDenied, ConditionReasonDeny
	default:
		logger.V(5).Info("Left the CSR alone", "csr", name, "requester", csr.Spec.Username, "why", d.Message)
		return nil
	}
	csr = csr.DeepCopy() // never mutate the cache's copy
	cond.LastUpdateTime = metav1.Now()
	csr.Status.Conditions = append(csr.Status.Conditions, cond)
	if _, err := c.client.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, name, csr, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("writing %s of CSR %s: %w", cond.Type, name, err)
	}
	if d.Verdict == Approve {
		logger.Info("Approved a node client CSR", "csr", name, "node", d.Node, "requester", csr.Spec.Username, "message", d.Message)
	} else {
		logger.Info("Denied a node client CSR", "csr", name, "node", d.Node, "requester", csr.Spec.Username, "message", d.Message)
	}
	return nil
}
