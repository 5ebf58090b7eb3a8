package bench_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
)

// referenceSamples is how often each reference cost is measured.
const referenceSamples = 100

// backgroundWrites is the rate of unrelated API writes some reference
// costs are measured under: about what the serial phase's own status
// writes amount to (3 pod-status and 1 node-status PATCH per pod).
const backgroundWrites = 30

// referenceCosts measures, on this machine and API server and right after
// the agent's run, the primitive costs the agent's per-pod latency is made
// of, so that the breakdown can be read against them:
//   - a durable record written as lifecycle/checkpoint writes a pod's
//     vol_data.json (four new directories, each parent fsynced; temporary
//     file fsynced, renamed, directory fsynced), below the agent's root;
//     and the same without any fsync (MkdirAll, write, rename);
//   - a by-name watch of a PVC started until its initial events ended, as
//     the Source starts one for each object a pod references: a client-go
//     Reflector with watch-list semantics (a consistent read: the API
//     server waits until its watch cache is as fresh as etcd), with the
//     API server otherwise quiet and while backgroundWrites unrelated
//     writes per second go on; and, for comparison, the same watch with
//     resourceVersion "0" (served from the watch cache as it is);
//   - a GET of the PVC.
func (e *benchEnv) referenceCosts(ctx context.Context, b *testing.B) string {
	b.Helper()
	dir := filepath.Join(e.root, "reference")
	defer func() { _ = os.RemoveAll(dir) }()
	data := []byte(`{"specVolID":"data","volumeHandle":"vol-0123456789abcdef","driverName":"x","nodeName":"n","attachmentID":""}`)
	record := func(base string, i int) string {
		return filepath.Join(dir, base, strconv.Itoa(i), "volumes", "kubernetes.io~csi", "data", "vol_data.json")
	}
	durable := measureN(b, func(i int) error { return checkpoint.WriteFile(record("durable", i), data) })
	plain := measureN(b, func(i int) error {
		p := record("plain", i)
		if err := os.MkdirAll(filepath.Dir(p), checkpoint.DirMode); err != nil {
			return err
		}
		if err := os.WriteFile(p+".tmp", data, 0o640); err != nil {
			return err
		}
		return os.Rename(p+".tmp", p)
	})

	core := e.creator.CoreV1()
	claim := e.volumes[0].claim
	selector := fields.OneTermEqualSelector("metadata.name", claim).String()
	reflector := func(int) error {
		return reflectorUntilSynced(ctx, e.creator, &corev1.PersistentVolumeClaim{}, &cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				o.FieldSelector = selector
				return core.PersistentVolumeClaims(e.fx.Namespace).List(ctx, o)
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				o.FieldSelector = selector
				return core.PersistentVolumeClaims(e.fx.Namespace).Watch(ctx, o)
			},
		})
	}
	fromCache := func(int) error {
		return watchUntilSynced(ctx, func(o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector, o.ResourceVersion = selector, "0"
			return core.PersistentVolumeClaims(e.fx.Namespace).Watch(ctx, o)
		})
	}
	quiet := measureN(b, reflector)
	stop := e.writeInBackground(ctx, b)
	busy := measureN(b, reflector)
	busyFromCache := measureN(b, fromCache)
	stop()
	get := measureN(b, func(int) error {
		_, err := core.PersistentVolumeClaims(e.fx.Namespace).Get(ctx, claim, metav1.GetOptions{})
		return err
	})
	return table(
		"durable record (checkpoint.WriteFile)", durable,
		"same without fsync", plain,
		"PVC reflector synced, quiet", quiet,
		fmt.Sprintf("same, %d other writes/s", backgroundWrites), busy,
		`same with resourceVersion "0"`, busyFromCache,
		"GET PVC", get,
	)
}

// writeInBackground updates a ConfigMap of the benchmark's namespace
// backgroundWrites times a second until the returned function is called.
func (e *benchEnv) writeInBackground(ctx context.Context, b *testing.B) (stop func()) {
	b.Helper()
	cms := e.creator.CoreV1().ConfigMaps(e.fx.Namespace)
	cm, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "background-writes"}}, metav1.CreateOptions{})
	if err != nil {
		b.Fatalf("creating the background ConfigMap: %v", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(time.Second / backgroundWrites)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			cm.Data = map[string]string{"n": strconv.Itoa(i)}
			if updated, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err == nil {
				cm = updated
			}
		}
	}()
	return func() { cancel(); <-done }
}

// measureN runs fn referenceSamples times, one after the other, and
// returns how long each took.
func measureN(b *testing.B, fn func(i int) error) dist {
	b.Helper()
	out := make([]time.Duration, 0, referenceSamples)
	for i := range referenceSamples {
		start := time.Now()
		if err := fn(i); err != nil {
			b.Fatalf("reference measurement: %v", err)
		}
		out = append(out, time.Since(start))
	}
	return newDist(out)
}

// watchUntilSynced starts a watch-list (sendInitialEvents) and returns
// when the bookmark that ends the initial events arrives.
func watchUntilSynced(ctx context.Context, start func(metav1.ListOptions) (watch.Interface, error)) error {
	w, err := start(metav1.ListOptions{
		SendInitialEvents:    ptr.To(true),
		ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan,
		AllowWatchBookmarks:  true,
	})
	if err != nil {
		return err
	}
	defer w.Stop()
	timeout := time.After(time.Minute)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				return errors.New("watch closed before its initial events ended")
			}
			if ev.Type != watch.Bookmark {
				continue
			}
			if m, err := meta.Accessor(ev.Object); err == nil && m.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true" {
				return nil
			}
		case <-timeout:
			return errors.New("initial events did not end within a minute")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// reflectorUntilSynced runs a Reflector over lw, as lifecycle/source runs
// one per referenced object, and returns when its store got the initial
// list.
func reflectorUntilSynced(ctx context.Context, client kubernetes.Interface, expected runtime.Object, lw *cache.ListWatch) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	store := &syncSignal{Store: cache.NewStore(cache.MetaNamespaceKeyFunc), synced: make(chan struct{})}
	r := cache.NewReflectorWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, client), expected, store,
		cache.ReflectorOptions{Name: "reference"})
	done := make(chan struct{})
	go func() { defer close(done); r.RunWithContext(ctx) }()
	defer func() { cancel(); <-done }()
	select {
	case <-store.synced:
		return nil
	case <-time.After(time.Minute):
		return errors.New("reflector did not sync within a minute")
	case <-ctx.Done():
		return ctx.Err()
	}
}

// syncSignal is a store that tells when it was first replaced (the
// reflector's initial list).
type syncSignal struct {
	cache.Store
	once   sync.Once
	synced chan struct{}
}

func (s *syncSignal) Replace(items []any, rv string) error {
	err := s.Store.Replace(items, rv)
	s.once.Do(func() { close(s.synced) })
	return err
}
