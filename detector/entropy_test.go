package detector

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/sketch"
)

var userAgents = []string{"Mozilla/5.0 (Windows NT 10.0; Win64; x64) Chrome/120.0", "Mozilla/5.0 (Macintosh) Safari/605.1.15",
	"Mozilla/5.0 (X11; Linux x86_64) Firefox/121.0", "Mozilla/5.0 (iPhone) Mobile/15E148", "okhttp/4.12.0"}

// shapeTraffic is two minutes of ordinary clients plus what extra adds each
// second, through a 4-partition pipeline with the Entropy signals.
func shapeTraffic(t *testing.T, extra func(at time.Time, r *rand.Rand) []*decisionpb.Decision) []rules.Rule {
	t.Helper()
	r := rand.New(rand.NewPCG(11, 12))
	l := stage.NewLocal([]stage.Stage{must(NewEntropy(EntropyOptions{}))}, 4, 5*time.Second)
	var out []rules.Rule
	for s := range 120 {
		at := t0.Add(time.Duration(s) * time.Second)
		var recs []*decisionpb.Decision
		for i := range 100 {
			c := r.IntN(500)
			status := uint32(200)
			if r.IntN(50) == 0 {
				status = 404
			}
			recs = append(recs, &decisionpb.Decision{Version: 1, EventTimeMs: at.Add(time.Duration(i) * 10 * time.Millisecond).UnixMilli(), Outcome: decisionpb.Outcome_OUTCOME_ALLOWED,
				Status: status, UserAgent: userAgents[c%len(userAgents)],
				Descriptors: &decisionpb.Descriptors{ClientIp: fmt.Sprintf("10.0.%d.%d", c/256, c%256), Ja4: browserJA4s[c%len(browserJA4s)], Path: routes[r.IntN(len(routes))]}})
		}
		recs = append(recs, extra(at, r)...)
		for _, d := range recs {
			l.Observe(int(sketch.Hash64(d.Descriptors.ClientIp)%4), d)
		}
		out = append(out, l.Advance(at.Add(-5*time.Second)).Rules...)
	}
	return append(out, l.Advance(t0.Add(time.Hour)).Rules...)
}

func TestEntropyFlagsScanAndUASwitching(t *testing.T) {
	got := shapeTraffic(t, func(at time.Time, r *rand.Rand) []*decisionpb.Decision {
		var out []*decisionpb.Decision
		for i := range 20 { // a random-URI scan: 20 a second, new paths, mostly 404
			status := uint32(404)
			if i%5 == 0 {
				status = 200
			}
			out = append(out, &decisionpb.Decision{Version: 1, EventTimeMs: at.Add(time.Duration(i) * 50 * time.Millisecond).UnixMilli(), Outcome: decisionpb.Outcome_OUTCOME_ALLOWED,
				Status: status, UserAgent: "Mozilla/5.0 zgrab/0.x", Descriptors: &decisionpb.Descriptors{ClientIp: "198.51.100.66", Ja4: browserJA4s[0],
					Path: fmt.Sprintf("/%x/%x.php", r.Uint32(), r.Uint32())}})
		}
		for i := range 20 { // UA switching: one TLS stack, a new user agent each time
			out = append(out, &decisionpb.Decision{Version: 1, EventTimeMs: at.Add(time.Duration(i) * 50 * time.Millisecond).UnixMilli(), Outcome: decisionpb.Outcome_OUTCOME_ALLOWED,
				Status: 200, UserAgent: fmt.Sprintf("Mozilla/5.0 (build %d)", r.Uint32()), Descriptors: &decisionpb.Descriptors{ClientIp: "198.51.100.77", Ja4: browserJA4s[1], Path: "/v1/items"}})
		}
		return out
	})
	want := map[string]string{"198.51.100.66": "detector/random-uri-scan", "198.51.100.77": "detector/ua-switching"}
	seen := map[string]bool{}
	for _, r := range got {
		ip := r.Match[0].Value
		if want[ip] != r.Origin {
			t.Errorf("unexpected rule: %s (%s)", r.Reason, r.Origin)
		}
		seen[ip] = true
		if err := r.Validate(); err != nil {
			t.Errorf("rule %s invalid: %v", r.ID, err)
		}
	}
	for ip := range want {
		if !seen[ip] {
			t.Errorf("%s not flagged", ip)
		}
	}
}

// Carrier-grade NAT: one address for hundreds of users with their own user
// agents and TLS stacks, and a busy client on a few paths: no rule.
func TestEntropyIgnoresCGNAT(t *testing.T) {
	got := shapeTraffic(t, func(at time.Time, r *rand.Rand) []*decisionpb.Decision {
		var out []*decisionpb.Decision
		for i := range 30 {
			u := r.IntN(800)
			out = append(out, &decisionpb.Decision{Version: 1, EventTimeMs: at.Add(time.Duration(i) * 30 * time.Millisecond).UnixMilli(), Outcome: decisionpb.Outcome_OUTCOME_ALLOWED,
				Status: 200, UserAgent: fmt.Sprintf("Mozilla/5.0 (Android %d; build %d)", 9+u%6, u), Descriptors: &decisionpb.Descriptors{ClientIp: "100.64.0.1",
					Ja4: browserJA4s[u%len(browserJA4s)], Path: routes[r.IntN(len(routes))]}})
			out = append(out, &decisionpb.Decision{Version: 1, EventTimeMs: at.Add(time.Duration(i) * 30 * time.Millisecond).UnixMilli(), Outcome: decisionpb.Outcome_OUTCOME_ALLOWED,
				Status: 200, UserAgent: userAgents[0], Descriptors: &decisionpb.Descriptors{ClientIp: "192.0.2.9", Ja4: browserJA4s[0], Path: routes[i%2]}})
		}
		return out
	})
	for _, r := range got {
		t.Errorf("benign traffic flagged: %s", r.Reason)
	}
}

func FuzzEntropyPartial(f *testing.F) {
	fuzzPartial(f, must(NewEntropy(EntropyOptions{K: 4})), &decisionpb.Decision{UserAgent: "a", Status: 404, Descriptors: &decisionpb.Descriptors{ClientIp: "192.0.2.1", Path: "/x"}})
}
