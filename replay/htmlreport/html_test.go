package htmlreport_test

import (
	"bytes"
	"context"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/html"

	"github.com/sluice-rl/sluice/replay"
	"github.com/sluice-rl/sluice/replay/htmlreport"
	"github.com/sluice-rl/sluice/rules"
)

// chromium returns the command line that runs Debian's chromium headless
// with args, failing the test if it is not installed.
func chromium(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	bin := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			bin = p
			break
		}
	}
	if bin == "" {
		t.Fatal("no chromium in PATH: install Debian's chromium package (deploy/ci/deps.sh does)")
	}
	base := []string{"--headless", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
		"--user-data-dir=" + t.TempDir(), "--window-size=1200,2400"}
	if os.Geteuid() == 0 {
		base = append(base, "--no-sandbox") // Chromium refuses to run as root with its sandbox
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return exec.CommandContext(ctx, bin, append(base, args...)...)
}

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

// figure is one chart as the browser parsed it.
type figure struct {
	section, caption string
	svgs, paths      int // <svg> elements; <path> elements with a non-empty d
	texts            int
}

// figures walks the DOM Chromium dumped and returns the charts under each
// <h2 id=...> section.
func figures(doc *html.Node) []figure {
	var out []figure
	section := ""
	var walk func(n *html.Node, f *figure)
	walk = func(n *html.Node, f *figure) {
		if n.Type == html.ElementNode {
			switch {
			case n.Data == "h2":
				section = attr(n, "id")
			case n.Data == "figure" && f == nil:
				out = append(out, figure{section: section})
				f = &out[len(out)-1]
			case f != nil && n.Data == "figcaption" && n.FirstChild != nil:
				f.caption = n.FirstChild.Data
			case f != nil && n.Data == "svg" && n.Namespace == "svg":
				f.svgs++
			case f != nil && n.Data == "path" && n.Namespace == "svg" && strings.TrimSpace(attr(n, "d")) != "":
				f.paths++
			case f != nil && n.Data == "text" && n.Namespace == "svg":
				f.texts++
			}
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c, f)
		}
	}
	walk(doc, nil)
	return out
}

// near reports whether c is within 40 of want in each channel.
func near(r, g, b uint32, want [3]uint32) bool {
	d := func(x, y uint32) bool { return max(x, y)-min(x, y) <= 40 }
	return d(r>>8, want[0]) && d(g>>8, want[1]) && d(b>>8, want[2])
}

// TestHTMLEscapes: values from the logs (an entity's key names a share
// chart, a region a line of it) are escaped in the page and in its SVG.
func TestHTMLEscapes(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	key := `api_key=<script>alert(1)</script>` // no entity value for it: the chart is named by the key
	r := &replay.Report{
		Rules:   rules.NewSet("d", 0, nil),
		Regions: []string{"a", "<script>b"},
		ShareSeries: map[string]*replay.ShareSeries{"g|" + key: {
			Points:  map[string][]replay.SharePoint{"a": {{At: at, Fraction: .5}}, "<script>b": {{At: at, Fraction: .5}}},
			Written: 2,
		}},
		Sources: []*replay.SourceReport{{Name: `<img src=x onerror=alert(2)>.log`}},
	}
	var b bytes.Buffer
	if err := htmlreport.Write(&b, r); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	for _, bad := range []string{"<script", "<img"} {
		if strings.Contains(page, bad) {
			t.Errorf("the page holds %q from the input, unescaped", bad)
		}
	}
	if !strings.Contains(page, "&lt;script&gt;") || strings.Count(page, "<svg") != 1 {
		t.Errorf("want the escaped value and one chart (the shares); page:\n%s", page)
	}
}

// TestHTMLReportRenders replays the generated scenario, writes the HTML
// report, and opens it in headless Chromium: the page as the browser parsed
// it has a chart for every rule that matched, for every share series and
// for the detections, each an SVG with drawn paths and text; and a
// screenshot shows the charts' allowed (green) and denied (red) lines.
func TestHTMLReportRenders(t *testing.T) {
	// A short scenario (the scraper runs from the 1st minute to 60% of it)
	// that still denies and detects: the test is about the page.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := replay.Run(ctx, replay.Options{}, replay.Generate(replay.Scenario{Duration: 150 * time.Second, Clients: 60}))
	if err != nil {
		t.Fatal(err)
	}

	// The per-interval counts add up to the per-rule totals.
	tl := rep.Timeline
	if tl.Len() == 0 || tl.Step != time.Second {
		t.Fatalf("timeline of %d buckets of %v: want 1-s buckets over the 150 s", tl.Len(), tl.Step)
	}
	var dyn replay.RuleCounts
	for _, d := range rep.DynamicRules {
		c := rep.Rule(d.ID)
		dyn.Matched += c.Matched
		dyn.Denied += c.Denied
		dyn.Allowed += c.Allowed
	}
	for id, s := range tl.Series {
		var sum replay.RuleCounts
		for _, c := range s {
			sum.Matched += c.Matched
			sum.Allowed += c.Allowed
			sum.Denied += c.Denied
		}
		want := rep.Rule(id)
		if id == replay.DynamicSeries {
			want = dyn
		}
		if sum.Matched != want.Matched || sum.Allowed != want.Allowed || sum.Denied != want.Denied {
			t.Errorf("series %s adds up to %+v, the rule's counts are %+v", id, sum, want)
		}
	}
	if rep.Rule("per-ip").Denied == 0 || len(rep.DynamicRules) == 0 {
		t.Fatalf("the scenario should deny (per-ip %+v) and detect (%d rules)", rep.Rule("per-ip"), len(rep.DynamicRules))
	}

	page := filepath.Join(t.TempDir(), "report.html")
	var b bytes.Buffer
	if err := htmlreport.Write(&b, rep); err != nil {
		t.Fatal(err)
	}
	for _, external := range []string{"<script", "<link", " src=", "href=\"http", "url("} {
		if strings.Contains(b.String(), external) {
			t.Errorf("the page is not self-contained: it has %q", external)
		}
	}
	if err := os.WriteFile(page, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	url := "file://" + page

	cmd := chromium(t, "--dump-dom", url)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	dom, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium --dump-dom: %v\n%s", err, stderr.Bytes())
	}
	doc, err := html.Parse(bytes.NewReader(dom))
	if err != nil {
		t.Fatal(err)
	}
	figs := figures(doc)
	count := map[string]int{}
	for _, f := range figs {
		count[f.section]++
		// A line chart has its frame, grid, ticks and at least one line;
		// gonum/plot draws each as a path.
		if f.svgs != 1 || f.paths < 5 || f.texts < 3 {
			t.Errorf("chart %q (%s): %d svg, %d drawn paths, %d texts: want one SVG with its lines and labels", f.caption, f.section, f.svgs, f.paths, f.texts)
		}
	}
	if want := len(tl.Series); count["rules"] != want {
		t.Errorf("%d rule charts, want %d (one per rule series)", count["rules"], want)
	}
	if count["shares"] == 0 || count["detections"] != 1 {
		t.Errorf("%d share charts and %d detection timelines, want some and one", count["shares"], count["detections"])
	}

	shot := filepath.Join(t.TempDir(), "shot.png")
	cmd = chromium(t, "--screenshot="+shot, url)
	stderr.Reset()
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium --screenshot: %v\n%s", err, stderr.Bytes())
	}
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	var ink, green, red int
	bounds := img.Bounds()
	for y := bounds.Min.Y; y < bounds.Max.Y; y++ {
		for x := bounds.Min.X; x < bounds.Max.X; x++ {
			r, g, b, _ := img.At(x, y).RGBA()
			if r>>8 < 230 || g>>8 < 230 || b>>8 < 230 {
				ink++
			}
			if near(r, g, b, [3]uint32{30, 140, 70}) {
				green++
			}
			if near(r, g, b, [3]uint32{200, 40, 40}) {
				red++
			}
		}
	}
	total := bounds.Dx() * bounds.Dy()
	t.Logf("charts: %v; screenshot %v: %d pixels drawn, %d green, %d red", count, bounds, ink, green, red)
	if ink < total/100 || green < 200 || red < 200 {
		t.Errorf("screenshot %v: %d of %d pixels drawn, %d green (allowed), %d red (denied): the charts did not render", bounds, ink, total, green, red)
	}
}
