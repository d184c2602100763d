package replay_test

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/replay"
	"github.com/sluice-rl/sluice/rules"
)

// The detector on every injected scenario, over seeded background traffic:
// each attack detected, by a rule on its scope, within 30 s of event time;
// no rule on carrier-grade NAT or the flash crowd; the only rules on
// background clients name its scraper.
func TestEvalInjectedScenarios(t *testing.T) {
	data := sharedData(t)
	at := func(i int) time.Duration { return 10*time.Minute + time.Duration(i)*5*time.Minute }
	d := 3 * time.Minute
	bg := replay.Generate(replay.Scenario{Seed: 1, Duration: at(7), Clients: 300})
	in, err := replay.Inject(bg, replay.InjectOptions{Seed: 1},
		replay.Botnet{Offset: at(0), Duration: d},
		replay.CredentialStuffing{Offset: at(1), Duration: d},
		replay.URIScan{Offset: at(2), Duration: d},
		replay.UAFlood{Offset: at(3), Duration: d},
		replay.Scraper{Offset: at(4), Duration: d},
		replay.CGNAT{Offset: at(5), Duration: d},
		replay.FlashCrowd{Offset: at(6), Duration: d},
	)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rep, err := replay.Run(ctx, replay.Options{DataDir: data}, in)
	if err != nil {
		t.Fatal(err)
	}
	score := replay.ScoreRules(rep, in.Spans())
	var out bytes.Buffer
	score.Print(&out)
	t.Logf("%d requests in %v\n%s", rep.Requests, rep.Elapsed, out.String())
	for _, sc := range score.Scenarios {
		switch {
		case sc.Attack && !sc.Detected:
			t.Errorf("%s not detected", sc.Scenario)
		case sc.Attack && sc.TimeToDetect > 30*time.Second:
			t.Errorf("%s detected after %v, want within 30 s", sc.Scenario, sc.TimeToDetect)
		case !sc.Attack && sc.Rules > 0:
			t.Errorf("%s (benign) drew %d rules", sc.Scenario, sc.Rules)
		}
	}
	for _, r := range score.Unlabelled {
		if !slices.ContainsFunc(r.Match, func(m rules.Match) bool { return m.Value == replay.ScraperIP }) {
			t.Errorf("rule on a background client: %s", r.Reason)
		}
	}
}
