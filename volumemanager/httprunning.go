package volumemanager

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"k8s.io/apimachinery/pkg/types"
)

// RunningPodsPath takes the runtime's report of the pods it still runs
// (PUT, RunningPodsReport): the HTTP form of VolumeManager.RunningPods.
const RunningPodsPath = "/api/v1/running-pods"

// maxRunningPodsBody bounds a report: room for some 100,000 UIDs.
const maxRunningPodsBody = 4 << 20

// RunningPodsReport is the body of PUT /api/v1/running-pods.
type RunningPodsReport struct {
	// UIDs are the pods whose containers the runtime runs now; an empty
	// list says it runs none. Required.
	UIDs []types.UID `json:"uids"`
}

// putRunningPods takes a RunningPodsReport: 204 once recorded, 400 for a
// body that is not one (unknown fields, no uids, an empty UID), 413 for
// one larger than maxRunningPodsBody.
func (vm *VolumeManager) putRunningPods(w http.ResponseWriter, r *http.Request) {
	report, err := readRunningPods(http.MaxBytesReader(w, r.Body, maxRunningPodsBody))
	if isTooLarge(err) {
		http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
		return
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	vm.RunningPods(report.UIDs)
	w.WriteHeader(http.StatusNoContent)
}

func readRunningPods(body io.Reader) (RunningPodsReport, error) {
	var report RunningPodsReport
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&report); err != nil {
		return report, fmt.Errorf(`want {"uids": ["<pod UID>", ...]}: %w`, err)
	}
	if dec.More() {
		return report, errors.New(`want one {"uids": [...]} object`)
	}
	if report.UIDs == nil {
		// A report without the list would release every pod.
		return report, errors.New(`"uids" is required; [] says the runtime runs no pod`)
	}
	for _, uid := range report.UIDs {
		if uid == "" {
			return report, errors.New(`"uids" has an empty UID`)
		}
	}
	return report, nil
}
