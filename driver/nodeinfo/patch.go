package nodeinfo

import (
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/util/strategicpatch"
)

// preconditionedPatch returns the strategic merge patch that turns original
// into modified, plus metadata.resourceVersion = resourceVersion. The API
// server applies a patch that names a resourceVersion only if the object
// still has that version and answers Conflict otherwise, so the patch is an
// optimistic-concurrency write like an Update.
//
// Why a patch and not an Update: the patch carries only the fields this
// package changed (Node labels and one annotation; one CSINode driver entry,
// merged by name), so fields that this binary's API types do not know, added
// by a newer API server, are never dropped by a round trip through an older
// struct. The kubelet patches the Node for the same reason. The
// resourceVersion keeps the read-check-write sequences (label collision,
// annotation merge, CSINode ownership) atomic against other writers.
func preconditionedPatch(original, modified, dataStruct any, resourceVersion string) ([]byte, error) {
	originalJSON, err := json.Marshal(original)
	if err != nil {
		return nil, fmt.Errorf("encoding original object: %w", err)
	}
	modifiedJSON, err := json.Marshal(modified)
	if err != nil {
		return nil, fmt.Errorf("encoding modified object: %w", err)
	}
	diff, err := strategicpatch.CreateTwoWayMergePatch(originalJSON, modifiedJSON, dataStruct)
	if err != nil {
		return nil, fmt.Errorf("creating strategic merge patch: %w", err)
	}
	var patch map[string]any
	if err := json.Unmarshal(diff, &patch); err != nil {
		return nil, fmt.Errorf("decoding strategic merge patch: %w", err)
	}
	metadata, _ := patch["metadata"].(map[string]any)
	if metadata == nil {
		metadata = map[string]any{}
	}
	metadata["resourceVersion"] = resourceVersion
	patch["metadata"] = metadata
	out, err := json.Marshal(patch)
	if err != nil {
		return nil, fmt.Errorf("encoding patch: %w", err)
	}
	return out, nil
}
