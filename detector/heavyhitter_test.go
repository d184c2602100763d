package detector

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/sketch"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func rec(ip string, at time.Duration) *decisionpb.Decision {
	return &decisionpb.Decision{Version: 1, EventTimeMs: t0.Add(at).UnixMilli(), Outcome: decisionpb.Outcome_OUTCOME_ALLOWED,
		Descriptors: &decisionpb.Descriptors{ClientIp: ip}}
}

// minute returns one minute of traffic starting at m minutes: n ordinary
// clients with per requests each, and a scraper with scraper requests.
func minute(m, n, per, scraper int) []*decisionpb.Decision {
	var out []*decisionpb.Decision
	base := time.Duration(m) * time.Minute
	for c := 0; c < n; c++ {
		for i := 0; i < per; i++ {
			out = append(out, rec(fmt.Sprintf("192.0.2.%d", c), base+time.Duration(c*per+i)*time.Millisecond*10))
		}
	}
	for i := 0; i < scraper; i++ {
		out = append(out, rec("198.51.100.7", base+time.Duration(i)*time.Millisecond*50))
	}
	return out
}

// minuteOptions are one-minute windows, as these tests' traffic comes.
var minuteOptions = HeavyHitterOptions{Window: time.Minute, MinCount: 120}

// run is the stage in a pipeline of 4 partitions, records spread by
// client IP as Kafka would.
func run(o HeavyHitterOptions) *stage.Local {
	return stage.NewLocal([]stage.Stage{must(NewHeavyHitters(o))}, 4, time.Hour)
}

func feed(l *stage.Local, recs []*decisionpb.Decision, until time.Duration) []rules.Rule {
	for _, r := range recs {
		l.Observe(int(sketch.Hash64(r.GetDescriptors().GetClientIp())%4), r)
	}
	return l.Advance(t0.Add(until)).Rules
}

func TestHeavyHitterFlagsTheScraperOnly(t *testing.T) {
	h := run(minuteOptions)
	var all []*decisionpb.Decision
	for m := 0; m < 3; m++ {
		all = append(all, minute(m, 100, 2, 0)...)
	}
	all = append(all, minute(3, 100, 2, 900)...)
	got := feed(h, all, 4*time.Minute)
	if len(got) != 1 {
		t.Fatalf("got %d rules, want 1: %+v", len(got), got)
	}
	r := got[0]
	if r.Match[0].Key != rules.KeyClientIP || r.Match[0].Value != "198.51.100.7" || r.Mode != rules.Shadow || r.Origin == "" {
		t.Errorf("rule %+v", r)
	}
	// Baseline: 2 requests per client; limit = 4 x 2 = 8, raised to MinLimit 10.
	if r.Limit != 10 || r.Period != time.Minute || r.Evidence["baseline_per_client"] != "2.00" {
		t.Errorf("limit %d per %s, evidence %v", r.Limit, r.Period, r.Evidence)
	}
	// 101 clients in a top-k of 64: Space-Saving may overcount by its
	// reported error, never undercount.
	count, _ := strconv.Atoi(r.Evidence["count"])
	cerr, _ := strconv.Atoi(r.Evidence["count_error"])
	if count-cerr > 900 || count < 900 {
		t.Errorf("count %d with error %d does not bound the true 900", count, cerr)
	}
	if !r.ExpiresAt.Equal(t0.Add(4*time.Minute + 10*time.Minute)) {
		t.Errorf("expires %v", r.ExpiresAt)
	}
	if err := r.Validate(); err != nil {
		t.Errorf("emitted rule is invalid: %v", err)
	}
	// Cool-down: the next minute's scraping does not re-emit the fresh rule.
	if again := feed(h, minute(4, 100, 2, 900), 5*time.Minute); len(again) != 0 {
		t.Errorf("re-emitted during cool-down: %+v", again)
	}
	// After half the TTL it is renewed.
	var later []rules.Rule
	for m := 5; m < 11; m++ {
		later = append(later, feed(h, minute(m, 100, 2, 900), time.Duration(m+1)*time.Minute)...)
	}
	if len(later) != 1 {
		t.Errorf("got %d renewals over 6 minutes, want 1", len(later))
	}
}

func TestHeavyHitterIgnoresAFlashCrowd(t *testing.T) {
	h := run(minuteOptions)
	var all []*decisionpb.Decision
	for m := 0; m < 3; m++ {
		all = append(all, minute(m, 50, 2, 0)...)
	}
	all = append(all, minute(3, 250, 30, 0)...) // 15x the traffic, spread over many clients
	if got := feed(h, all, 10*time.Minute); len(got) != 0 {
		t.Errorf("flash crowd produced rules: %+v", got)
	}
}

func TestHeavyHitterIsOrderIndependent(t *testing.T) {
	recs := append(minute(0, 40, 3, 0), minute(1, 40, 3, 400)...)
	a := feed(run(minuteOptions), recs, 3*time.Minute)
	shuffled := append([]*decisionpb.Decision(nil), recs...)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	b := feed(run(minuteOptions), shuffled, 3*time.Minute)
	if len(a) != 1 || !reflect.DeepEqual(a, b) {
		t.Errorf("order changed the output:\n%+v\n%+v", a, b)
	}
}

// A merge tier that takes over restores the stage's checkpoint and decides
// as the first would have: the same rules, the cool-down kept.
func TestHeavyHitterCheckpoint(t *testing.T) {
	traffic := func(m int) []*decisionpb.Decision { return minute(m, 100, 2, 900*(m%2)) }
	whole := run(minuteOptions)
	var want []rules.Rule
	for m := range 8 {
		want = append(want, feed(whole, traffic(m), time.Duration(m+1)*time.Minute)...)
	}
	if len(want) < 2 {
		t.Fatalf("only %d rules: the scenario must flag the scraper more than once", len(want))
	}

	first := must(NewHeavyHitters(minuteOptions))
	l := stage.NewLocal([]stage.Stage{first}, 4, time.Hour)
	var got []rules.Rule
	for m := range 4 {
		got = append(got, feed(l, traffic(m), time.Duration(m+1)*time.Minute)...)
	}
	state, err := first.MarshalState()
	if err != nil {
		t.Fatal(err)
	}
	second := must(NewHeavyHitters(minuteOptions))
	if err := second.UnmarshalState(state); err != nil {
		t.Fatal(err)
	}
	l = stage.NewLocal([]stage.Stage{second}, 4, time.Hour)
	for m := 4; m < 8; m++ {
		got = append(got, feed(l, traffic(m), time.Duration(m+1)*time.Minute)...)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("with a takeover:\n%+v\nwithout:\n%+v", got, want)
	}
	if err := second.UnmarshalState(state[:len(state)-1]); err == nil {
		t.Fatal("a truncated state was accepted")
	}
}

// must returns v, for a constructor whose options are known good.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// With no baseline yet (the first window of a sparse log), a scraper that
// is nearly the only client is judged against the other clients, not
// against a mean its own requests make: 600 requests beside 2 readers of 3
// requests each is flagged in the first window (it stood in for its own bar
// and was never flagged, alone 10 min into SecRepo 2018).
func TestHeavyHitterFlagsALoneScraperWithoutBaseline(t *testing.T) {
	h := run(minuteOptions)
	got := feed(h, minute(0, 2, 3, 600), 3*time.Minute)
	if len(got) != 1 || got[0].Match[0].Value != "198.51.100.7" {
		t.Fatalf("rules %v: want one on the scraper 198.51.100.7", got)
	}
}
