package detector

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/sketch"
)

// pageRequest is one request a real browser made: when (from the first),
// what and how the server answered.
type pageRequest struct {
	at     time.Duration
	method string
	path   string
	ua     string
	status uint32
}

// recordPageLoad serves a page of 100 subresources (60 images of which 11
// are missing, 20 style sheets, 20 scripts) on loopback, loads it with
// Debian's headless Chromium and returns every request the server saw
// (with the browser's own /favicon.ico, also missing).
func recordPageLoad(t *testing.T) []pageRequest {
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
	var (
		mu    sync.Mutex
		reqs  []pageRequest
		first time.Time
	)
	page := new(strings.Builder)
	page.WriteString("<!doctype html><html><head><title>a page</title>\n")
	for i := range 20 {
		fmt.Fprintf(page, "<link rel=stylesheet href=\"/static/css/s%d.css\">\n", i)
	}
	page.WriteString("</head><body><h1>A page with 100 subresources</h1>\n")
	for i := range 60 {
		fmt.Fprintf(page, "<img src=\"/img/photo-%d.png\" width=8 height=8>\n", i)
	}
	for i := range 20 {
		fmt.Fprintf(page, "<script src=\"/static/js/m%d.js\"></script>\n", i)
	}
	page.WriteString("</body></html>\n")
	png := []byte("\x89PNG\r\n\x1a\n") // a header: enough for a request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		status := http.StatusOK
		switch p := r.URL.Path; {
		case p == "/":
			w.Header().Set("Content-Type", "text/html")
			_, _ = w.Write([]byte(page.String()))
		case strings.HasPrefix(p, "/img/photo-5"): // photo-5 and photo-50 to 59: missing
			status = http.StatusNotFound
			http.NotFound(w, r)
		case strings.HasSuffix(p, ".png"):
			w.Header().Set("Content-Type", "image/png")
			_, _ = w.Write(png)
		case strings.HasSuffix(p, ".css"):
			w.Header().Set("Content-Type", "text/css")
			_, _ = w.Write([]byte("body{margin:0}"))
		case strings.HasSuffix(p, ".js"):
			w.Header().Set("Content-Type", "text/javascript")
			_, _ = w.Write([]byte("var x=1;"))
		default:
			status = http.StatusNotFound
			http.NotFound(w, r)
		}
		mu.Lock()
		defer mu.Unlock()
		if first.IsZero() {
			first = time.Now()
		}
		reqs = append(reqs, pageRequest{at: time.Since(first), method: r.Method, path: r.URL.RequestURI(), ua: r.UserAgent(), status: uint32(status)})
	}))
	defer srv.Close()
	args := []string{"--headless", "--disable-gpu", "--no-first-run", "--user-data-dir=" + t.TempDir(), "--window-size=1200,2400",
		"--virtual-time-budget=5000", "--dump-dom", srv.URL + "/"}
	if os.Geteuid() == 0 {
		args = append(args, "--no-sandbox") // Chromium refuses to run as root with its sandbox
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput(); err != nil {
		t.Fatalf("chromium: %v\n%s", err, out)
	}
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(reqs)
}

// A real browser's page load (Chromium, headless, against a local page of
// a document and 100 subresources, 11 of them missing, and its favicon) draws no rule in
// any signal, among 100 ordinary visitors, when the visitor loads the page
// and then loads it again 8 s later: every signal of Signals with the
// default options. With assets counted whole (HeavyHitterOptions
// AssetWeight 1, as before), the same load draws a heavy-hitter rule, so
// the test can fail.
func TestPageLoadDrawsNoRule(t *testing.T) {
	load := recordPageLoad(t)
	var docs, assets, missing int
	for _, r := range load {
		switch {
		case r.path == "/":
			docs++
		case IsAsset(r.path):
			assets++
			if r.status == 404 {
				missing++
			}
		}
	}
	if docs != 1 || assets < 100 || missing < 10 {
		t.Fatalf("the recorded load has %d documents, %d assets (%d missing) in %d requests: want 1 document and 100 assets, 11 missing", docs, assets, missing, len(load))
	}
	t.Logf("Chromium loaded 1 document and %d assets in %v, user agent %q", assets, load[len(load)-1].at, load[0].ua)

	const visitor = "203.0.113.10"
	ja4 := "t13d1516h2_8daaf6152771_02713d6af862" // Chromium's (ja4-known-clients.tsv)
	var recs []*decisionpb.Decision
	rec := func(ip, path, ua string, status uint32, at time.Duration) {
		recs = append(recs, &decisionpb.Decision{Version: 1, EventTimeMs: t0.Add(at).UnixMilli(), Outcome: decisionpb.Outcome_OUTCOME_ALLOWED,
			Status: status, UserAgent: ua, Descriptors: &decisionpb.Descriptors{ClientIp: ip, Ja4: ja4, Method: "GET", Path: path, Route: strings.SplitN(path, "?", 2)[0]}})
	}
	// 100 visitors for 30 minutes, each a page and 3 of its images every
	// 30 s: baselines for every signal.
	for c := range 100 {
		ip := fmt.Sprintf("198.51.100.%d", c+1)
		for at := time.Duration(c) * 300 * time.Millisecond; at < 30*time.Minute; at += 30 * time.Second {
			rec(ip, fmt.Sprintf("/blog/%d", c%40), load[0].ua, 200, at)
			for i := range 3 {
				rec(ip, fmt.Sprintf("/img/photo-%d.png", (c+i)%40), load[0].ua, 200, at+time.Duration(i+1)*100*time.Millisecond)
			}
		}
	}
	for _, again := range []time.Duration{20 * time.Minute, 20*time.Minute + 8*time.Second} {
		for _, r := range load {
			rec(visitor, r.path, r.ua, r.status, again+r.at)
		}
	}
	slices.SortStableFunc(recs, func(a, b *decisionpb.Decision) int { return cmp.Compare(a.EventTimeMs, b.EventTimeMs) })

	run := func(o Options) []string {
		st, err := Signals(o)
		if err != nil {
			t.Fatal(err)
		}
		l := stage.NewLocal(st, 4, 5*time.Second)
		for _, d := range recs {
			l.Observe(int(sketch.Hash64(d.GetDescriptors().GetClientIp())%4), d)
		}
		var got []string
		for _, r := range l.Advance(t0.Add(2 * time.Hour)).Rules {
			got = append(got, r.Origin+" "+r.Reason)
		}
		return got
	}
	if got := run(Options{}); len(got) > 0 {
		t.Errorf("a page load and a reload drew %d rules, want none:\n%s", len(got), strings.Join(got, "\n"))
	}
	whole := run(Options{HeavyHitters: HeavyHitterOptions{AssetWeight: 1}})
	if !slices.ContainsFunc(whole, func(s string) bool { return strings.HasPrefix(s, "detector/heavy-hitter client_ip "+visitor) }) {
		t.Errorf("with assets counted whole the page load drew %v: want a heavy-hitter rule on %s (the test could not fail)", whole, visitor)
	}
}
