package htmlreport

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot/plotter"

	"github.com/sluice-rl/sluice/replay"
	"github.com/sluice-rl/sluice/rules"
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

// TestMeanShare: a share holds from its point until the next, the last
// until the end; the mean weighs each by how long it held.
func TestMeanShare(t *testing.T) {
	xys := plotter.XYs{{X: 10, Y: .2}, {X: 20, Y: .8}, {X: 50, Y: .5}}
	for _, c := range []struct{ a, b, want float64 }{
		{10, 60, (10*.2 + 30*.8 + 10*.5) / 50},
		{0, 60, (10*.2 + 30*.8 + 10*.5) / 50}, // before the first share: not covered
		{20, 50, .8},
		{15, 25, .5},
		{55, 60, .5},
		{0, 5, 0},
	} {
		if got := meanShare(xys, c.a, c.b); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("mean over [%v, %v) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
	got := bucketMeans(xys, 10, 60, 25)
	want := plotter.XYs{{X: 10, Y: (10*.2 + 15*.8) / 25}, {X: 35, Y: (15*.8 + 10*.5) / 25}, {X: 60, Y: (15*.8 + 10*.5) / 25}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("bucketMeans = %v, want %v", got, want)
	}
}

// TestSparseShareChart: a share that flips at every interval, as a sparse
// log's do, is drawn as hourly means with a note saying so, and the table
// gives each region's time-weighted mean, least, most and changes; a share
// that never changes is drawn as it is, with no note.
func TestSparseShareChart(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var a, b []replay.SharePoint
	for i := range 600 { // 10 h of a share every minute, flipping between .9 and .1 every 2 min
		f := .9
		if i%4 >= 2 {
			f = .1
		}
		a = append(a, replay.SharePoint{At: at.Add(time.Duration(i) * time.Minute), Fraction: f})
		b = append(b, replay.SharePoint{At: at.Add(time.Duration(i) * time.Minute), Fraction: 1 - f})
	}
	r := &replay.Report{
		Rules:   rules.NewSet("d", 0, nil),
		Regions: []string{"a", "b"},
		ShareSeries: map[string]*replay.ShareSeries{
			"g|": {Points: map[string][]replay.SharePoint{"a": a, "b": b}, Written: 1200},
			"h|": {Points: map[string][]replay.SharePoint{"a": {{At: at, Fraction: .5}, {At: at.Add(time.Hour), Fraction: .5}}}, Written: 2},
		},
	}
	_, shares, _, err := Charts(r)
	if err != nil {
		t.Fatal(err)
	}
	if len(shares) != 2 {
		t.Fatalf("%d share charts, want 2", len(shares))
	}
	g, h := shares[0], shares[1]
	if !strings.Contains(g.Note, "mean share per 30m") || !strings.Contains(g.Note, "299 times") {
		t.Errorf("the flipping share's note: %q", g.Note)
	}
	if len(g.Rows) != 2 || g.Rows[0].Region != "a" || math.Abs(g.Rows[0].Mean-.5) > .01 || g.Rows[0].Min != .1 || g.Rows[0].Max != .9 || g.Rows[0].Changes != 299 {
		t.Errorf("rows %+v", g.Rows)
	}
	// 30-minute means of a share that flips every 2 min are about .5,
	// where the raw line spans .1 to .9.
	var xys plotter.XYs
	for _, p := range a {
		xys = append(xys, plotter.XY{X: unix(p.At), Y: p.Fraction})
	}
	means := bucketMeans(steps(xys), xys[0].X, xys[len(xys)-1].X, 1800)
	if len(means) != 21 { // 20 buckets in 599 min, and the end
		t.Errorf("%d points of means, want 21", len(means))
	}
	for _, m := range means {
		if m.Y < .45 || m.Y > .55 {
			t.Errorf("a 30-minute mean of %v, want about .5", m.Y)
		}
	}
	if h.Note != "" || len(h.Rows) != 1 || h.Rows[0].Changes != 0 || h.Rows[0].Mean != .5 {
		t.Errorf("the steady share: note %q rows %+v", h.Note, h.Rows)
	}
}
