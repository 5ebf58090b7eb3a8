package volumemanager

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// The running-pods report over HTTP, the form of VolumeManager's
// BeginRunningPods for a runtime beside the agent: POST
// RunningPodsBeginPath right before listing the pods it runs, then PUT
// RunningPodsPath with the list and the mark the POST returned. The report
// counts as of the mark, so it releases no pod that left the API server
// after it — one the runtime may have started after it took its list.
const (
	// RunningPodsPath takes the runtime's report of the pods it still runs
	// (PUT, RunningPodsReport).
	RunningPodsPath = "/api/v1/running-pods"
	// RunningPodsBeginPath issues the mark of a report (POST, answers a
	// RunningPodsMark).
	RunningPodsBeginPath = RunningPodsPath + "/begin"
)

// maxRunningPodsBody bounds a report: room for some 100,000 UIDs.
const maxRunningPodsBody = 4 << 20

// RunningPodsMark is the answer of POST /api/v1/running-pods/begin.
type RunningPodsMark struct {
	// Mark dates the report of a list taken after it was issued: give it
	// back, as is, in RunningPodsReport.Mark. It is opaque, only good for
	// the agent's run that issued it, and never older than a mark issued
	// before.
	Mark string `json:"mark"`
}

// RunningPodsReport is the body of PUT /api/v1/running-pods.
type RunningPodsReport struct {
	// Mark is what POST /api/v1/running-pods/begin returned right before
	// the runtime listed its pods. Required: a report without one could be
	// older than a pod the runtime started since, and release its volumes
	// under its running containers.
	Mark string `json:"mark"`
	// UIDs are the pods whose containers the runtime runs or is starting
	// as it lists them; an empty list says it runs none. Required.
	UIDs []types.UID `json:"uids"`
}

// newRunID returns the identifier of this run of the agent, which its
// marks carry: the counter behind them starts again at each start.
func newRunID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// postRunningPodsBegin issues a mark: 200 with a RunningPodsMark.
func (vm *VolumeManager) postRunningPodsBegin(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, RunningPodsMark{Mark: vm.runID + "." + strconv.FormatUint(vm.manager.RunningPodsMark(), 10)})
}

// errStaleMark is a mark of another run of the agent.
var errStaleMark = errors.New("the mark was issued before the agent restarted: " +
	"POST " + RunningPodsBeginPath + " again, then list the pods and report them with the new mark")

// putRunningPods takes a RunningPodsReport: 204 once recorded, 400 for a
// body that is not one (unknown fields, no mark, no uids, an empty UID) or
// a mark the agent did not issue, 409 for a mark of another run of the
// agent, 413 for one larger than maxRunningPodsBody.
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
	mark, err := vm.parseMark(report.Mark)
	switch {
	case errors.Is(err, errStaleMark):
		http.Error(w, err.Error(), http.StatusConflict)
		return
	case err != nil:
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if err := vm.manager.RunningPodsAsOf(mark, report.UIDs); err != nil {
		http.Error(w, fmt.Sprintf("mark %q: %v", report.Mark, err), http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// parseMark reads a mark of postRunningPodsBegin.
func (vm *VolumeManager) parseMark(mark string) (uint64, error) {
	run, n, ok := strings.Cut(mark, ".")
	v, err := strconv.ParseUint(n, 10, 64)
	if !ok || run == "" || err != nil {
		return 0, fmt.Errorf("mark %q is not one POST %s returned", mark, RunningPodsBeginPath)
	}
	if run != vm.runID {
		return 0, errStaleMark
	}
	return v, nil
}

func readRunningPods(body io.Reader) (RunningPodsReport, error) {
	var report RunningPodsReport
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&report); err != nil {
		return report, fmt.Errorf(`want {"mark": "<from POST %s>", "uids": ["<pod UID>", ...]}: %w`, RunningPodsBeginPath, err)
	}
	if dec.More() {
		return report, errors.New(`want one {"mark": ..., "uids": [...]} object`)
	}
	if report.Mark == "" {
		// Dated at its arrival, a report taken before a pod started and
		// was force-deleted would release the pod's volumes.
		return report, fmt.Errorf(`"mark" is required: POST %s right before listing the pods, and send its mark with the list`, RunningPodsBeginPath)
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
