package benchresults

import (
	"testing"
)

// TestNegativeStandingHeapIsNotAValue: a standing heap below zero (the API
// server's heap fell while the watches were opened) renders as missing,
// with the reason; a negative figure of another kind stays a value.
func TestNegativeStandingHeapIsNotAValue(t *testing.T) {
	v := func(x float64) *float64 { return &x }
	f := &File{Samples: []Sample{
		{Section: "s", Key: "apiserver_heap_gib", Column: "a", Value: v(-34.7)},
		{Section: "s", Key: "heap_growth_mib", Column: "a", Value: v(-0.04)},
		{Section: "s", Key: "apiserver_heap_gib", Column: "b", Value: v(25.9)},
	}}
	cells := map[string]map[string]Cell{}
	for _, r := range f.Rows() {
		cells[r.Key] = r.Cells
	}
	if c := cells["apiserver_heap_gib"]["a"]; c.N != 0 || c.Note != notStanding {
		t.Errorf("negative standing heap: %+v, want no value and the note %q", c, notStanding)
	}
	if c := cells["apiserver_heap_gib"]["b"]; c.N != 1 || c.Median != 25.9 {
		t.Errorf("positive standing heap: %+v, want 25.9", c)
	}
	if c := cells["heap_growth_mib"]["a"]; c.N != 1 || c.Median != -0.04 {
		t.Errorf("negative heap growth: %+v, want the value -0.04", c)
	}
}
