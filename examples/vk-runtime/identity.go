package main

import (
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// identity is the user, group and supplemental groups a container's
// process runs with.
type identity struct {
	uid, gid int64
	groups   []int64
}

// identityOf computes a container's identity as the kubelet does
// (kuberuntime's determineEffectiveSecurityContext): runAsUser and
// runAsGroup of the container, else of the pod, else root (there is no
// image to say otherwise); as supplemental groups the pod's
// supplementalGroups, its fsGroup and extra, the groups its volumes ask
// for (vkubelet.ExtraSupplementalGroups).
func identityOf(pod *corev1.Pod, c *corev1.Container, extra []int64) identity {
	var id identity
	if sc := pod.Spec.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			id.uid = *sc.RunAsUser
		}
		if sc.RunAsGroup != nil {
			id.gid = *sc.RunAsGroup
		}
		id.groups = append(id.groups, sc.SupplementalGroups...)
		if sc.FSGroup != nil {
			id.groups = append(id.groups, *sc.FSGroup)
		}
	}
	if sc := c.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			id.uid = *sc.RunAsUser
		}
		if sc.RunAsGroup != nil {
			id.gid = *sc.RunAsGroup
		}
	}
	id.groups = append(id.groups, extra...)
	slices.Sort(id.groups)
	id.groups = slices.Compact(id.groups)
	return id
}

// args are the sandbox's flags for id.
func (id identity) args() []string {
	out := []string{"--uid", strconv.FormatInt(id.uid, 10), "--gid", strconv.FormatInt(id.gid, 10)}
	if len(id.groups) > 0 {
		gs := make([]string, len(id.groups))
		for i, g := range id.groups {
			gs[i] = strconv.FormatInt(g, 10)
		}
		out = append(out, "--groups", strings.Join(gs, ","))
	}
	return out
}
