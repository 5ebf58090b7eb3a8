// Package selinux turns the SELinux options of a pod's containers into the
// SELinux file label a volume is mounted with (-o context=...), as the
// kubelet's pkg/volume/util SELinuxLabelTranslator does.
package selinux

import (
	"fmt"

	goselinux "github.com/opencontainers/selinux/go-selinux"
	"github.com/opencontainers/selinux/go-selinux/label"
	corev1 "k8s.io/api/core/v1"
)

// Translator turns a container's SELinux options into the file label of
// the volumes it mounts.
type Translator interface {
	// Enabled says whether the host runs SELinux; without it no volume
	// gets a label and nothing changes.
	Enabled() bool
	// FileLabel returns the file label for opts; "" for nil or empty
	// options.
	FileLabel(opts *corev1.SELinuxOptions) (string, error)
}

// Host asks the host's SELinux policy, as the kubelet does.
type Host struct{}

var _ Translator = Host{}

// Enabled says whether SELinux is enabled on the host.
func (Host) Enabled() bool { return goselinux.GetEnabled() }

// FileLabel completes opts with the host policy's container defaults and
// returns the file label (go-selinux label.InitLabels, as the kubelet).
func (Host) FileLabel(opts *corev1.SELinuxOptions) (string, error) {
	args := contextOptions(opts)
	if len(args) == 0 {
		return "", nil
	}
	processLabel, fileLabel, err := label.InitLabels(args)
	if err != nil {
		return "", fmt.Errorf("SELinux options %v: %w", args, err)
	}
	goselinux.ReleaseLabel(processLabel)
	return fileLabel, nil
}

// contextOptions are opts as InitLabels takes them.
func contextOptions(opts *corev1.SELinuxOptions) []string {
	if opts == nil {
		return nil
	}
	var args []string
	for _, o := range []struct{ key, value string }{
		{"user", opts.User}, {"role", opts.Role}, {"type", opts.Type}, {"level", opts.Level},
	} {
		if o.value != "" {
			args = append(args, o.key+":"+o.value)
		}
	}
	return args
}

// Defaults computes labels as an SELinux host with the usual container
// policy would, without asking the host: the missing parts of the options
// are system_u, object_r, container_file_t (for container_t too) and
// s0:c998,c999, the rules of the kubelet's own test translator
// (NewFakeSELinuxLabelTranslator). It stands for an SELinux host where the
// host has none: in tests, which check the labels the agent computes and
// passes to the driver.
type Defaults struct{}

var _ Translator = Defaults{}

// Enabled is always true.
func (Defaults) Enabled() bool { return true }

// FileLabel completes opts with the defaults.
func (Defaults) FileLabel(opts *corev1.SELinuxOptions) (string, error) {
	if opts == nil {
		return "", nil
	}
	or := func(v, def string) string {
		if v == "" {
			return def
		}
		return v
	}
	typ := opts.Type
	if typ == "" || typ == "container_t" {
		typ = "container_file_t"
	}
	return fmt.Sprintf("%s:%s:%s:%s", or(opts.User, "system_u"), or(opts.Role, "object_r"), typ, or(opts.Level, "s0:c998,c999")), nil
}

// MountOption is the mount option that mounts a volume with label: the
// kubelet's AddSELinuxMountOption.
func MountOption(label string) string { return fmt.Sprintf("context=%q", label) }
