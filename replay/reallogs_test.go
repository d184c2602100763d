package replay_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/detector/enrich"
	"github.com/sluice-rl/sluice/replay"
	"github.com/sluice-rl/sluice/rules"
)

// abusive is a scope a detector rule on a real log names, and why a person
// reading the log would call that client abusive.
type abusive struct {
	scope string // the rule's matches, see scopeOf
	why   string
}

// proberNetworks names, for a log, the rotating or distributed prober whose
// networks or addresses the content signal may name (rules on client_ip in
// a /24 or /48, or in a list of single addresses): such a rule is accepted
// only if the log shows, for the addresses in it, at least 3 requests of
// which at least 90% were answered 3xx or 4xx (every request asked for
// something the site does not have, or was sent on elsewhere: none got
// content). It is checked on the log itself, not on the detector's lists.
type proberNetworks struct {
	why string
}

// realLogs are the real logs in ../shared/data/access-logs, each with every
// scope the detector may and must name on it, unmodified.
//
// What the detector does not flag, though a person would call it abusive
// (misses, not false positives; see docs/eval.md): the five fake Googlebots
// of secrepo-2018-12-15, once or twice each, which the eval judges only with
// the operators' ranges loaded (TestEvalRealLogsCrawlerRanges).
//
// The backup and VCS prober and the WordPress login probers of
// secrepo-2018-12-15 and the rotating backup prober of secrepo-2022-12-22,
// missed before, are named by the content signal since (below).
var realLogs = []struct {
	file    string
	lines   int
	abusive []abusive
	probers *proberNetworks
	// slow: the log has a request in 4,216 of the day's 10 s windows, and
	// the replay waits for the pipeline at each: about 30 s, minutes under
	// the race detector.
	slow bool
}{
	{file: "secrepo-2018-12-15.log", lines: 4961, abusive: []abusive{{
		scope: "client_ip=198.72.227.213",
		why: "python-requests/2.18.4 on 4,151 of its 4,156 requests (84% of the day's 4,961), all between 00:24:12 " +
			"and 00:43:09 on 16 Dec (-0800): up to 126 requests in 10 s and 680 in a minute, where no other client " +
			"sends more than 27 in 10 s. It fetches /self.logs/access.log.<date>.gz date after date, 2,731 answered " +
			"404: a script pulling the site's log archive by guessing file names.",
	}, {
		scope: "client_ip=202.115.12.166",
		why: "probed for backups and VCS files (/backup.zip, /.git/config, /.svn/entries, /.bash_history, " +
			"/phpMyAdmin/...: 49 of its 58 requests answered 404) in two bursts of 27 and 23 requests in 10 s.",
	}}, probers: &proberNetworks{
		why: "the WordPress login probers: 27 addresses that each GET /wp-login.php once or twice over the day, " +
			"26 with one user agent (\"... Firefox/40.1\", a 2015 browser on a 2018 log), each also fetching / " +
			"within a second; every one of their requests answered 418",
	}},
	// Search-engine crawlers (bingbot, Googlebot) and readers; no client
	// sends more than 6 requests in 10 s.
	{file: "secrepo-2022-12-22.log", lines: 1262, probers: &proberNetworks{
		why: "a prober rotating through addresses in many /24s (98.159.226.x, 45.89.242.x, 45.86.200.x, " +
			"157.97.120.x, 185.192.16.x, ...), one or two requests an address, for site backups and secrets " +
			"(/backup/secrepo.com.sql, /bak/www.zip, /old/wallet.dat, /back/.env), no user agent, each HEAD " +
			"redirected to https (301) and asked again (404)",
	}},
	// Every request is stamped in minute 05 of its hour, so an hour's
	// traffic falls in one minute; even so no client sends more than 25 in
	// 10 s (75.97.9.59, a Chrome user paging through two Logstash
	// presentations and their images). The busiest addresses are Googlebot (66.249.73.135, AS15169,
	// Google's own) and feed readers.
	{file: "elastic-apache_logs.log", lines: 10000, abusive: []abusive{
		{scope: "client_ip=188.165.243.45", why: cmsProber},
		{scope: "client_ip=195.250.34.144", why: cmsProber},
		{scope: "client_ip=198.245.61.43", why: cmsProber},
		{scope: "client_ip=95.78.54.93", why: cmsProber},
	}},
	// 1 Aug 1995: host names for most clients, so no ASN; the busiest host
	// sends 15 requests in 10 s.
	{file: "nasa-19950801.tsv", lines: 30970, slow: true},
}

// cmsProber is why the Elastic log's four admin-panel probers are abusive.
const cmsProber = "a CMS admin-panel prober: its only 3 requests are GET /wp-login.php, /administrator/ and " +
	"/admin.php, all answered 404, the same 3 from each of 4 addresses over four days"

// The detector on the unmodified real logs, with the default options: every
// rule names a client a person reading the log would call abusive, and the
// test lists each such client with why.
func TestEvalRealLogs(t *testing.T) {
	data := sharedData(t)
	for _, l := range realLogs {
		t.Run(l.file, func(t *testing.T) {
			if l.slow && raceDetector {
				t.Skip("a day with a request in nearly every 10 s window: run without -race")
			}
			t.Parallel()
			rep := realLogReport(t, data, l.file)
			accountedFor(t, rep, l.lines)
			got := map[string][]rules.Rule{}
			for _, r := range rep.DynamicRules {
				s := scopeOf(&r)
				got[s] = append(got[s], r)
				t.Logf("%s %s: %s", r.Origin, s, r.Reason)
				if r.Mode != rules.Shadow || r.Reason == "" || len(r.Evidence) == 0 {
					t.Errorf("rule %s on %s: mode %v, reason %q, evidence %v: want shadow with a reason and evidence", r.ID, s, r.Mode, r.Reason, r.Evidence)
				}
			}
			for _, a := range l.abusive {
				if got[a.scope] == nil {
					t.Errorf("no rule on %s, which is abusive: %s", a.scope, a.why)
				}
			}
			networks := 0
			for _, s := range slices.Sorted(maps.Keys(got)) {
				if l.probers != nil && strings.HasPrefix(s, "client_ip in ") {
					networks++
					if n, bad := networkAnswers(t, data, l.file, got[s][0].Match[0].CIDR); n < 3 || float64(bad) < 0.9*float64(n) {
						t.Errorf("rule on %s: the log has %d requests from it, %d answered 3xx or 4xx: not the prober (%s)", s, n, bad, l.probers.why)
					}
					continue
				}
				if !slices.ContainsFunc(l.abusive, func(a abusive) bool { return a.scope == s }) {
					for _, r := range got[s] {
						t.Errorf("rule on %s, which this test does not list as abusive: %s: %s; evidence %v", s, r.Origin, r.Reason, r.Evidence)
					}
				}
			}
			if l.probers != nil && networks == 0 {
				t.Errorf("no rule on the prober's networks: %s", l.probers.why)
			}
		})
	}
}

// networkAnswers counts the requests of the log from addresses in any of
// nets, and those answered 3xx or 4xx.
func networkAnswers(t *testing.T, data, file string, nets []netip.Prefix) (n, bad int) {
	t.Helper()
	f, err := replay.OpenFile(context.Background(), filepath.Join(data, "access-logs", file))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for {
		req, err := f.Next()
		if errors.Is(err, io.EOF) {
			return n, bad
		}
		if err != nil {
			continue // a malformed line: counted by the replay, not a request
		}
		a, err := netip.ParseAddr(req.Client)
		if err != nil || !slices.ContainsFunc(nets, func(p netip.Prefix) bool { return p.Contains(a) }) {
			continue
		}
		n++
		if req.Status >= 300 && req.Status < 500 {
			bad++
		}
	}
}

// scopeOf names a rule's scope by its matches, "key=value" (or "key in
// network,..." for a CIDR match) sorted and joined by spaces:
// "client_ip=198.72.227.213", "asn=7381 route=/login",
// "client_ip in 98.159.226.0/24".
func scopeOf(r *rules.Rule) string {
	var ms []string
	for _, m := range r.Match {
		if len(m.CIDR) > 0 {
			var ns []string
			for _, p := range m.CIDR {
				ns = append(ns, p.String())
			}
			ms = append(ms, m.KeyName()+" in "+strings.Join(ns, ","))
			continue
		}
		ms = append(ms, m.KeyName()+"="+m.Value)
	}
	slices.Sort(ms)
	return strings.Join(ms, " ")
}

// realLogReports holds one replay per real log with the default options
// (and the shared data for enrichment), for the tests that read them:
// replaying the Elastic log takes over a minute under the race detector.
var realLogReports struct {
	mu sync.Mutex
	m  map[string]*cachedReport
}

type cachedReport struct {
	once sync.Once
	rep  *replay.Report
	err  error
}

// realLogReport replays ../shared/data/access-logs/file once per test binary
// with replay.Options{DataDir: data} and returns the report, which callers
// must treat as read-only.
func realLogReport(t *testing.T, data, file string) *replay.Report {
	t.Helper()
	realLogReports.mu.Lock()
	if realLogReports.m == nil {
		realLogReports.m = map[string]*cachedReport{}
	}
	c := realLogReports.m[file]
	if c == nil {
		c = &cachedReport{}
		realLogReports.m[file] = c
	}
	realLogReports.mu.Unlock()
	c.once.Do(func() {
		path := filepath.Join(data, "access-logs", file)
		f, err := replay.OpenFile(context.Background(), path)
		if err != nil {
			c.err = err
			return
		}
		defer f.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
		defer cancel()
		c.rep, c.err = replay.Run(ctx, replay.Options{DataDir: data}, f)
		if c.err != nil {
			c.err = fmt.Errorf("replaying %s: %w", path, c.err)
		}
	})
	if c.err != nil {
		t.Fatal(c.err)
	}
	return c.rep
}

// With the operators' published ranges loaded (read from
// ../shared/data/crawler-ips), the one client of SecRepo's 2018 log that
// claims Googlebot from outside Google's ranges (37.187.26.42, an OVH
// server, twice in a second) draws a fake-crawler rule, and the Googlebots
// from 66.249.66.0/24 (Google's) draw none.
func TestEvalRealLogsCrawlerRanges(t *testing.T) {
	data := sharedData(t)
	ranges, err := enrich.LoadCrawlerRanges(filepath.Join(data, "crawler-ips"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(data, "access-logs", "secrepo-2018-12-15.log")
	f, err := replay.OpenFile(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	o := replay.Options{DataDir: data}
	o.Detector.FakeCrawlers.Ranges = ranges
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	rep, err := replay.Run(ctx, o, f)
	if err != nil {
		t.Fatal(err)
	}
	var fake int
	for _, r := range rep.DynamicRules {
		s := scopeOf(&r)
		if r.Origin != "detector/fake-crawler" {
			continue
		}
		if s != "client_ip=37.187.26.42" || r.Mode != rules.Shadow || r.Evidence["in_ranges"] != "false" {
			t.Errorf("fake-crawler rule on %s (mode %v, evidence %v): want only 37.187.26.42, in shadow, outside the ranges", s, r.Mode, r.Evidence)
			continue
		}
		fake++
	}
	if fake == 0 {
		t.Error("no fake-crawler rule on 37.187.26.42, which claims Googlebot from outside Google's ranges")
	}
}
