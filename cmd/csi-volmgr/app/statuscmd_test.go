package app

import (
	"strings"
	"testing"

	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

func TestStatusShowsPodsAwaitingTheRuntime(t *testing.T) {
	var out strings.Builder
	if err := printAwaitingRuntime(&out, []volumemanager.PodVolumes{{UID: "u0", State: volumemanager.PodVolumesReady}}); err != nil {
		t.Fatal(err)
	}
	if out.Len() != 0 {
		t.Errorf("printed %q with no pod awaiting its runtime, want nothing", out.String())
	}
	pods := []volumemanager.PodVolumes{
		{UID: "u1", Namespace: "ns", Name: "a", State: volumemanager.PodVolumesAwaitingRuntime, Message: "the pod is no longer in the API server"},
		{UID: "u2", State: volumemanager.PodVolumesAwaitingRuntime, Message: "found on disk at start"},
		{UID: "u3", Namespace: "ns", Name: "b", State: volumemanager.PodVolumesReady},
	}
	if err := printAwaitingRuntime(&out, pods); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{"ns/a", "u1", "AwaitingRuntime", "no longer in the API server", "<unknown>", "u2", "found on disk"} {
		if !strings.Contains(got, want) {
			t.Errorf("status output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "u3") {
		t.Errorf("status output lists a ready pod among those awaiting their runtime:\n%s", got)
	}
}
