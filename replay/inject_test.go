package replay_test

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/detector/enrich"
	"github.com/sluice-rl/sluice/replay"
	"github.com/sluice-rl/sluice/replay/accesslog"
	"github.com/sluice-rl/sluice/rules"
)

// drain reads src to the end; malformed lines are counted, not returned.
func drain(t *testing.T, src replay.Source) (reqs []replay.Request, malformed int) {
	t.Helper()
	for {
		r, err := src.Next()
		if errors.Is(err, io.EOF) {
			return reqs, malformed
		}
		var pe *accesslog.ParseError
		if errors.As(err, &pe) {
			malformed++
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, r)
	}
}

func inject(t *testing.T, bg replay.Source, o replay.InjectOptions, scs ...replay.Injection) (*replay.Injector, []replay.Request) {
	t.Helper()
	in, err := replay.Inject(bg, o, scs...)
	if err != nil {
		t.Fatal(err)
	}
	reqs, _ := drain(t, in)
	return in, reqs
}

// small is every scenario, scaled down, all in the first minutes.
func small() []replay.Injection {
	return []replay.Injection{
		replay.Botnet{IPs: 300, Duration: 3 * time.Minute},
		replay.CredentialStuffing{Offset: 30 * time.Second, Duration: time.Minute, Rate: 10},
		replay.URIScan{Offset: time.Minute, Duration: time.Minute, IPs: 2},
		replay.UAFlood{Duration: time.Minute, Rate: 5},
		replay.Scraper{Offset: 90 * time.Second, Duration: time.Minute, Rate: 5},
		replay.CGNAT{Users: 100, Duration: 2 * time.Minute},
		replay.FlashCrowd{Offset: time.Minute, Users: 200, Ramp: 20 * time.Second, Duration: time.Minute},
	}
}

func background() replay.Source {
	return replay.Generate(replay.Scenario{Seed: 7, Duration: 3 * time.Minute, Clients: 30})
}

// enricher opens the real ASN and JA4 data, or skips.
func enricher(t *testing.T) *replay.Enricher {
	t.Helper()
	en, note := replay.OpenEnricher(sharedData(t), replay.DefaultRegions)
	if en.ASN == nil || en.JA4 == nil {
		t.Fatalf("enrichment data incomplete: %s", note)
	}
	t.Cleanup(func() { en.Close() })
	return en
}

func descriptors(en *replay.Enricher, r *replay.Request) *rules.Descriptors {
	_, q := en.Request("d", "id", r)
	return &q.Descriptors
}

func TestInjectDeterministic(t *testing.T) {
	_, a := inject(t, background(), replay.InjectOptions{Seed: 1}, small()...)
	_, b := inject(t, background(), replay.InjectOptions{Seed: 1}, small()...)
	if len(a) == 0 || !reflect.DeepEqual(a, b) {
		t.Fatalf("seed 1 twice: %d and %d requests, not identical", len(a), len(b))
	}
	_, c := inject(t, background(), replay.InjectOptions{Seed: 2}, small()...)
	if reflect.DeepEqual(a, c) {
		t.Fatal("seeds 1 and 2 gave identical requests")
	}
	// A scenario's requests depend on the seed and its name only: dropping
	// the others leaves the botnet's unchanged.
	_, d := inject(t, nil, replay.InjectOptions{Seed: 1, Start: a[0].Time}, small()[0])
	var bots []replay.Request
	for _, r := range a {
		if r.Label.Scenario == replay.ScenarioBotnet {
			bots = append(bots, r)
		}
	}
	if !reflect.DeepEqual(bots, d) {
		t.Errorf("the botnet alone: %d requests; among the others: %d, or different", len(d), len(bots))
	}
}

// The merged source is in event-time order, background requests keep their
// lines and no label, and every injected request lies in its scenario's span.
func TestInjectMergesInEventTimeOrder(t *testing.T) {
	bgReqs, _ := drain(t, background())
	in, reqs := inject(t, background(), replay.InjectOptions{Seed: 3}, small()...)
	spans := map[string]replay.Span{}
	for _, s := range in.Spans() {
		spans[s.Scenario] = s
	}
	if len(spans) != 7 || !spans[replay.ScenarioBotnet].Start.Equal(bgReqs[0].Time) {
		t.Fatalf("spans %v: want 7, the first starting at the background's first request %v", in.Spans(), bgReqs[0].Time)
	}
	var bg []replay.Request
	perScenario := map[string]int{}
	for i, r := range reqs {
		if i > 0 && r.Time.Before(reqs[i-1].Time) {
			t.Fatalf("request %d at %v comes after one at %v", i, r.Time, reqs[i-1].Time)
		}
		if !r.Label.Injected() {
			bg = append(bg, r)
			continue
		}
		perScenario[r.Label.Scenario]++
		s, ok := spans[r.Label.Scenario]
		if !ok || r.Time.Before(s.Start) || !r.Time.Before(s.End) {
			t.Fatalf("request %+v outside its scenario's span %+v", r, s)
		}
		if r.Line != perScenario[r.Label.Scenario] {
			t.Fatalf("%s request %d numbered %d", r.Label.Scenario, perScenario[r.Label.Scenario], r.Line)
		}
		if r.Label.Attack != s.Attack {
			t.Fatalf("request %+v: label and span disagree on attack", r)
		}
	}
	if !reflect.DeepEqual(bg, bgReqs) {
		t.Errorf("background: %d requests out of %d, or changed", len(bg), len(bgReqs))
	}
	if len(perScenario) != 7 {
		t.Errorf("requests per scenario: %v, want all 7", perScenario)
	}
	st := in.Stats()
	if st.Entries != len(reqs) || st.Lines != len(reqs) {
		t.Errorf("stats %+v, %d requests", st, len(reqs))
	}
}

// Over a real log the background comes through unlabelled and unchanged,
// malformed lines included, in order within the reorder horizon.
func TestInjectOverRealLog(t *testing.T) {
	data := sharedData(t)
	path := filepath.Join(data, "access-logs", "elastic-apache_logs.log")
	open := func() replay.Source {
		f, err := replay.OpenFile(context.Background(), path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	plain, plainBad := drain(t, replay.Reorder(open(), 2*time.Minute))
	in, err := replay.Inject(open(), replay.InjectOptions{Seed: 1}, replay.Scraper{Offset: time.Hour, Duration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	reqs, bad := drain(t, in)
	if bad != plainBad {
		t.Errorf("%d malformed lines through Inject, %d without", bad, plainBad)
	}
	var bg []replay.Request
	for i, r := range reqs {
		if i > 0 && r.Time.Before(reqs[i-1].Time) {
			t.Fatalf("request %d at %v after one at %v", i, r.Time, reqs[i-1].Time)
		}
		if r.Label.Injected() {
			if r.Label.Scenario != replay.ScenarioScraper || r.UserAgent != "python-requests/2.31.0" {
				t.Fatalf("injected %+v", r)
			}
			continue
		}
		if r.JA4 != "" || r.Label.Scope != nil {
			t.Fatalf("background request %+v carries injection fields", r)
		}
		bg = append(bg, r)
	}
	if !reflect.DeepEqual(bg, plain) {
		t.Errorf("%d background requests through Inject, %d without, or changed", len(bg), len(plain))
	}
	if n := len(reqs) - len(bg); n < 400 || n > 800 {
		t.Errorf("%d scraper requests in a minute at 10/s", n)
	}
}

// The default botnet: 50 000 distinct addresses over at least 20 ASNs (by
// the real lookup), one JA4 whatever the user agent, each address about once
// a minute and never twice within 45 s, POSTing to /login.
func TestInjectBotnetShape(t *testing.T) {
	const minutes = 3
	_, reqs := inject(t, nil, replay.InjectOptions{Seed: 1}, replay.Botnet{Duration: minutes * time.Minute})
	perIP := map[string][]time.Time{}
	uas := map[string]bool{}
	for _, r := range reqs {
		if r.Label.Scenario != replay.ScenarioBotnet || !r.Label.Attack || r.Label.Scope["ja4"] != replay.JA4IcedID || len(r.Label.Scope) != 1 {
			t.Fatalf("label %+v", r.Label)
		}
		if r.Method != "POST" || r.Path != "/login" || r.JA4 != replay.JA4IcedID {
			t.Fatalf("request %+v", r)
		}
		perIP[r.Client] = append(perIP[r.Client], r.Time)
		uas[r.UserAgent] = true
	}
	if len(perIP) != 50_000 {
		t.Fatalf("%d distinct addresses, want 50 000", len(perIP))
	}
	perMin := float64(len(reqs)) / 50_000 / minutes
	if perMin < 0.9 || perMin > 1.1 {
		t.Errorf("%.3f requests per address per minute, want about 1", perMin)
	}
	for ip, ts := range perIP {
		for i := 1; i < len(ts); i++ {
			if ts[i].Sub(ts[i-1]) < 45*time.Second {
				t.Fatalf("%s: requests %v apart", ip, ts[i].Sub(ts[i-1]))
			}
		}
	}
	if len(uas) < 10_000 {
		t.Errorf("%d distinct user agents, want varied", len(uas))
	}

	en := enricher(t)
	asns := map[string]int{}
	ja4s := map[string]bool{}
	for i := range reqs {
		d := descriptors(en, &reqs[i])
		asns[d[rules.KeyASN]]++
		ja4s[d[rules.KeyJA4]] = true
	}
	if asns[""] != 0 || len(asns) < 20 {
		t.Errorf("ASNs %v: want at least 20, none unknown", asns)
	}
	if len(ja4s) != 1 || !ja4s[replay.JA4IcedID] {
		t.Errorf("enriched JA4s %v, want only %s", ja4s, replay.JA4IcedID)
	}
}

type shape struct {
	reqs                        []replay.Request
	ips, uas, ja4s, asns, paths map[string]int
	statuses                    map[int]int
}

// shapeOf injects one scenario alone and tallies it through the real
// enrichment.
func shapeOf(t *testing.T, sc replay.Injection) shape {
	t.Helper()
	en := enricher(t)
	_, reqs := inject(t, nil, replay.InjectOptions{Seed: 5}, sc)
	s := shape{reqs: reqs, ips: map[string]int{}, uas: map[string]int{}, ja4s: map[string]int{}, asns: map[string]int{}, paths: map[string]int{}, statuses: map[int]int{}}
	for i := range reqs {
		d := descriptors(en, &reqs[i])
		s.ips[d[rules.KeyClientIP]]++
		s.uas[reqs[i].UserAgent]++
		s.ja4s[d[rules.KeyJA4]]++
		s.asns[d[rules.KeyASN]]++
		s.paths[reqs[i].Path]++
		s.statuses[reqs[i].Status]++
	}
	return s
}

func only(m map[string]int) string {
	for k := range m {
		if len(m) == 1 {
			return k
		}
	}
	return ""
}

// Every request of s carries want as its label.
func labelled(t *testing.T, s shape, want replay.Label) {
	t.Helper()
	for _, r := range s.reqs {
		if !reflect.DeepEqual(r.Label, want) {
			t.Fatalf("label %+v, want %+v", r.Label, want)
		}
	}
}

func rate(s shape, d time.Duration) float64 { return float64(len(s.reqs)) / d.Seconds() }

func TestInjectCredentialStuffingShape(t *testing.T) {
	s := shapeOf(t, replay.CredentialStuffing{Duration: 2 * time.Minute})
	if len(s.ips) != 300 || only(s.asns) != "7381" || only(s.paths) != "/login" {
		t.Errorf("%d addresses, ASNs %v, paths %v: want 300 in AS7381 on /login", len(s.ips), s.asns, s.paths)
	}
	labelled(t, s, replay.Label{Scenario: replay.ScenarioCredentialStuffing, Attack: true, Scope: map[string]string{"asn": "7381"}})
	if f := float64(s.statuses[401]+s.statuses[403]) / float64(len(s.reqs)); f < 0.9 {
		t.Errorf("statuses %v: want mostly 401 and 403", s.statuses)
	}
	if r := rate(s, 2*time.Minute); r < 45 || r > 55 {
		t.Errorf("%.1f requests/s, want about 50", r)
	}
	if s.ja4s[""] != 0 {
		t.Errorf("JA4s %v: the enricher should find one for each user agent", s.ja4s)
	}
}

func TestInjectURIScanShape(t *testing.T) {
	s := shapeOf(t, replay.URIScan{Duration: 2 * time.Minute})
	ip := only(s.ips)
	if ip == "" || only(s.asns) != "174" || only(s.ja4s) != replay.JA4Go {
		t.Fatalf("addresses %v, ASNs %v, JA4s %v: want one address in AS174 with Go's JA4", s.ips, s.asns, s.ja4s)
	}
	labelled(t, s, replay.Label{Scenario: replay.ScenarioURIScan, Attack: true, Scope: map[string]string{"client_ip": ip}})
	if f := float64(s.statuses[404]) / float64(len(s.reqs)); f < 0.85 {
		t.Errorf("statuses %v: want mostly 404", s.statuses)
	}
	if f := float64(len(s.paths)) / float64(len(s.reqs)); f < 0.6 {
		t.Errorf("%d distinct paths in %d requests: want mostly random ones", len(s.paths), len(s.reqs))
	}
	if r := rate(s, 2*time.Minute); r < 4 || r > 6 {
		t.Errorf("%.1f requests/s, want about 5", r)
	}
}

func TestInjectUAFloodShape(t *testing.T) {
	s := shapeOf(t, replay.UAFlood{Duration: 2 * time.Minute})
	ip := only(s.ips)
	if ip == "" || only(s.asns) != "13335" || only(s.ja4s) != replay.JA4Python {
		t.Fatalf("addresses %v, ASNs %v, JA4s %v: want one address in AS13335 with one JA4", s.ips, s.asns, s.ja4s)
	}
	labelled(t, s, replay.Label{Scenario: replay.ScenarioUAFlood, Attack: true, Scope: map[string]string{"client_ip": ip}})
	if f := float64(len(s.uas)) / float64(len(s.reqs)); f < 0.9 {
		t.Errorf("%d user agents in %d requests: want a new one almost every time", len(s.uas), len(s.reqs))
	}
	if r := rate(s, 2*time.Minute); r < 18 || r > 22 {
		t.Errorf("%.1f requests/s, want about 20", r)
	}
}

func TestInjectScraperShape(t *testing.T) {
	s := shapeOf(t, replay.Scraper{Duration: 2 * time.Minute})
	ip := only(s.ips)
	if ip == "" || only(s.asns) != "15169" || only(s.uas) != "python-requests/2.31.0" {
		t.Fatalf("addresses %v, ASNs %v, UAs %v: want one python-requests address in AS15169", s.ips, s.asns, s.uas)
	}
	if ja4 := only(s.ja4s); ja4 == "" || !enrich.ValidJA4(ja4) {
		t.Errorf("JA4s %v: want the one the enricher picks for python-requests", s.ja4s)
	}
	labelled(t, s, replay.Label{Scenario: replay.ScenarioScraper, Attack: true, Scope: map[string]string{"client_ip": ip}})
	if len(s.paths) < len(s.reqs)*9/10 {
		t.Errorf("%d distinct paths in %d requests: want many", len(s.paths), len(s.reqs))
	}
	if r := rate(s, 2*time.Minute); r < 9 || r > 11 {
		t.Errorf("%.1f requests/s, want about 10", r)
	}
}

// Carrier-grade NAT: one address, thousands of users with their own user
// agents and many JA4s, each about once a minute; benign.
func TestInjectCGNATShape(t *testing.T) {
	s := shapeOf(t, replay.CGNAT{Duration: 5 * time.Minute})
	ip := only(s.ips)
	if ip == "" || only(s.asns) != "23693" {
		t.Fatalf("addresses %v, ASNs %v: want one in AS23693", s.ips, s.asns)
	}
	labelled(t, s, replay.Label{Scenario: replay.ScenarioCGNAT, Scope: map[string]string{"client_ip": ip}})
	if len(s.uas) < 2900 {
		t.Errorf("%d distinct user agents, want about 3 000", len(s.uas))
	}
	if len(s.ja4s) < 10 || s.ja4s[""] != 0 {
		t.Errorf("%d distinct JA4s (%v), want at least 10, none absent", len(s.ja4s), s.ja4s)
	}
	if r := rate(s, 5*time.Minute); r < 45 || r > 55 { // 3 000 users at 1/min
		t.Errorf("%.1f requests/s, want about 50", r)
	}
	if perUA := float64(len(s.reqs)) / float64(len(s.uas)) / 5; perUA < 0.9 || perUA > 1.1 {
		t.Errorf("%.2f requests per user per minute, want about 1", perUA)
	}
}

// The flash crowd: users from many ASNs with many JA4s arrive within the
// ramp; its rate jumps from nothing; benign, no scope.
func TestInjectFlashCrowdShape(t *testing.T) {
	s := shapeOf(t, replay.FlashCrowd{Duration: 3 * time.Minute})
	labelled(t, s, replay.Label{Scenario: replay.ScenarioFlashCrowd})
	if len(s.ips) < 4900 || len(s.asns) < 20 || s.asns[""] != 0 || len(s.ja4s) < 10 {
		t.Errorf("%d addresses, %d ASNs, %d JA4s: want 5 000 users from 20+ ASNs with 10+ JA4s", len(s.ips), len(s.asns), len(s.ja4s))
	}
	start := s.reqs[0].Time
	var first10s, lastMin int
	for _, r := range s.reqs {
		switch d := r.Time.Sub(start); {
		case d < 10*time.Second:
			first10s++
		case d >= 2*time.Minute:
			lastMin++
		}
	}
	// 5 000 users at one request per 20 s once all have come: 250/s.
	if r := float64(lastMin) / 60; r < 225 || r > 275 {
		t.Errorf("%.0f requests/s in the last minute, want about 250", r)
	}
	if first10s == 0 || first10s > lastMin/3 {
		t.Errorf("%d requests in the first 10 s, %d in the last minute: want a rise", first10s, lastMin)
	}
	if f := float64(s.paths["/"]) / float64(len(s.reqs)); f < 0.5 {
		t.Errorf("%.2f of requests on the landing page, want over half", f)
	}
}

func TestInjectRejectsBadScenarios(t *testing.T) {
	for _, tc := range []struct {
		scs  []replay.Injection
		want string
	}{
		{[]replay.Injection{replay.Botnet{Duration: -time.Second}}, `scenario "botnet": offset 0s and duration -1s must not be negative`},
		{[]replay.Injection{replay.Botnet{JA4: "t13d"}}, `JA4 "t13d" is not a JA4 fingerprint`},
		{[]replay.Injection{replay.CredentialStuffing{IPs: 5000}}, `5000 IPs; want 1 to 4094 (AS7381's 216.83.176.0/20)`},
		{[]replay.Injection{replay.UAFlood{Switch: 1.5}}, `switch probability 1.5; want (0, 1]`},
		{[]replay.Injection{replay.Scraper{Rate: -1}}, `rate -1 must not be negative`},
		{[]replay.Injection{replay.Scraper{}, replay.Scraper{Offset: time.Hour}}, `two injected scenarios are named "scraper"`},
	} {
		_, err := replay.Inject(nil, replay.InjectOptions{}, tc.scs...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want %q", tc.scs, err, tc.want)
		}
	}
	if _, err := replay.Inject(nil, replay.InjectOptions{}, replay.Scraper{}, replay.Scraper{Name: "scraper-2"}); err != nil {
		t.Errorf("two scrapers with their own names: %v", err)
	}
}

// A request's own JA4 wins over the user agent's; an invalid one is absent.
func TestEnricherJA4Override(t *testing.T) {
	en := enricher(t)
	ua := "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 Safari/537.36"
	fromUA, _ := en.JA4.ForUserAgent(ua)
	for _, tc := range []struct{ ja4, want string }{
		{"", fromUA},
		{replay.JA4IcedID, replay.JA4IcedID},
		{"not-a-ja4", ""},
	} {
		r := replay.Request{Entry: accesslog.Entry{Client: "73.1.2.3", UserAgent: ua}, JA4: tc.ja4}
		if got := descriptors(en, &r)[rules.KeyJA4]; got != tc.want {
			t.Errorf("JA4 %q: enriched %q, want %q", tc.ja4, got, tc.want)
		}
	}
}

// between passes on the requests of src within [from, to) and counts them
// as its lines: a short window of a long log.
type between struct {
	replay.Source
	from, to time.Time
	n        int
}

func (b *between) Stats() accesslog.Stats { return accesslog.Stats{Lines: b.n, Entries: b.n} }
func (b *between) Next() (replay.Request, error) {
	for {
		r, err := b.Source.Next()
		var pe *accesslog.ParseError
		if errors.As(err, &pe) {
			continue
		}
		if err != nil {
			return r, err
		}
		if !r.Time.Before(b.from) && r.Time.Before(b.to) {
			b.n++
			return r, nil
		}
	}
}

// A replay of seven minutes of a real log (the SecRepo scraper's busiest)
// with every scenario injected, scaled down, completes and decides every
// request.
func TestReplayWithInjection(t *testing.T) {
	data := sharedData(t)
	f, err := replay.OpenFile(context.Background(), filepath.Join(data, "access-logs", "secrepo-2018-12-15.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	from := time.Date(2018, 12, 16, 8, 35, 0, 0, time.UTC) // 00:35 -0800
	log := &between{Source: f, from: from, to: from.Add(7 * time.Minute)}
	in, err := replay.Inject(log, replay.InjectOptions{Seed: 1},
		replay.Botnet{IPs: 500, Duration: 5 * time.Minute},
		replay.CredentialStuffing{Offset: time.Minute, Duration: time.Minute, Rate: 10},
		replay.URIScan{Offset: 2 * time.Minute, Duration: time.Minute},
		replay.UAFlood{Offset: 3 * time.Minute, Duration: time.Minute, Rate: 5},
		replay.Scraper{Offset: 4 * time.Minute, Duration: time.Minute, Rate: 5},
		replay.CGNAT{Users: 200, Duration: 5 * time.Minute},
		replay.FlashCrowd{Offset: 5 * time.Minute, Users: 300, Ramp: 20 * time.Second, Duration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := hangGuard(t)
	defer cancel()
	rep, err := replay.Run(ctx, replay.Options{DataDir: data}, in)
	if err != nil {
		t.Fatal(err)
	}
	st := rep.Sources[0].Stats
	if log.n < 2000 || st.Lines < log.n+5000 {
		t.Fatalf("stats %+v, %d from the log: want thousands of each", st, log.n)
	}
	accountedFor(t, rep, st.Lines)
	if rep.Sources[0].Rejected != 0 {
		t.Errorf("%d requests rejected", rep.Sources[0].Rejected)
	}
	t.Logf("%d requests, %d from the log; outcomes %v; %d dynamic rules", st.Entries, log.n, rep.Outcomes, len(rep.DynamicRules))
}
