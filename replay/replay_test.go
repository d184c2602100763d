package replay_test

import (
	"bytes"
	"context"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/detector/enrich"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/replay"
	"github.com/sluice-rl/sluice/rules"
)

// sharedData returns ../shared/data, skipping the test when it is absent.
func sharedData(t *testing.T) string {
	t.Helper()
	data, err := enrich.FindData(".")
	if err != nil {
		t.Skipf("../shared/data absent (%v): this test replays the real logs kept there", err)
	}
	return data
}

func replayFile(t *testing.T, o replay.Options, path string) *replay.Report {
	t.Helper()
	f, err := replay.OpenFile(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx, cancel := hangGuard(t)
	defer cancel()
	rep, err := replay.Run(ctx, o, f)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func accountedFor(t *testing.T, rep *replay.Report, lines int) {
	t.Helper()
	st := rep.Sources[0].Stats
	if st.Lines != lines || st.Entries+st.Malformed+st.Header+st.Blank != lines {
		t.Errorf("lines: %+v, want %d accounted for", st, lines)
	}
	if rep.Requests+rep.Sources[0].Rejected != st.Entries {
		t.Errorf("%d requests decided + %d rejected, but %d entries parsed", rep.Requests, rep.Sources[0].Rejected, st.Entries)
	}
	p, c := rep.Producer, rep.Consumer
	if p.Logged != int64(rep.Requests) || p.Produced != p.Logged || p.Dropped != 0 || p.Failed != 0 {
		t.Errorf("producer %+v: want every one of %d decisions produced", p, rep.Requests)
	}
	// Every decision, and the punctuations: one per partition at each
	// barrier and at the end.
	if c.Consumed != p.Produced+rep.Punctuations || c.BadRecord != 0 || rep.Punctuations == 0 || rep.Punctuations%4 != 0 {
		t.Errorf("consumer %+v: want %d decisions and %d punctuations consumed, none bad", c, p.Produced, rep.Punctuations)
	}
}

// The SecRepo day: one python-requests scraper (198.72.227.213) makes 4,156
// of 4,961 requests, up to ~680 a minute. With a per-IP bucket of 60 and one
// token a second, it alone is denied, mostly; the detector flags it, and its
// shadow rule, read back from Redis, changes later decisions.
func TestReplaySecRepoEndToEnd(t *testing.T) {
	data := sharedData(t)
	set, err := rules.Load(filepath.Join("..", "testdata", "rules", "per-ip-60.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	const scraper = "198.72.227.213"
	rep := replayFile(t, replay.Options{Rules: set, DataDir: data, RedisAddr: redistest.Addr(t)},
		filepath.Join(data, "access-logs", "secrepo-2018-12-15.log"))
	accountedFor(t, rep, 4961)

	denied := rep.DeniedKeys("per-ip")
	if len(denied) != 1 || denied["client_ip="+scraper] == 0 {
		t.Fatalf("denied keys %v: want only client_ip=%s", denied, scraper)
	}
	n := denied["client_ip="+scraper]
	if rep.Outcomes[decision.Denied] != n {
		t.Errorf("%d denials in all, %d of the scraper", rep.Outcomes[decision.Denied], n)
	}
	if n <= 4156/2 || n >= 4156 {
		t.Errorf("scraper denied %d of 4156: want most but not all", n)
	}
	if len(rep.DynamicRules) == 0 {
		t.Fatal("the detector emitted no rule")
	}
	// Every rule names clients of the log's abusive list (the scraper, the
	// probers; testdata/eval/secrepo-2018-12-15.abusive says why each is
	// abusive), in shadow mode.
	attacks, err := replay.ReadBackgroundAttacks(filepath.Join("..", "testdata", "eval", "secrepo-2018-12-15.abusive"))
	if err != nil {
		t.Fatal(err)
	}
	abusive := map[string]bool{}
	for _, a := range attacks {
		abusive[a.Scope["client_ip"]] = true
	}
	onScraper := 0
	for _, r := range rep.DynamicRules {
		named := len(r.Match) == 1 && r.Match[0].Key == rules.KeyClientIP && r.Mode == rules.Shadow
		if named && len(r.Match[0].CIDR) > 0 {
			for _, p := range r.Match[0].CIDR {
				named = named && p.IsSingleIP() && abusive[p.Addr().String()]
			}
		} else if named {
			named = abusive[r.Match[0].Value]
		}
		if !named {
			t.Errorf("dynamic rule %s matches %v in %v: want a shadow rule on the log's abusive clients only", r.ID, r.Match, r.Mode)
		}
		if r.Match[0].Value == scraper {
			onScraper++
		}
		// Every signal's evidence names it (or, the heavy hitters', the
		// baseline) and what it counted.
		counted := r.Evidence["count"] != "" || r.Evidence["requests"] != ""
		if !counted || r.Evidence["baseline_per_client"] == "" && r.Evidence["signal"] == "" {
			t.Errorf("rule %s lacks evidence: %v", r.ID, r.Evidence)
		}
	}
	if onScraper == 0 {
		t.Error("no dynamic rule on the scraper")
	}
	if rep.DynamicShadowDenied == 0 || rep.FirstDynamicEffect == nil {
		t.Fatal("no later decision was changed by the detector's rule")
	}
	var out bytes.Buffer
	rep.Print(&out)
	for _, want := range []string{"4961 lines: 4961 parsed", "shadow-denied by detector rules: ", "client_ip " + scraper, "Throughput:"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

// The Elastic sample: 10,000 lines, line 8,899 truncated inside the user
// agent. Every line is accounted for and the run does not abort.
func TestReplayElasticAccountsForEveryLine(t *testing.T) {
	data := sharedData(t)
	rep := realLogReport(t, data, "elastic-apache_logs.log", false) // the replay TestEvalRealLogs judges
	accountedFor(t, rep, 10000)
	for _, e := range rep.Sources[0].Malformed {
		t.Logf("malformed line %d: %v", e.Line, e.Err)
	}
	if rep.Consumer.Late != 0 {
		t.Errorf("%d records late: the reorder horizon should cover this log's 59 s of disorder", rep.Consumer.Late)
	}
}

// summary is what must be identical between two runs of one scenario.
type summary struct {
	Outcomes map[decision.Outcome]int
	Rules    []rules.Rule
	Shares   []rules.Share
	Denied   map[string]int
}

func runGenerated(t *testing.T, brokers []string) *replay.Report {
	t.Helper()
	ctx, cancel := hangGuard(t)
	defer cancel()
	rep, err := replay.Run(ctx, replay.Options{Brokers: brokers}, replay.Generate(replay.Scenario{Duration: 4 * time.Minute, Clients: 200}))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range rep.Problems {
		if strings.Contains(p, "stopped early") {
			// A replay cut short differs from a whole one: say why.
			t.Fatalf("the replay stopped early: %s", p)
		}
	}
	return rep
}

// hangGuard returns the context a test's replay runs in: it ends a minute
// before the test binary's -timeout, so that a stuck replay fails the test
// with its own error (and Run's cleanup, which waits up to 30 s to delete a
// shared cluster's topics, has time) instead of go test's panic. It is only
// a hang guard, not a speed check: Run waits as long as its parts make
// progress and fails by itself when one is stuck (Options.Stall, 30 s
// without progress), so that its results depend on event time alone. A
// replay is CPU-bound: the generated scenario's 20 000 decisions take
// about 42 s of CPU under -race (in-process Redis's Lua, mostly; 3-4 s of a
// run wait at barriers), 55-65 s of wall time at load 5-9 on 2 cores; at
// load 10-12 the first of three replays passed the former cap of 2 minutes.
func hangGuard(t *testing.T) (context.Context, context.CancelFunc) {
	deadline, ok := t.Deadline()
	if !ok {
		return context.WithCancel(context.Background())
	}
	return context.WithDeadline(context.Background(), deadline.Add(-time.Minute))
}

// The generated scenario needs no shared data: the quick start's replay.
// The scraper is flagged, the hot key's share follows its demand from
// us-east to eu-west, and two more runs, one after the other on the same
// Kafka cluster, give the same decisions, rules and shares: each run has its
// own topics and groups, which it deletes at the end, so the second does not
// take the first's records, offsets or watermarks for its own.
func TestReplayGeneratedScenario(t *testing.T) {
	rep := runGenerated(t, nil)
	accountedFor(t, rep, rep.Sources[0].Stats.Lines)
	if rep.DeniedKeys("per-ip")["client_ip="+replay.ScraperIP] == 0 {
		t.Errorf("the scraper was never denied by per-ip: %v", rep.DeniedKeys("per-ip"))
	}
	flagged := false
	for _, r := range rep.DynamicRules {
		flagged = flagged || r.Match[0].Value == replay.ScraperIP
	}
	if !flagged {
		t.Errorf("no dynamic rule on the scraper: %v", rep.DynamicRules)
	}
	if rep.SharedDecisions == 0 {
		t.Error("no decision used an aggregator share")
	}
	hot := rules.EntityTag(replay.DefaultRules().Rule("per-api-key"), &rules.Descriptors{rules.KeyAPIKey: "key-hot"})
	latest := rep.LatestShares()["per-api-key|"+hot]
	if latest == nil {
		t.Fatalf("no share for key-hot; shares: %d written", len(rep.ShareLog))
	}
	if e, u := latest["eu-west"].Fraction, latest["us-east"].Fraction; e < 0.5 || e <= u {
		t.Errorf("after the shift key-hot's share is eu-west %.3f, us-east %.3f: want eu-west the largest", e, u)
	}
	var sum float64
	for _, s := range latest {
		sum += s.Fraction
	}
	if sum > 1+1e-9 {
		t.Errorf("key-hot's shares sum to %.4f > 1", sum)
	}

	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	a := summary{rep.Outcomes, rep.DynamicRules, rep.ShareLog, rep.DeniedKeys("per-api-key")}
	for run := range 2 {
		again := runGenerated(t, kc.ListenAddrs())
		b := summary{again.Outcomes, again.DynamicRules, again.ShareLog, again.DeniedKeys("per-api-key")}
		if !reflect.DeepEqual(a, b) || again.Consumer.Late != 0 {
			t.Errorf("run %d on a shared cluster differs from the first (%d late records):\n%+v\n%+v", run+2, again.Consumer.Late, a.Outcomes, b.Outcomes)
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	topics, err := kadm.NewClient(cl).ListTopics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range topics.Names() {
		if strings.HasPrefix(name, "sluice-replay-") {
			t.Errorf("topic %s left behind", name)
		}
	}
}

func TestDefaultRulesParse(t *testing.T) {
	s := replay.DefaultRules()
	if s.Rule("per-ip") == nil || !s.Rule("per-api-key").Global {
		t.Fatalf("default rules: %+v", s.Rules)
	}
}
