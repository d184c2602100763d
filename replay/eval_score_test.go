package replay_test

import (
	"bytes"
	"io"
	"net/netip"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/replay"
	"github.com/sluice-rl/sluice/replay/accesslog"
	"github.com/sluice-rl/sluice/rules"
)

// requests is a Source over a slice, in event-time order.
type requests []replay.Request

func (r *requests) Name() string           { return "requests" }
func (r *requests) Stats() accesslog.Stats { return accesslog.Stats{} }
func (r *requests) Next() (replay.Request, error) {
	if len(*r) == 0 {
		return replay.Request{}, io.EOF
	}
	q := (*r)[0]
	*r = (*r)[1:]
	return q, nil
}

// ScoreRules counts a false positive wherever a rule matches benign
// requests: on a benign scenario without a scope (a flash crowd's browser on
// its landing page) and on background clients. Scoring by scope, as
// ScoreRules did before, counted neither: it saw one true positive and
// precision 1.000.
func TestScoreRulesCountsUnscopedFalsePositives(t *testing.T) {
	start := replay.GeneratorStart.Add(10 * time.Minute)
	botnet := replay.Label{Scenario: replay.ScenarioBotnet, Attack: true, Scope: map[string]string{"ja4": replay.JA4Go}}
	crowd := replay.Label{Scenario: replay.ScenarioFlashCrowd}
	var src requests
	for i := range 100 {
		at := start.Add(time.Duration(i) * time.Second)
		req := func(client, ja4, path string, l replay.Label) replay.Request {
			return replay.Request{Entry: accesslog.Entry{Time: at, Client: client, Method: "GET", Path: path, Status: 200, UserAgent: "x"}, JA4: ja4, Label: l}
		}
		src = append(src,
			req("192.0.2.1", replay.JA4Python, "/about", replay.Label{}),           // a background client
			req("192.0.2.2", replay.JA4Python, "/about", crowd),                    // the flash crowd, no scope
			req("198.18.0.1", replay.JA4Go, "/login", botnet),                      // the attack
			req("192.0.2.3", replay.JA4Python, "/v1/items", replay.Label{}),        // benign background no rule matches
			req(replay.ScraperIP, replay.JA4Python, "/v1/items/1", replay.Label{}), // the background's scraper
		)
	}
	rule := func(id string, limit int64, m ...rules.Match) rules.Rule {
		return rules.Rule{ID: id, Match: m, Limit: limit, Burst: limit, Period: time.Minute, Mode: rules.Shadow, Origin: "detector/test",
			Version: start.UnixMilli(), ExpiresAt: start.Add(10 * time.Minute)}
	}
	rep := &replay.Report{
		DynamicRules: []rules.Rule{
			rule("ja4", 10, rules.Match{Key: rules.KeyJA4, Value: replay.JA4Go}),
			rule("ja4-route", 10, rules.Match{Key: rules.KeyJA4, Value: replay.JA4Python}, rules.Match{Key: rules.KeyRoute, Value: "/about"}),
			rule("bg-ip", 10, rules.Match{Key: rules.KeyClientIP, Value: "192.0.2.1"}),
			rule("scraper", 10, rules.Match{Key: rules.KeyClientIP, Value: replay.ScraperIP}),
		},
		Labels: map[string]replay.Label{botnet.Scenario: botnet, crowd.Scenario: crowd},
	}
	spans := []replay.Span{
		{Scenario: botnet.Scenario, Attack: true, Start: start, End: start.Add(100 * time.Second)},
		{Scenario: crowd.Scenario, Start: start, End: start.Add(100 * time.Second)},
	}
	s, err := replay.ScoreRules(rep, spans, &src, replay.ScoreOptions{Regions: []string{"one"}, BackgroundAttacks: replay.GeneratedAttacks})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	s.Print(&out)
	t.Log("\n" + out.String())
	if s.TruePositives != 2 || s.FalsePositives != 2 || s.Precision != 0.5 || s.Recall != 1 {
		t.Errorf("%d true and %d false positives, precision %.3f, recall %.3f; want 2 (ja4, scraper), 2 (ja4-route, bg-ip), 0.5, 1",
			s.TruePositives, s.FalsePositives, s.Precision, s.Recall)
	}
	verdicts := map[string]bool{"ja4": true, "ja4-route": false, "bg-ip": false, "scraper": true}
	for _, r := range s.Rules {
		if r.TruePositive != verdicts[r.ID] {
			t.Errorf("rule %s: true positive %v, want %v (attack %d, benign %d)", r.ID, r.TruePositive, verdicts[r.ID], r.Attack, r.Benign)
		}
	}
	// A 10-per-minute bucket of burst 10 over 100 requests a second apart
	// allows 10 + about 16 and denies the rest: 200 on /about, 100 of
	// them from the one background client.
	for _, r := range s.Rules {
		if r.ID == "bg-ip" && (r.Collateral < 70 || r.Collateral > 76) {
			t.Errorf("bg-ip denies %d benign requests, want 74 or so", r.Collateral)
		}
	}
	for _, sc := range s.Scenarios {
		switch sc.Scenario {
		case crowd.Scenario:
			if sc.Rules != 1 || sc.Collateral < 70 {
				t.Errorf("flash crowd: %d rules, collateral %d; want 1 and about 74", sc.Rules, sc.Collateral)
			}
		case botnet.Scenario:
			if !sc.Detected || sc.TimeToDetect != 0 {
				t.Errorf("botnet: detected %v after %v, want at once", sc.Detected, sc.TimeToDetect)
			}
		}
	}
	if s.Collateral != s.BackgroundCollateral+74 && s.BackgroundCollateral == 0 {
		t.Errorf("collateral %d, of the background %d: the background's denials are not counted", s.Collateral, s.BackgroundCollateral)
	}
}

// A background attacker named by networks (a prober rotating through /24s)
// is one attacker: its networks' requests are attack requests, a rule on
// one network is a true positive, and recall counts the attacker once.
func TestScoreRulesBackgroundNetworks(t *testing.T) {
	start := replay.GeneratorStart
	var src requests
	for i := range 20 {
		at := start.Add(time.Duration(i) * time.Second)
		for _, c := range []string{"198.51.100.7", "198.51.100.9", "203.0.113.5", "192.0.2.1"} {
			src = append(src, replay.Request{Entry: accesslog.Entry{Time: at, Client: c, Method: "HEAD", Path: "/backup.zip", Status: 404}})
		}
	}
	rule := func(id, cidr string) rules.Rule {
		return rules.Rule{ID: id, Match: []rules.Match{{Key: rules.KeyClientIP, CIDR: []netip.Prefix{netip.MustParsePrefix(cidr)}, Shared: true}}, Limit: 1, Burst: 1, Period: time.Minute,
			Mode: rules.Shadow, Origin: "detector/test", Version: start.UnixMilli(), ExpiresAt: start.Add(10 * time.Minute)}
	}
	rep := &replay.Report{DynamicRules: []rules.Rule{rule("net-a", "198.51.100.0/24"), rule("net-b", "203.0.113.0/24"), rule("benign", "192.0.2.0/24")}}
	prober := []replay.BackgroundAttack{
		{Name: "prober", Scope: map[string]string{"client_ip": "198.51.100.0/24"}},
		{Name: "prober", Scope: map[string]string{"client_ip": "203.0.113.0/24"}},
	}
	s, err := replay.ScoreRules(rep, nil, &src, replay.ScoreOptions{Regions: []string{"one"}, BackgroundAttacks: prober})
	if err != nil {
		t.Fatal(err)
	}
	if s.TruePositives != 2 || s.FalsePositives != 1 || s.Recall != 1 || len(s.Scenarios) != 1 {
		t.Errorf("%d true, %d false positives, recall %.3f over %d attackers; want 2 (net-a, net-b), 1 (benign), 1 over 1", s.TruePositives, s.FalsePositives, s.Recall, len(s.Scenarios))
	}
	if _, err := replay.ScoreRules(rep, nil, &requests{}, replay.ScoreOptions{BackgroundAttacks: []replay.BackgroundAttack{{Name: "x", Scope: map[string]string{"client_ip": "198.51.100.0/33"}}}}); err == nil {
		t.Error("a bad network scored without an error")
	}
}
