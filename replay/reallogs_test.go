package replay_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-rl/sluice/detector/enrich"
	"github.com/sluice-rl/sluice/replay"
	"github.com/sluice-rl/sluice/rules"
)

// realLogs are the real logs in ../shared/data/access-logs. Their abusive
// clients, each with why, are in testdata/eval/<log>.abusive (re-judged
// for issue 36 by reading every client's requests); NASA's day has none.
var realLogs = []struct {
	file  string
	lines int
	// recall is the least share of the log's attackers (names of its
	// .abusive file) a rule must detect: 0.9, the target, where the
	// detector meets it; below it, the log's misses are in docs/eval.md
	// and this pins what it does, so that a change can only raise it.
	recall float64
	// ranges loads the crawler operators' published ranges
	// (../shared/data/crawler-ips, as `sluice replay --crawler-ranges`
	// does), as production would load the lists current at the time of
	// its traffic. They are today's: right for the SecRepo logs (2018,
	// 2022: no crawler of theirs is outside them but the fake Googlebot),
	// not for the Elastic log of 2015, whose real bingbots (157.55.32.x,
	// 65.52.104.x, Microsoft's then) today's list does not hold.
	ranges bool
	// slow: the log has a request in 4,216 of the day's 10 s windows, and
	// the replay waits for the pipeline at each: about 30 s, minutes under
	// the race detector.
	slow bool
}{
	{file: "secrepo-2018-12-15.log", lines: 4961, recall: 0.9, ranges: true},
	{file: "secrepo-2022-12-22.log", lines: 1262, recall: 0.9, ranges: true},
	{file: "elastic-apache_logs.log", lines: 10000, recall: 0.9},
	{file: "nasa-19950801.tsv", lines: 30970, recall: 1, slow: true},
}

// abusiveFile is the .abusive file of a real log, "" when it has none.
func abusiveFile(log string) string {
	p := filepath.Join("..", "testdata", "eval", strings.TrimSuffix(strings.TrimSuffix(log, ".log"), ".tsv")+".abusive")
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// The detector on the unmodified real logs, with the default options,
// scored with replay.ScoreRules against the clients the log's .abusive
// file names (every other request benign): precision at least 0.99 (a
// rule matching a benign client's requests is a false positive, with the
// requests it would deny) and recall at least the log's figure, every
// rule in shadow mode with a reason and evidence.
func TestEvalRealLogs(t *testing.T) {
	t.Parallel() // beside TestEvalInjectedScenarios
	data := sharedData(t)
	for _, l := range realLogs {
		t.Run(l.file, func(t *testing.T) {
			if l.slow && raceDetector {
				t.Skip("a day with a request in nearly every 10 s window: run without -race")
			}
			t.Parallel()
			rep := realLogReport(t, data, l.file, l.ranges)
			accountedFor(t, rep, l.lines)
			for _, r := range rep.DynamicRules {
				if r.Mode != rules.Shadow || r.Reason == "" || len(r.Evidence) == 0 {
					t.Errorf("rule %s on %s: mode %v, reason %q, evidence %v: want shadow with a reason and evidence", r.ID, scopeOf(&r), r.Mode, r.Reason, r.Evidence)
				}
			}
			s := scoreRealLog(t, data, l.file, rep)
			for _, r := range s.Rules {
				if !r.TruePositive {
					t.Errorf("false positive: %s %s on %v: %s; %d attack and %d benign requests, would deny %d benign", r.ID, r.Origin, r.Match, r.Reason, r.Attack, r.Benign, r.Collateral)
				}
			}
			for _, sc := range s.Scenarios {
				t.Logf("%s: %d requests, detected %v by %d rules", sc.Scenario, sc.Requests, sc.Detected, sc.TruePositives)
			}
			t.Logf("precision %.3f (%d rules, %d false), recall %.3f, collateral %d", s.Precision, s.TruePositives+s.FalsePositives, s.FalsePositives, s.Recall, s.Collateral)
			if s.Precision < 0.99 || s.Recall < l.recall {
				t.Errorf("precision %.3f, recall %.3f: want at least 0.99 and %.2f", s.Precision, s.Recall, l.recall)
			}
		})
	}
}

// scoreRealLog scores a replay of a real log against its .abusive file.
func scoreRealLog(t *testing.T, data, file string, rep *replay.Report) replay.Score {
	t.Helper()
	var attacks []replay.BackgroundAttack
	if f := abusiveFile(file); f != "" {
		var err error
		if attacks, err = replay.ReadBackgroundAttacks(f); err != nil {
			t.Fatal(err)
		}
	}
	src, err := replay.OpenFile(context.Background(), filepath.Join(data, "access-logs", file))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	s, err := replay.ScoreRules(rep, nil, src, replay.ScoreOptions{DataDir: data, BackgroundAttacks: attacks})
	if err != nil {
		t.Fatal(err)
	}
	return s
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
// with replay.Options{DataDir: data}, and the crawler ranges of
// ../shared/data/crawler-ips if ranges, and returns the report, which
// callers must treat as read-only.
func realLogReport(t *testing.T, data, file string, ranges bool) *replay.Report {
	t.Helper()
	realLogReports.mu.Lock()
	if realLogReports.m == nil {
		realLogReports.m = map[string]*cachedReport{}
	}
	key := fmt.Sprint(file, ranges)
	c := realLogReports.m[key]
	if c == nil {
		c = &cachedReport{}
		realLogReports.m[key] = c
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
		ctx, cancel := hangGuard(t)
		defer cancel()
		o := replay.Options{DataDir: data}
		if ranges {
			if o.Detector.FakeCrawlers.Ranges, c.err = enrich.LoadCrawlerRanges(filepath.Join(data, "crawler-ips")); c.err != nil {
				return
			}
		}
		c.rep, c.err = replay.Run(ctx, o, f)
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
	rep := realLogReport(t, data, "secrepo-2018-12-15.log", true) // the replay TestEvalRealLogs judges
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
