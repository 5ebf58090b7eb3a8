package e2e_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

// Node service methods, as the journal names them.
const (
	nodeStage     = "NodeStageVolume"
	nodeUnstage   = "NodeUnstageVolume"
	nodePublish   = "NodePublishVolume"
	nodeUnpublish = "NodeUnpublishVolume"
)

// volumeCalls returns the plugin's calls of the node steps for one volume,
// in the order they began.
func volumeCalls(t *testing.T, p *plugintest.Plugin, handle string) []plugin.Call {
	t.Helper()
	entries, err := p.ReadJournal()
	if err != nil {
		t.Fatalf("reading the plugin journal: %v", err)
	}
	return filterCalls(plugin.Calls(entries), handle)
}

func filterCalls(calls []plugin.Call, handle string) []plugin.Call {
	return slices.DeleteFunc(calls, func(c plugin.Call) bool {
		switch c.Begin.Method {
		case nodeStage, nodeUnstage, nodePublish, nodeUnpublish:
			return c.Begin.VolumeID != handle
		}
		return true
	})
}

// methods lists the calls as "Method=Code" for messages and comparisons;
// a call that has not returned shows "Method=…".
func methods(calls []plugin.Call) []string {
	out := make([]string, 0, len(calls))
	for _, c := range calls {
		code := "…"
		if c.Done {
			code = c.End.Code
		}
		out = append(out, c.Begin.Method+"="+code)
	}
	return out
}

// okCalls returns the calls of method that returned OK.
func okCalls(calls []plugin.Call, method string) []plugin.Call {
	var out []plugin.Call
	for _, c := range calls {
		if c.Begin.Method == method && c.Done && c.Code() == codes.OK {
			out = append(out, c)
		}
	}
	return out
}

// countCalls counts the calls of method, whatever their result.
func countCalls(calls []plugin.Call, method string) int {
	n := 0
	for _, c := range calls {
		if c.Begin.Method == method {
			n++
		}
	}
	return n
}

// waitCalls waits until the plugin's calls for handle satisfy ok and
// returns them.
func waitCalls(t *testing.T, p *plugintest.Plugin, handle, what string, ok func([]plugin.Call) bool) []plugin.Call {
	t.Helper()
	var calls []plugin.Call
	eventually(t, "journal: "+what, func() (bool, error) {
		calls = volumeCalls(t, p, handle)
		if !ok(calls) {
			return false, fmt.Errorf("calls so far: %s", strings.Join(methods(calls), ", "))
		}
		return true, nil
	})
	return calls
}

// hasOK returns a condition that holds once method returned OK n times.
func hasOK(method string, n int) func([]plugin.Call) bool {
	return func(calls []plugin.Call) bool { return len(okCalls(calls, method)) >= n }
}

// endsBefore says whether call a returned before call b began.
func endsBefore(a, b plugin.Call) bool {
	return a.Done && !a.End.Time.After(b.Begin.Time)
}
