// Package htmlreport writes a replay's report (replay.Report) as one
// self-contained HTML page: the text report's tables and charts drawn with
// gonum/plot as inline SVG, with no script and no external asset.
//
// It is apart from package replay so that a binary that replays without
// writing the page (cmd/sluice built with -tags nocharts, the sidecar's)
// does not link gonum/plot and its font, LaTeX and PDF dependencies.
package htmlreport

import (
	"bytes"
	"cmp"
	"fmt"
	"html/template"
	"image/color"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/replay"
	"github.com/sluice-rl/sluice/rules"
)

// Limits of the HTML report's charts, so that a long replay with many
// rules and keys stays a page one can read.
const (
	maxRuleCharts  = 24 // allowed and denied: static rules, most matched first, then the detector rules
	maxShareCharts = 12 // shares: global rules' default split, then their busiest keys
	maxDetections  = 60 // detection timeline rows, first emitted first
)

// Chart is one chart of the HTML report: a title and an inline SVG, and
// for a share chart a note on what it draws and a row per region.
type Chart struct {
	Title string
	SVG   template.HTML
	Note  string
	Rows  []ShareRow
}

// ShareRow sums up one region's share of a global rule over the replay:
// the time-weighted mean from its first share to the end of the chart, the
// least and the most, and how many times it changed (over the points a
// replay.ShareSeries keeps: past replay.MaxSharePoints, fewer than
// happened).
type ShareRow struct {
	Region         string
	Mean, Min, Max float64
	Changes        int
}

// Charts draws the report's charts with gonum/plot as SVG: allowed, denied
// (and shadow-denied and degraded, when there are any) per second over
// event time for each rule; each global rule's shares per region over time;
// and a timeline of the detector's rules, from the window that produced
// each (its evidence's window_start and window_end) to its expiry. A
// section with nothing to draw has no chart.
func Charts(r *replay.Report) (rulesCharts, shareCharts []Chart, detections *Chart, err error) {
	for _, id := range chartedRules(r) {
		c, err := ruleChart(r, id)
		if err != nil {
			return nil, nil, nil, err
		}
		rulesCharts = append(rulesCharts, c)
	}
	for _, k := range chartedShares(r) {
		c, err := shareChart(r, k)
		if err != nil {
			return nil, nil, nil, err
		}
		shareCharts = append(shareCharts, c)
	}
	if len(r.DynamicRules) > 0 {
		c, err := detectionChart(r)
		if err != nil {
			return nil, nil, nil, err
		}
		detections = &c
	}
	return rulesCharts, shareCharts, detections, nil
}

// chartedRules returns the series to chart: static rules that matched,
// most matched first, then the detector rules.
func chartedRules(r *replay.Report) []string {
	var ids []string
	for id := range r.Timeline.Series {
		if id != replay.DynamicSeries {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, func(a, b string) int {
		return cmp.Or(r.Rule(b).Matched-r.Rule(a).Matched, strings.Compare(a, b))
	})
	ids = ids[:min(len(ids), maxRuleCharts)]
	if _, ok := r.Timeline.Series[replay.DynamicSeries]; ok {
		ids = append(ids, replay.DynamicSeries)
	}
	return ids
}

// chartedShares returns the rule|key share series to chart: each global
// rule's default split first, then the keys with the most shares written.
func chartedShares(r *replay.Report) []string {
	n := map[string]int{}
	for k, s := range r.ShareSeries {
		n[k] = s.Written
	}
	ks := slices.Collect(maps.Keys(n))
	slices.SortFunc(ks, func(a, b string) int {
		ad, bd := strings.HasSuffix(a, "|"), strings.HasSuffix(b, "|")
		switch {
		case ad && !bd:
			return -1
		case bd && !ad:
			return 1
		}
		return cmp.Or(n[b]-n[a], strings.Compare(a, b))
	})
	return ks[:min(len(ks), maxShareCharts)]
}

// Colors of the charts: allowed green, denied red, detector rules red when
// enforced and grey in shadow mode.
var (
	allowedColor  = color.RGBA{R: 30, G: 140, B: 70, A: 255}
	deniedColor   = color.RGBA{R: 200, G: 40, B: 40, A: 255}
	shadowColor   = color.RGBA{R: 140, G: 140, B: 140, A: 255}
	evidenceColor = color.RGBA{R: 60, G: 90, B: 200, A: 255}
)

// newPlot returns a plot over event time. The chart's title is the HTML
// figure's caption, not drawn in the SVG.
func newPlot(ylabel string) *plot.Plot {
	p := plot.New()
	p.X.Label.Text = "event time (UTC)"
	p.X.Tick.Marker = plot.TimeTicks{Format: "15:04:05"}
	p.Y.Label.Text = ylabel
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	return p
}

// unix returns t as the X value of a time axis.
func unix(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

func ruleChart(r *replay.Report, id string) (Chart, error) {
	tl := &r.Timeline
	s := tl.Series[id]
	title := "rule " + id
	if id == replay.DynamicSeries {
		title = "detector rules (all, summed)"
	} else if rule := r.RuleByID(id); rule != nil {
		title += ": " + rule.Describe()
	}
	p := newPlot(fmt.Sprintf("requests per second (%s buckets)", tl.Step))
	p.Y.Min = 0
	type line struct {
		name  string
		color color.Color
		get   func(replay.RuleCounts) int
	}
	lines := []line{
		{"allowed", allowedColor, func(c replay.RuleCounts) int { return c.Allowed }},
		{"denied", deniedColor, func(c replay.RuleCounts) int { return c.Denied }},
		{"shadow-denied", color.RGBA{R: 230, G: 140, B: 20, A: 255}, func(c replay.RuleCounts) int { return c.ShadowDenied }},
		{"degraded", color.RGBA{R: 120, G: 60, B: 160, A: 255}, func(c replay.RuleCounts) int { return c.Degraded }},
	}
	secs := tl.Step.Seconds()
	for i, ln := range lines {
		total := 0
		xys := make(plotter.XYs, len(s))
		for j, c := range s {
			v := ln.get(c)
			total += v
			xys[j] = plotter.XY{X: unix(tl.At(j)), Y: float64(v) / secs}
		}
		if total == 0 && i > 1 { // allowed and denied always; the others when they happened
			continue
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return Chart{}, fmt.Errorf("htmlreport: chart of rule %s: %w", id, err)
		}
		l.Color = ln.color
		l.Width = vg.Points(1.2)
		p.Add(l)
		p.Legend.Add(ln.name, l)
	}
	return svgChart(p, title, 11*vg.Inch, 3*vg.Inch)
}

func shareChart(r *replay.Report, k string) (Chart, error) {
	rule, key, _ := strings.Cut(k, "|")
	name := "default split"
	if key != "" {
		name = r.EntityValue(key)
		if name == "" {
			name = key
		}
	}
	title := fmt.Sprintf("shares of rule %s, %s", rule, name)
	p := newPlot("share of the global limit")
	p.Y.Min, p.Y.Max = 0, 1
	by := map[string]plotter.XYs{}
	if ss := r.ShareSeries[k]; ss != nil {
		for reg, ps := range ss.Points {
			for _, s := range ps {
				by[reg] = append(by[reg], plotter.XY{X: unix(s.At), Y: s.Fraction})
			}
			if last, ok := ss.Last[reg]; ok && (len(ps) == 0 || last.At.After(ps[len(ps)-1].At)) {
				by[reg] = append(by[reg], plotter.XY{X: unix(last.At), Y: last.Fraction})
			}
		}
	}
	regions := slices.Clone(r.Regions)
	for reg := range by {
		if !slices.Contains(regions, reg) {
			regions = append(regions, reg)
		}
	}
	// The chart ends where the last share of any region was written; each
	// share holds until the next, the last until that end.
	var from, end float64
	first := true
	for _, reg := range regions {
		xys := by[reg]
		if len(xys) == 0 {
			continue
		}
		slices.SortStableFunc(xys, func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
		by[reg] = steps(xys)
		if first || xys[0].X < from {
			from = xys[0].X
		}
		if first || xys[len(xys)-1].X > end {
			end = xys[len(xys)-1].X
		}
		first = false
	}
	changes := 0
	for _, xys := range by {
		changes = max(changes, shareChanges(xys))
	}
	// A sparse log's shares flip at almost every interval, as demand moves
	// from region to region: drawn change by change they are noise. Past
	// maxShareChanges changes in a region, each region's line is its
	// time-weighted mean share per wider bucket, a multiple of the
	// timeline's, about shareBuckets of them.
	var width float64
	note := ""
	if changes > maxShareChanges && end > from {
		w := niceBucket(time.Duration((end - from) / shareBuckets * float64(time.Second)))
		width = w.Seconds()
		note = fmt.Sprintf("Each line is the region's time-weighted mean share per %s: a region's share changed up to %d times, too often to draw change by change.",
			shortDuration(w), changes)
	}
	var rows []ShareRow
	for i, reg := range regions {
		xys := by[reg]
		if len(xys) == 0 {
			continue
		}
		row := ShareRow{Region: reg, Mean: meanShare(xys, xys[0].X, end), Min: 1, Max: 0, Changes: shareChanges(xys)}
		for _, xy := range xys {
			row.Min, row.Max = min(row.Min, xy.Y), max(row.Max, xy.Y)
		}
		rows = append(rows, row)
		if width > 0 {
			xys = bucketMeans(xys, from, end, width)
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return Chart{}, fmt.Errorf("htmlreport: share chart %s: %w", k, err)
		}
		l.Color = plotutil.Color(i)
		l.StepStyle = plotter.PostStep // a share holds until the next
		l.Width = vg.Points(1.2)
		p.Add(l)
		if len(xys) <= maxSharePoints && width == 0 {
			pts, err := plotter.NewScatter(xys)
			if err != nil {
				return Chart{}, fmt.Errorf("htmlreport: share chart %s: %w", k, err)
			}
			pts.Color, pts.Radius = l.Color, vg.Points(1.5)
			p.Add(pts)
		}
		p.Legend.Add(reg, l)
	}
	c, err := svgChart(p, title, 11*vg.Inch, 3*vg.Inch)
	c.Note, c.Rows = note, rows
	return c, err
}

// shareChanges counts the points of a step function where its value
// changes.
func shareChanges(xys plotter.XYs) int {
	n := 0
	for i := 1; i < len(xys); i++ {
		if xys[i].Y != xys[i-1].Y {
			n++
		}
	}
	return n
}

// shortDuration writes d without zero minutes and seconds: 1h, 30m, 1h30m.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// niceBuckets are the widths a share chart's buckets are rounded up to.
var niceBuckets = []time.Duration{time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute,
	30 * time.Minute, time.Hour, 2 * time.Hour, 3 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour}

// niceBucket is the least of niceBuckets at least d, or d in whole days.
func niceBucket(d time.Duration) time.Duration {
	for _, n := range niceBuckets {
		if n >= d {
			return n
		}
	}
	return (d + 24*time.Hour - 1) / (24 * time.Hour) * (24 * time.Hour)
}

// maxShareChanges is the most changes of a region's share drawn one by
// one; past it, the chart draws means over at most shareBuckets buckets.
const (
	maxShareChanges = 60
	shareBuckets    = 24
)

// meanShare is the time-weighted mean over [a, b) of the step function
// xys (sorted by X; each Y holds from its X until the next point's, the
// last until b), over the part of [a, b) that xys covers; 0 if none.
func meanShare(xys plotter.XYs, a, b float64) float64 {
	sum, covered := 0.0, 0.0
	for i, xy := range xys {
		until := b
		if i+1 < len(xys) {
			until = xys[i+1].X
		}
		if lo, hi := max(xy.X, a), min(until, b); hi > lo {
			sum += xy.Y * (hi - lo)
			covered += hi - lo
		}
	}
	if covered == 0 {
		if len(xys) > 0 && a == b {
			return xys[len(xys)-1].Y
		}
		return 0
	}
	return sum / covered
}

// bucketMeans returns the step function xys (as meanShare reads it) as its
// mean per bucket of width seconds from from to end: one point at the start
// of each bucket it covers, and one at end holding the last bucket's mean,
// to be drawn with PostStep.
func bucketMeans(xys plotter.XYs, from, end, width float64) plotter.XYs {
	var out plotter.XYs
	for b := from; b < end; b += width {
		hi := min(b+width, end)
		if hi <= xys[0].X {
			continue
		}
		out = append(out, plotter.XY{X: max(b, xys[0].X), Y: meanShare(xys, b, hi)})
	}
	if len(out) == 0 {
		return xys
	}
	return append(out, plotter.XY{X: end, Y: out[len(out)-1].Y})
}

// maxSharePoints is the most share changes of one region drawn with a dot
// each; past it, the step line alone.
const maxSharePoints = 200

// steps keeps, of a step function's points sorted by X, the first, the last
// and each that changes the value: the aggregator re-sends an unchanged
// share every two intervals, which draws nothing new (a day of them would
// make a chart of megabytes).
func steps(xys plotter.XYs) plotter.XYs {
	out := xys[:0:0]
	for i, xy := range xys {
		if i == 0 || i == len(xys)-1 || xy.Y != out[len(out)-1].Y {
			out = append(out, xy)
		}
	}
	return out
}

// detectionChart draws one row per detector rule: a thin bar over the
// window whose evidence produced it, a thick one from the window's end to
// the rule's expiry (red when enforced, grey in shadow mode).
func detectionChart(r *replay.Report) (Chart, error) {
	ds := r.DynamicRules[:min(len(r.DynamicRules), maxDetections)]
	title := fmt.Sprintf("detections: %s, %s", count(len(r.DistinctDynamicRules()), "rule"), count(max(r.DynamicRulesEmitted, len(r.DynamicRules)), "emission"))
	if len(ds) < len(r.DynamicRules) {
		title += fmt.Sprintf(" (the first %d shown)", len(ds))
	}
	p := newPlot("")
	names := make([]string, len(ds))
	enforced, shadow := deniedColor, shadowColor
	for i, d := range ds {
		y := float64(len(ds) - 1 - i) // first emitted on top
		names[len(ds)-1-i] = d.ID + " (" + d.Origin + ")"
		start, errS := time.Parse(time.RFC3339, d.Evidence["window_start"])
		end, errE := time.Parse(time.RFC3339, d.Evidence["window_end"])
		if errS != nil || errE != nil {
			end = d.ExpiresAt // no window in its evidence: a mark at its expiry
			start = end
		}
		window, err := plotter.NewLine(plotter.XYs{{X: unix(start), Y: y}, {X: unix(end), Y: y}})
		if err != nil {
			return Chart{}, err
		}
		window.Width = vg.Points(2)
		window.Color = evidenceColor
		active, err := plotter.NewLine(plotter.XYs{{X: unix(end), Y: y}, {X: unix(d.ExpiresAt), Y: y}})
		if err != nil {
			return Chart{}, err
		}
		active.Width = vg.Points(7)
		active.Color = enforced
		if d.Mode == rules.Shadow {
			active.Color = shadow
		}
		p.Add(window, active)
		if i == 0 {
			p.Legend.Add("evidence window", window)
		}
	}
	p.NominalY(names...)
	p.Y.Label.Text = ""
	legend := func(c color.Color, name string) {
		l, _ := plotter.NewLine(plotter.XYs{})
		l.Width, l.Color = vg.Points(7), c
		p.Legend.Add(name, l)
	}
	legend(enforced, "in force (enforce)")
	legend(shadow, "in force (shadow)")
	h := vg.Length(len(ds))*vg.Points(16) + vg.Inch
	return svgChart(p, title, 11*vg.Inch, h)
}

// svgChart draws p as an SVG element, without the XML prolog, to be inlined
// in the page. The legend goes in a strip right of the plot, where it hides
// no data.
func svgChart(p *plot.Plot, title string, w, h vg.Length) (Chart, error) {
	c := vgsvg.New(w, h)
	dc := draw.New(c)
	leg := p.Legend
	p.Legend = plot.NewLegend()
	if size := leg.Rectangle(dc).Size(); size.X > 0 {
		gap := vg.Points(8)
		strip := size.X + 2*gap
		p.Draw(draw.Crop(dc, 0, -strip, 0, 0))
		leg.Top, leg.Left = true, true
		leg.Draw(draw.Crop(dc, w-strip+gap, 0, 0, 0))
	} else {
		p.Draw(dc)
	}
	var buf bytes.Buffer
	if _, err := c.WriteTo(&buf); err != nil {
		return Chart{}, fmt.Errorf("htmlreport: drawing %q: %w", title, err)
	}
	svg := buf.String()
	i := strings.Index(svg, "<svg")
	if i < 0 {
		return Chart{}, fmt.Errorf("htmlreport: drawing %q: no <svg> element in gonum/plot's output", title)
	}
	return Chart{Title: title, SVG: template.HTML(svg[i:])}, nil // our own drawing; its text is escaped by vgsvg
}

// Write writes the report as one self-contained HTML page: the text
// report's tables and the charts of Charts, inline SVG, with no script and
// no external asset.
func Write(w io.Writer, r *replay.Report) error {
	ruleCharts, shareCharts, detections, err := Charts(r)
	if err != nil {
		return err
	}
	adaptiveCharts, err := AdaptiveCharts(r)
	if err != nil {
		return err
	}
	var text bytes.Buffer
	r.Print(&text)
	type outcome struct {
		Name string
		N    int
	}
	var outcomes []outcome
	for o := decision.Allowed; o <= decision.DegradedClosed; o++ {
		if n := r.Outcomes[o]; n > 0 || o <= decision.Denied {
			outcomes = append(outcomes, outcome{o.String(), n})
		}
	}
	var sources []string
	for _, s := range r.Sources {
		sources = append(sources, s.Name)
	}
	var first, last string
	if r.Timeline.Len() > 0 {
		first = r.Timeline.Start.UTC().Format(time.RFC3339)
		last = r.Timeline.At(r.Timeline.Len()).UTC().Format(time.RFC3339)
	}
	return htmlPage.Execute(w, map[string]any{
		"Sources": strings.Join(sources, ", "), "Requests": r.Requests, "Outcomes": outcomes,
		"Problems": r.Problems, "From": first, "To": last, "Step": r.Timeline.Step,
		"RuleCharts": ruleCharts, "ShareCharts": shareCharts, "Detections": detections,
		"Dynamic": len(r.DynamicRules), "Text": text.String(), "AdaptiveCharts": adaptiveCharts,
	})
}

var htmlPage = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>sluice replay report</title>
<style>
body { font-family: sans-serif; margin: 2em auto; max-width: 72em; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #ccc; }
figure { margin: 1em 0; } figcaption { font-weight: bold; margin-bottom: .3em; }
figure svg { width: 100%; height: auto; }
table { border-collapse: collapse; } td, th { padding: .2em .8em; text-align: right; border-bottom: 1px solid #eee; }
th:first-child, td:first-child { text-align: left; }
.problems { background: #fff3f0; border-left: 4px solid #c33; padding: .5em 1em; }
.note { font-size: .9em; color: #555; margin: .2em 0; }
pre { background: #f6f6f6; padding: 1em; overflow-x: auto; font-size: .85em; }
</style>
</head>
<body>
<h1>sluice replay report</h1>
<p>{{.Requests}} requests from {{.Sources}}{{if .From}}, event time {{.From}} to {{.To}} (buckets of {{.Step}}){{end}}.</p>
{{if .Problems}}<div class="problems"><strong>Problems: the figures are partial or degraded</strong><ul>{{range .Problems}}<li>{{.}}</li>{{end}}</ul></div>{{end}}
<table id="outcomes"><tr><th>outcome</th><th>decisions</th></tr>
{{range .Outcomes}}<tr><td>{{.Name}}</td><td>{{.N}}</td></tr>
{{end}}</table>

<h2 id="rules">Allowed and denied over time, per rule</h2>
{{range .RuleCharts}}<figure class="chart"><figcaption>{{.Title}}</figcaption>{{.SVG}}</figure>
{{else}}<p>No rule matched a request.</p>
{{end}}
{{if .AdaptiveCharts}}<h2 id="adaptive">Backend health, adaptive limits and load shedding</h2>
{{range .AdaptiveCharts}}<figure class="chart"><figcaption>{{.Title}}</figcaption>{{.SVG}}</figure>
{{end}}{{end}}
<h2 id="shares">Shares per region over time</h2>
{{range .ShareCharts}}<figure class="chart"><figcaption>{{.Title}}</figcaption>{{.SVG}}
{{with .Note}}<p class="note">{{.}}</p>{{end}}
<table class="shares"><tr><th>region</th><th>mean share</th><th>least</th><th>most</th><th>changes</th></tr>
{{range .Rows}}<tr><td>{{.Region}}</td><td>{{printf "%.3f" .Mean}}</td><td>{{printf "%.3f" .Min}}</td><td>{{printf "%.3f" .Max}}</td><td>{{.Changes}}</td></tr>
{{end}}</table></figure>
{{else}}<p>No share was written: no global rule matched.</p>
{{end}}
<h2 id="detections">Detections</h2>
{{with .Detections}}<figure class="chart"><figcaption>{{.Title}}</figcaption>{{.SVG}}</figure>
{{else}}<p>The detector emitted no rule.</p>
{{end}}
<h2 id="text">The full report</h2>
<pre>{{.Text}}</pre>
</body>
</html>
`))

// count writes n with the noun, singular for 1: "1 rule", "2 rules". noun
// is the singular; an s makes the plural.
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
