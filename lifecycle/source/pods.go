package source

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// setupPods creates the informer of the pods bound to the node and
// registers the event handlers.
func (s *Source) setupPods() error {
	selector := fields.OneTermEqualSelector("spec.nodeName", s.cfg.NodeName).String()
	tweak := func(o *metav1.ListOptions) { o.FieldSelector = selector }
	s.podF = informers.NewSharedInformerFactoryWithOptions(s.cfg.Client, 0,
		informers.WithTweakListOptions(tweak), informers.WithTransform(trimPodTransform))
	s.podWatch = &watchHealth{now: time.Now}
	s.podInf = s.podF.InformerFor(&corev1.Pod{}, func(client kubernetes.Interface, _ time.Duration) cache.SharedIndexInformer {
		return newPodInformer(client, tweak, s.podWatch)
	})
	reg, err := s.podInf.AddEventHandlerWithOptions(cache.ResourceEventHandlerFuncs{
		AddFunc:    s.onPodAdd,
		UpdateFunc: s.onPodUpdate,
		DeleteFunc: s.onPodDelete,
	}, cache.HandlerOptions{Logger: &s.logger})
	if err != nil {
		return fmt.Errorf("adding the pod event handler: %w", err)
	}
	s.podsReg = reg
	return nil
}

// PodByName returns the node's pod with the given namespace and name from
// the cache: only the fields the agent reads (trim.go).
func (s *Source) PodByName(namespace, name string) (*corev1.Pod, bool) {
	obj, exists, err := s.podInf.GetIndexer().GetByKey(namespace + "/" + name)
	if err != nil || !exists {
		return nil, false
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok || !s.ours(pod) {
		return nil, false
	}
	return pod, true
}

// Pod returns the pod with the given UID if it is bound to this node, with
// only the fields the agent reads (trim.go). The pod is shared with the
// cache: never modify it. The UID is looked up in
// podKeys, which the event handlers keep (an indexer's UID index cost about
// a KiB per pod).
func (s *Source) Pod(uid types.UID) (*corev1.Pod, bool) {
	s.mu.Lock()
	key, ok := s.podKeys[uid]
	s.mu.Unlock()
	if !ok {
		return nil, false
	}
	obj, exists, err := s.podInf.GetIndexer().GetByKey(key.String())
	if err != nil || !exists {
		return nil, false
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.UID != uid || !s.ours(pod) {
		return nil, false
	}
	return pod, true
}

// Pods returns every pod bound to this node, with only the fields the
// agent reads (trim.go). The pods are shared with the cache: never modify
// them.
func (s *Source) Pods() []*corev1.Pod {
	objs := s.podInf.GetIndexer().List()
	pods := make([]*corev1.Pod, 0, len(objs))
	for _, obj := range objs {
		if pod, ok := obj.(*corev1.Pod); ok && s.ours(pod) {
			pods = append(pods, pod)
		}
	}
	return pods
}

// ours double-checks the field selector (fake clientsets ignore it).
func (s *Source) ours(pod *corev1.Pod) bool {
	return pod.Spec.NodeName == s.cfg.NodeName
}

func (s *Source) onPodAdd(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		s.logger.Error(nil, "Unexpected object in pod add event", "type", fmt.Sprintf("%T", obj))
		return
	}
	if !s.ours(pod) {
		return
	}
	s.rememberPod(pod)
	s.logger.V(5).Info("Pod added", "pod", klog.KObj(pod), "podUID", pod.UID)
	s.notifyPods([]types.UID{pod.UID})
}

func (s *Source) onPodUpdate(oldObj, newObj any) {
	oldPod, ok1 := oldObj.(*corev1.Pod)
	newPod, ok2 := newObj.(*corev1.Pod)
	if !ok1 || !ok2 {
		s.logger.Error(nil, "Unexpected object in pod update event", "type", fmt.Sprintf("%T", newObj))
		return
	}
	if oldPod.ResourceVersion == newPod.ResourceVersion {
		return // resync echo
	}
	uids := []types.UID{newPod.UID}
	if oldPod.UID != newPod.UID {
		// The pod was re-created under the same name and the deletion
		// was missed: the old one is gone.
		uids = append(uids, oldPod.UID)
	}
	if s.ours(newPod) {
		s.rememberPod(newPod)
	}
	s.logger.V(5).Info("Pod updated", "pod", klog.KObj(newPod), "podUID", newPod.UID)
	s.notifyPods(uids)
}

func (s *Source) onPodDelete(obj any) {
	var key cache.ObjectName
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
		if k, err := cache.ParseObjectName(tomb.Key); err == nil {
			key = k
		}
	}
	var uid types.UID
	if pod, ok := obj.(*corev1.Pod); ok {
		uid, key = pod.UID, cache.MetaObjectToName(pod)
	}
	s.mu.Lock()
	if known, ok := s.podNames[key]; ok {
		if uid == "" {
			uid = known // final state unknown: the UID last seen under that name
		}
		if known == uid {
			delete(s.podNames, key)
		}
	}
	if k, ok := s.podKeys[uid]; ok && k == key {
		delete(s.podKeys, uid)
	}
	s.mu.Unlock()
	if uid == "" {
		s.logger.Error(nil, "Pod deletion without a known UID", "pod", key)
		return
	}
	s.logger.V(5).Info("Pod deleted", "pod", key, "podUID", uid)
	s.notifyPods([]types.UID{uid})
}

func (s *Source) rememberPod(pod *corev1.Pod) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := cache.MetaObjectToName(pod)
	if old, ok := s.podNames[key]; ok && old != pod.UID {
		delete(s.podKeys, old)
	}
	s.podNames[key] = pod.UID
	s.podKeys[pod.UID] = key
}
