package replay_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/replay"
)

// The detector on every injected scenario together, in a seeded random
// order (seed 3: credential stuffing first, with no botnet before it to
// teach the ASN baseline, the order the old detector missed it in), over
// seeded background traffic, scored on every request (ScoreRules):
// each attack detected, by a true-positive rule, within 30 s of event time;
// no rule matching carrier-grade NAT or the flash crowd; every rule a true
// positive (the background's scraper is labelled an attack), so precision
// 1 and no benign request denied.
//
// One order, for time (4 min); `sluice eval --orders 3` runs three, and
// docs/eval.md records them and the real logs'.
func TestEvalInjectedScenarios(t *testing.T) {
	// Beside TestEvalRealLogs' and TestEvalRotatingProber's replays (both
	// parallel too), which spend most of their time waiting at barriers:
	// with go test's 2 parallel slots on 2 cores the three take about the
	// time of this one, not the sum.
	t.Parallel()
	data := sharedData(t)
	ctx, cancel := hangGuard(t)
	defer cancel()
	// A redis-server: miniredis runs each script in a fresh gopher-lua
	// state, which took 37% of this test's CPU.
	res, err := replay.Eval(ctx, replay.EvalOptions{Orders: 1, Seed: 3, Run: replay.Options{DataDir: data, RedisAddr: redistest.Addr(t)}}, func(run string) { t.Logf("replaying %s", run) })
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	res.Print(&out)
	for _, run := range res.Runs {
		out.WriteString("\n" + run.Name + "\n")
		run.Score.Print(&out)
	}
	t.Log("\n" + out.String())
	for _, sc := range res.Scenarios {
		switch {
		case sc.Attack && sc.Missed > 0:
			t.Errorf("%s not detected in %d of %d runs", sc.Scenario, sc.Missed, sc.Runs)
		case sc.Attack && sc.TimeToDetect > timeToDetect(sc.Scenario):
			t.Errorf("%s detected after up to %v, want within %v", sc.Scenario, sc.TimeToDetect, timeToDetect(sc.Scenario))
		case !sc.Attack && sc.Rules > 0:
			t.Errorf("%s (benign) drew up to %d rules, denying up to %d of its requests", sc.Scenario, sc.Rules, sc.Collateral)
		}
	}
	if res.Precision < 1 || res.Collateral > 0 {
		t.Errorf("worst precision %.3f (up to %d false positive rules), collateral up to %d benign requests; want 1 and 0", res.Precision, res.FalsePositives, res.Collateral)
	}
	for _, run := range res.Runs {
		for _, r := range run.Score.Rules {
			if !r.TruePositive {
				t.Errorf("%s: false positive %s: %s (%d attack, %d benign requests; denies %d benign)", run.Name, r.ID, r.Reason, r.Attack, r.Benign, r.Collateral)
			}
		}
	}
}

// timeToDetect is the longest event time an attack may take to detect: the
// issue's targets (volume attacks 20 s, slow scanners 2 min, the
// low-and-slow botnet 5 min), plus the 10 s a rule takes to come out after
// its window closes (the window's lateness and the replay's barrier) for
// the volume attacks, which are judged on 10 s windows.
func timeToDetect(scenario string) time.Duration {
	switch scenario {
	case replay.ScenarioSlowScan:
		return 2 * time.Minute
	case replay.ScenarioLowSlowBotnet:
		return 5 * time.Minute
	}
	return 30 * time.Second
}

// The eval says how many background lines it skipped as malformed, and a
// directory is no log.
func TestEvalWarnsAboutMalformedBackground(t *testing.T) {
	var b strings.Builder
	(&replay.EvalResult{Background: "x.log", BackgroundLines: 1001, BackgroundMalformed: 1000}).Print(&b)
	if !strings.Contains(b.String(), "1000 of the background's 1001 lines are malformed") {
		t.Errorf("eval output does not warn about malformed lines:\n%s", b.String())
	}
	b.Reset()
	(&replay.EvalResult{Background: "x.log", BackgroundLines: 10}).Print(&b)
	if strings.Contains(b.String(), "malformed") {
		t.Errorf("eval output warns with no malformed line:\n%s", b.String())
	}
	if _, err := replay.OpenFile(context.Background(), t.TempDir()); err == nil || !strings.Contains(err.Error(), "is a directory") {
		t.Errorf("OpenFile of a directory: %v, want an error saying it is a directory", err)
	}
}
