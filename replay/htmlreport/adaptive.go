package htmlreport

import (
	"fmt"
	"image/color"

	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/sluice-rl/sluice/replay"
	"github.com/sluice-rl/sluice/rules"
)

// AdaptiveCharts draws, for a replay with a simulated backend
// (replay.Options.Backend), the adaptive factor and the backend's 5xx share
// per second, and the requests shed per second by priority; none without
// one.
func AdaptiveCharts(r *replay.Report) ([]Chart, error) {
	if len(r.Adaptive) == 0 {
		return nil, nil
	}
	line := func(xys plotter.XYs, c color.Color) (*plotter.Line, error) {
		l, err := plotter.NewLine(xys)
		if err != nil {
			return nil, fmt.Errorf("htmlreport: adaptive chart: %w", err)
		}
		l.Color, l.Width = c, vg.Points(1.2)
		return l, nil
	}
	health := newPlot("fraction")
	health.Y.Min, health.Y.Max = 0, 1
	factor := make(plotter.XYs, len(r.Adaptive))
	errs := make(plotter.XYs, len(r.Adaptive))
	for i, a := range r.Adaptive {
		factor[i] = plotter.XY{X: unix(a.Time), Y: a.Factor}
		share := 0.0
		if a.Responses > 0 {
			share = float64(a.Errors) / float64(a.Responses)
		}
		errs[i] = plotter.XY{X: unix(a.Time), Y: share}
	}
	for _, s := range []struct {
		name string
		xys  plotter.XYs
		c    color.Color
	}{{"adaptive factor", factor, allowedColor}, {"backend 5xx share", errs, deniedColor}} {
		l, err := line(s.xys, s.c)
		if err != nil {
			return nil, err
		}
		health.Add(l)
		health.Legend.Add(s.name, l)
	}
	hc, err := svgChart(health, "adaptive factor and the backend's 5xx share, per second", 11*vg.Inch, 3*vg.Inch)
	if err != nil {
		return nil, err
	}
	shed := newPlot("requests shed per second")
	shed.Y.Min = 0
	for _, pr := range []struct {
		p rules.Priority
		c color.Color
	}{{rules.Sheddable, color.RGBA{R: 230, G: 140, B: 20, A: 255}}, {rules.Normal, deniedColor}, {rules.Critical, color.RGBA{R: 120, G: 60, B: 160, A: 255}}} {
		xys := make(plotter.XYs, len(r.Adaptive))
		for i, a := range r.Adaptive {
			xys[i] = plotter.XY{X: unix(a.Time), Y: float64(a.Shed[pr.p])}
		}
		l, err := line(xys, pr.c)
		if err != nil {
			return nil, err
		}
		shed.Add(l)
		shed.Legend.Add(pr.p.String(), l)
	}
	sc, err := svgChart(shed, "requests refused by load shedding, by priority", 11*vg.Inch, 3*vg.Inch)
	if err != nil {
		return nil, err
	}
	return []Chart{hc, sc}, nil
}
