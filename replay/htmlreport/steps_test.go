package htmlreport

import (
	"fmt"
	"testing"

	"gonum.org/v1/plot/plotter"
)

// TestSteps: re-sent unchanged shares are dropped, changes and both ends
// kept.
func TestSteps(t *testing.T) {
	in := plotter.XYs{{X: 1, Y: .5}, {X: 2, Y: .5}, {X: 3, Y: .4}, {X: 4, Y: .4}, {X: 5, Y: .4}, {X: 6, Y: .5}, {X: 7, Y: .5}}
	got := steps(in)
	want := plotter.XYs{{X: 1, Y: .5}, {X: 3, Y: .4}, {X: 6, Y: .5}, {X: 7, Y: .5}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("steps = %v, want %v", got, want)
	}
	if got := steps(plotter.XYs{{X: 1, Y: 1}}); len(got) != 1 {
		t.Errorf("one point: %v", got)
	}
	if got := steps(nil); len(got) != 0 {
		t.Errorf("none: %v", got)
	}
}
