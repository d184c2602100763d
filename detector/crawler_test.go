package detector

import (
	"errors"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/detector/enrich"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
)

// Googlebot from Google's AS15169 is left alone; "Googlebot" from a hosting
// ASN is flagged, scoped to its address; a record without an ASN is not
// judged.
func TestFakeCrawlers(t *testing.T) {
	l := stage.NewLocal([]stage.Stage{must(NewFakeCrawlers(FakeCrawlerOptions{}))}, 2, time.Second)
	gb := "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"
	add := func(i int, ip string, asn uint32, ua string) {
		l.Observe(i, &decisionpb.Decision{Version: 1, EventTimeMs: t0.Add(time.Duration(i) * time.Second).UnixMilli(), Outcome: decisionpb.Outcome_OUTCOME_ALLOWED,
			UserAgent: ua, Descriptors: &decisionpb.Descriptors{ClientIp: ip, Asn: asn}})
	}
	for i := range 10 {
		add(i, "66.249.73.135", 15169, gb)         // the real one
		add(i, "203.0.113.5", 14061, gb)           // a hosting provider's
		add(i, "198.51.100.3", 0, gb)              // ASN unknown
		add(i, "192.0.2.44", 14061, "curl/8.4.0")  // no claim
		add(i, "192.0.2.45", 16509, "BingBot/2.0") // Amazon claiming bingbot
	}
	got := l.Advance(t0.Add(time.Hour)).Rules
	want := map[string]bool{"203.0.113.5": true, "192.0.2.45": true}
	for _, r := range got {
		if !want[r.Match[0].Value] || r.Origin != "detector/fake-crawler" || r.Mode != rules.Shadow {
			t.Errorf("unexpected rule %s: %s", r.ID, r.Reason)
		}
		delete(want, r.Match[0].Value)
	}
	if len(want) != 0 {
		t.Errorf("not flagged: %v", want)
	}
}

// crawlerRanges loads the shared operators' ranges, or skips.
func crawlerRanges(t *testing.T) *enrich.CrawlerRanges {
	t.Helper()
	data, err := enrich.FindData(".")
	if err != nil {
		t.Skipf("../shared/data absent: %v", err)
	}
	r, err := enrich.LoadCrawlerRanges(filepath.Join(data, "crawler-ips"))
	if err != nil {
		t.Skipf("../shared/data/crawler-ips: %v", err)
	}
	return r
}

// With Google's ranges loaded, Googlebot from inside them is verified and
// draws no rule at 20 requests a second, whatever ASN the record carries;
// the same user agent from 198.51.100.7 draws a shadow rule at 1 request in
// 10 s, without an ASN, with the operator, the address and the ranges file
// as evidence. A phone whose model is "CUBOT" claims nothing.
func TestFakeCrawlersRanges(t *testing.T) {
	ranges := crawlerRanges(t)
	const real = "66.249.64.10" // in googlebot-ipv4.txt's 66.249.64.0/25
	if !ranges.Contains("googlebot", netip.MustParseAddr(real)) {
		t.Fatalf("%s is not in the shared googlebot ranges", real)
	}
	l := stage.NewLocal([]stage.Stage{must(NewFakeCrawlers(FakeCrawlerOptions{Ranges: ranges}))}, 2, time.Second)
	gb := "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"
	cubot := "Mozilla/5.0 (Linux; Android 6.0; CUBOT MAX) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/72.0.3626.121 Mobile Safari/537.36"
	add := func(ms int, ip string, asn uint32, ua string) {
		l.Observe(ms, &decisionpb.Decision{Version: 1, EventTimeMs: t0.Add(time.Duration(ms) * time.Millisecond).UnixMilli(), Outcome: decisionpb.Outcome_OUTCOME_ALLOWED,
			UserAgent: ua, Descriptors: &decisionpb.Descriptors{ClientIp: ip, Asn: asn}})
	}
	for ms := 0; ms < 60_000; ms += 50 { // 20 a second for a minute
		add(ms, real, 0, gb)
		add(ms, "2001:4860:4801:10::7", 14061, gb) // inside googlebot-ipv6.txt; the ASN is not consulted
		add(ms, "192.0.2.80", 0, cubot)
		if ms%10_000 == 0 { // 1 in 10 s
			add(ms, "198.51.100.7", 0, gb)
		}
	}
	got := l.Advance(t0.Add(time.Hour)).Rules
	if len(got) != 1 {
		for _, r := range got {
			t.Errorf("rule %s: %s", r.ID, r.Reason)
		}
		t.Fatalf("%d rules, want 1 for 198.51.100.7", len(got))
	}
	r := got[0]
	if r.Match[0].Value != "198.51.100.7" || r.Mode != rules.Shadow || r.Origin != "detector/fake-crawler" {
		t.Errorf("rule %+v", r)
	}
	for k, v := range map[string]string{"crawler": "Googlebot", "operator": "googlebot", "client_ip": "198.51.100.7",
		"ranges_file": "googlebot-ipv4.txt", "in_ranges": "false", "count": "6"} {
		if r.Evidence[k] != v {
			t.Errorf("evidence %s = %q, want %q (%v)", k, r.Evidence[k], v, r.Evidence)
		}
	}
	if _, ok := r.Evidence["asn"]; ok {
		t.Errorf("evidence names an unknown ASN: %v", r.Evidence)
	}
	if !strings.Contains(r.Reason, "outside googlebot's published ranges (googlebot-ipv4.txt)") {
		t.Errorf("reason %q", r.Reason)
	}
}

// One claim in a window is below the floor; OpenAI's crawlers, which have no
// ASN, are judged only with ranges loaded.
func TestFakeCrawlersRangeFloor(t *testing.T) {
	ranges := crawlerRanges(t)
	for _, tc := range []struct {
		ranges *enrich.CrawlerRanges
		n      int
		want   int
	}{{ranges, 1, 0}, {ranges, 2, 1}, {nil, 10, 0}} {
		l := stage.NewLocal([]stage.Stage{must(NewFakeCrawlers(FakeCrawlerOptions{Ranges: tc.ranges}))}, 1, time.Second)
		for i := range tc.n {
			l.Observe(0, &decisionpb.Decision{Version: 1, EventTimeMs: t0.Add(time.Duration(i) * time.Second).UnixMilli(), Outcome: decisionpb.Outcome_OUTCOME_ALLOWED,
				UserAgent:   "Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; GPTBot/1.2; +https://openai.com/gptbot)",
				Descriptors: &decisionpb.Descriptors{ClientIp: "203.0.113.9", Asn: 16509}})
		}
		if got := len(l.Advance(t0.Add(time.Hour)).Rules); got != tc.want {
			t.Errorf("ranges %v, %d claims: %d rules, want %d", tc.ranges != nil, tc.n, got, tc.want)
		}
	}
}

// With ranges loaded, Signals exempts verified crawlers from the volume and
// shape signals: Googlebot from inside Google's ranges at 20 requests a
// second over 2 000 distinct paths, most 404, draws no rule at all, while
// the same traffic with the same user agent from 198.51.100.7 draws a
// heavy-hitter (or entropy) rule besides the fake-crawler one. Without
// ranges nothing is verified, and the real one is a heavy hitter too.
func TestVerifiedCrawlersExempt(t *testing.T) {
	ranges := crawlerRanges(t)
	const real, fake = "66.249.64.10", "198.51.100.7"
	gb := "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"
	for _, tc := range []struct {
		ranges *enrich.CrawlerRanges
		want   map[string]bool // clients with any rule
	}{{ranges, map[string]bool{fake: true}}, {nil, map[string]bool{real: true, fake: true}}} {
		stages, err := Signals(Options{FakeCrawlers: FakeCrawlerOptions{Ranges: tc.ranges}})
		if err != nil {
			t.Fatal(err)
		}
		l := stage.NewLocal(stages, 2, time.Second)
		for ms := 0; ms < 120_000; ms += 50 {
			for i, ip := range []string{real, fake, "192.0.2.1", "192.0.2.2", "192.0.2.3"} {
				path, status := "/", uint32(200)
				if i < 2 {
					path, status = "/p/"+strconv.Itoa(ms/50), 404
				} else if ms%2000 != 0 {
					continue // ordinary clients: one request in 2 s
				}
				l.Observe(i%2, &decisionpb.Decision{Version: 1, EventTimeMs: t0.Add(time.Duration(ms) * time.Millisecond).UnixMilli(), Outcome: decisionpb.Outcome_OUTCOME_ALLOWED,
					UserAgent: gb, Status: status, Descriptors: &decisionpb.Descriptors{ClientIp: ip, Path: path}})
			}
		}
		got := map[string]bool{}
		for _, r := range l.Advance(t0.Add(time.Hour)).Rules {
			for _, m := range r.Match {
				if m.Key == rules.KeyClientIP {
					got[m.Value] = true
				}
			}
			if r.Match[0].Value == real && tc.ranges != nil {
				t.Errorf("verified crawler drew %s: %s", r.Origin, r.Reason)
			}
		}
		for ip := range tc.want {
			if !got[ip] {
				t.Errorf("ranges %v: no rule on %s (rules on %v)", tc.ranges != nil, ip, got)
			}
		}
	}
}

// Ranges of an operator no crawler names (a misspelt file name) are an
// error, not a silent no-op.
func TestFakeCrawlersRefuseRangesNoCrawlerNames(t *testing.T) {
	r, err := enrich.ParseCrawlerRanges("googelbot", "googelbot-ipv4.txt", strings.NewReader("66.249.64.0/27\n"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = NewFakeCrawlers(FakeCrawlerOptions{Ranges: r})
	if !errors.Is(err, ErrBadOptions) || !strings.Contains(err.Error(), `operator "googelbot", which no crawler names`) || !strings.Contains(err.Error(), "googlebot") {
		t.Errorf("ranges of googelbot: %v, want an error naming it and the known operators", err)
	}
}

// With ASN holdings (the shared iptoasn extract, which lists AS15169's
// ranges whole), one request claiming Googlebot from an address outside
// Google's space draws a rule even when its own network is unknown, as the
// Elastic log's fake Googlebots from Brazilian ISPs (one GET / each); an
// address in Google's space with no ASN on its record, or Googlebot from
// AS15169, draws nothing; bingbot, whose AS8075 the extract does not list,
// is judged by ASN as before.
func TestFakeCrawlersHoldings(t *testing.T) {
	data, err := enrich.FindData(".")
	if err != nil {
		t.Skipf("../shared/data absent: %v", err)
	}
	db, err := enrich.OpenASN(filepath.Join(data, "asn", "ip2asn-v4-extract.tsv"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if known, holds := db.Holds(8075, netip.MustParseAddr("40.77.167.1")); known || holds {
		t.Skip("the extract lists AS8075: pick another system for the last case")
	}
	l := stage.NewLocal([]stage.Stage{must(NewFakeCrawlers(FakeCrawlerOptions{Holdings: db}))}, 2, time.Second)
	gb := "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"
	add := func(i int, ip string, asn uint32, ua string) {
		l.Observe(i, &decisionpb.Decision{Version: 1, EventTimeMs: t0.Add(time.Duration(i) * time.Second).UnixMilli(), Outcome: decisionpb.Outcome_OUTCOME_ALLOWED,
			UserAgent: ua, Descriptors: &decisionpb.Descriptors{ClientIp: ip, Asn: asn}})
	}
	add(0, "200.141.109.74", 0, gb) // the Elastic log's: unknown network, outside Google's
	add(1, "66.249.73.135", 0, gb)  // Google's space, no ASN on the record
	add(2, "66.249.73.136", 15169, gb)
	add(3, "198.51.100.9", 0, "Mozilla/5.0 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)")
	add(4, "192.168.1.1", 0, gb) // a private address (a proxy's): no system's, not judged
	add(5, "100.64.3.9", 0, gb)  // a carrier-grade NAT's shared space, likewise
	got := l.Advance(t0.Add(time.Hour)).Rules
	if len(got) != 1 || got[0].Match[0].Value != "200.141.109.74" || got[0].Evidence["in_asn_space"] != "false" || got[0].Evidence["operator_asns"] != "AS15169" {
		t.Fatalf("rules %+v: want one on 200.141.109.74 outside AS15169's space", got)
	}
	t.Log(got[0].Reason)
	// Without holdings the same claim is not judged: its ASN is unknown.
	l = stage.NewLocal([]stage.Stage{must(NewFakeCrawlers(FakeCrawlerOptions{}))}, 2, time.Second)
	add(0, "200.141.109.74", 0, gb)
	if got := l.Advance(t0.Add(time.Hour)).Rules; len(got) != 0 {
		t.Errorf("without holdings: %+v", got)
	}
}
