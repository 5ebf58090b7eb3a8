package source

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// byNameListWatch lists and watches one object by name (field selector
// metadata.name) for a reflector.
//
// Its first list is a GET: a pod's PVC and PV are resolved one after the
// other while the pod waits, and a GET of one object is read from etcd at
// once, where a consistent LIST (or the watch-list stream) from the API
// server's watch cache waits until the cache has caught up with etcd (tens
// of milliseconds per object under writes, up to the cache's 100 ms
// progress interval), and a LIST at resourceVersion "0" may answer from a
// cache that has not yet seen the binding the pod depends on. The watch
// then starts at the object's resourceVersion, so no change after the GET
// is missed. Should that version have left the watch cache's window (an
// old object; the API server answers 410 Gone), the reflector relists, and
// every later list is an ordinary LIST. A missing object is listed too:
// the LIST gives a resourceVersion to watch from for its creation.
//
// Watch-list semantics are off (IsWatchListSemanticsUnSupported): the
// first list must be this GET, not a stream.
type byNameListWatch struct {
	key   cache.ObjectName
	funcs listWatchFuncs
	// seed, when set, answers the first list instead of a GET.
	seed runtime.Object
	// listed is set after the first successful list, or from the start
	// when a GET just found no object (every list is then a LIST); only
	// the reflector's goroutine uses it.
	listed bool
	// failed, when set, is told why a list failed (objectStore.failed).
	failed func(error)
}

var (
	_ cache.ListerWatcherWithContext = &byNameListWatch{}
	_ cache.ListerWatcher            = &byNameListWatch{}
)

// IsWatchListSemanticsUnSupported turns the reflector's watch-list mode off.
func (lw *byNameListWatch) IsWatchListSemanticsUnSupported() bool { return true }

func (lw *byNameListWatch) selector() string {
	return fields.OneTermEqualSelector("metadata.name", lw.key.Name).String()
}

// ListWithContext answers the reflector's list: a GET the first time, when
// the object exists, else a LIST by name. A failure is reported to failed
// (the reflector retries it with backoff).
func (lw *byNameListWatch) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	list, err := lw.list(ctx, opts)
	if err != nil && lw.failed != nil && ctx.Err() == nil {
		lw.failed(err)
	}
	return list, err
}

func (lw *byNameListWatch) list(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	if seed := lw.seed; seed != nil && !lw.listed {
		lw.seed = nil
		list, err := singleItemList(lw.funcs.newList(), seed)
		if err == nil {
			lw.listed = true
			return list, nil
		}
	}
	if !lw.listed {
		obj, err := lw.funcs.get(ctx, lw.key.Namespace, lw.key.Name)
		switch {
		case err == nil:
			list, err := singleItemList(lw.funcs.newList(), obj)
			if err != nil {
				return nil, err
			}
			lw.listed = true
			return list, nil
		case !apierrors.IsNotFound(err):
			return nil, err
		}
	}
	opts.FieldSelector = lw.selector()
	list, err := lw.funcs.list(ctx, lw.key.Namespace, opts)
	if err == nil {
		lw.listed = true
	}
	return list, err
}

// WatchWithContext watches the object from the given options.
func (lw *byNameListWatch) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.FieldSelector = lw.selector()
	return lw.funcs.watch(ctx, lw.key.Namespace, opts)
}

// List and Watch serve reflectors that do not pass a context.
func (lw *byNameListWatch) List(opts metav1.ListOptions) (runtime.Object, error) {
	return lw.ListWithContext(context.TODO(), opts)
}

func (lw *byNameListWatch) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	return lw.WatchWithContext(context.TODO(), opts)
}

// singleItemList puts obj into list, with obj's resourceVersion as the
// list's: the version the watch starts from.
func singleItemList(list, obj runtime.Object) (runtime.Object, error) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, fmt.Errorf("reading the metadata of %T: %w", obj, err)
	}
	if err := meta.SetList(list, []runtime.Object{obj}); err != nil {
		return nil, fmt.Errorf("building a %T: %w", list, err)
	}
	lm, err := meta.ListAccessor(list)
	if err != nil {
		return nil, fmt.Errorf("reading the metadata of %T: %w", list, err)
	}
	lm.SetResourceVersion(m.GetResourceVersion())
	return list, nil
}
