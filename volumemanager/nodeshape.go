package volumemanager

import (
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// ownLabels are the labels the node keeper sets on the Node it keeps;
// Config.NodeLabels may not set them.
func ownLabels(name string) map[string]string {
	return map[string]string{
		OwnerLabel:           OwnerLabelValue,
		corev1.LabelHostname: name, corev1.LabelOSStable: runtime.GOOS, corev1.LabelArchStable: runtime.GOARCH,
	}
}

// validateNode checks NodeCapacity, NodeLabels and NodeTaints: only with
// RegisterNode, and each valid as the API server would take it.
func (c *Config) validateNode() []error {
	var errs []error
	bad := func(field string, err error) { errs = append(errs, &ConfigError{Field: field, Err: err}) }
	if !c.RegisterNode {
		for field, set := range map[string]bool{
			"NodeCapacity": len(c.NodeCapacity) > 0, "NodeLabels": len(c.NodeLabels) > 0, "NodeTaints": len(c.NodeTaints) > 0,
		} {
			if set {
				bad(field, errors.New("needs RegisterNode: it shapes the Node the agent registers"))
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.NodeCapacity)) {
		if q := c.NodeCapacity[name]; q.Sign() < 0 {
			bad("NodeCapacity", fmt.Errorf("%s=%s must not be negative", name, q.String()))
		}
	}
	if fieldErrs := metav1validation.ValidateLabels(c.NodeLabels, field.NewPath("")); len(fieldErrs) > 0 {
		bad("NodeLabels", fieldErrs.ToAggregate())
	}
	for _, key := range slices.Sorted(maps.Keys(c.NodeLabels)) {
		if _, own := ownLabels("")[key]; own {
			bad("NodeLabels", fmt.Errorf("%s: the agent sets this label itself", key))
		}
	}
	seen := map[string]bool{}
	for _, t := range c.NodeTaints {
		if err := validateTaint(t); err != nil {
			bad("NodeTaints", err)
			continue
		}
		if id := t.Key + ":" + string(t.Effect); seen[id] {
			bad("NodeTaints", fmt.Errorf("%s: given twice with effect %s", t.Key, t.Effect))
		} else {
			seen[id] = true
		}
	}
	return errs
}

// validateTaint checks one taint as the API server's node validation does,
// and keeps TaintDriversNotReady the agent's own.
func validateTaint(t corev1.Taint) error {
	if msgs := validation.IsQualifiedName(t.Key); len(msgs) > 0 {
		return fmt.Errorf("%q: key %v", t.ToString(), msgs)
	}
	if msgs := validation.IsValidLabelValue(t.Value); len(msgs) > 0 {
		return fmt.Errorf("%q: value %v", t.ToString(), msgs)
	}
	switch t.Effect {
	case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
	default:
		return fmt.Errorf("%q: effect %q is not NoSchedule, PreferNoSchedule or NoExecute", t.ToString(), t.Effect)
	}
	if t.Key == TaintDriversNotReady {
		return fmt.Errorf("%q: the agent sets this taint itself (ExpectedDrivers)", t.ToString())
	}
	return nil
}
