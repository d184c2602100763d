package aggregator

import (
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
)

var (
	t0      = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	regions = []string{"a", "b", "c"}
	global  = &rules.Rule{ID: "per-key", Match: []rules.Match{{Key: rules.KeyAPIKey}}, Limit: 100, Period: time.Second, Burst: 100, Global: true}
)

// newShares is the stage in a pipeline of 3 partitions.
func newShares(t *testing.T) *stage.Local {
	t.Helper()
	s, err := New(Options{Regions: regions, Rules: []*rules.Rule{global}, Interval: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return stage.NewLocal([]stage.Stage{s}, 3, time.Minute)
}

// demand feeds one 10 s interval starting at i intervals: n[r] requests of
// key from region r.
func demand(s *stage.Local, i int, key string, n [3]int) {
	for r, c := range n {
		for j := 0; j < c; j++ {
			s.Observe(j, &decisionpb.Decision{Version: 1, Region: regions[r], Outcome: decisionpb.Outcome_OUTCOME_ALLOWED,
				EventTimeMs: t0.Add(time.Duration(i)*10*time.Second + time.Duration(j)*time.Millisecond).UnixMilli(),
				Descriptors: &decisionpb.Descriptors{ApiKey: key}})
		}
	}
}

func keyShares(out []rules.Share, key string) map[string]float64 {
	tag := rules.EntityTag(global, &rules.Descriptors{rules.KeyAPIKey: key})
	m := map[string]float64{}
	for _, s := range out {
		if s.Key == tag {
			m[s.Region] = s.Fraction
		}
	}
	return m
}

func TestSharesFollowDemandWithAFloor(t *testing.T) {
	s := newShares(t)
	demand(s, 0, "hot", [3]int{800, 100, 100})
	out := s.Advance(t0.Add(10 * time.Second)).Shares
	got := keyShares(out, "hot")
	want := map[string]float64{"a": 0.05 + 0.85*0.8, "b": 0.05 + 0.85*0.1, "c": 0.05 + 0.85*0.1}
	sum := 0.0
	for r, w := range want {
		if math.Abs(got[r]-w) > 0.005 {
			t.Errorf("region %s: share %.4f, want %.4f", r, got[r], w)
		}
		sum += got[r]
	}
	if sum > 1+1e-9 {
		t.Errorf("shares sum to %.6f", sum)
	}
	for _, sh := range out {
		if !sh.ComputedAt.Equal(t0.Add(10*time.Second)) || sh.Version != t0.Add(10*time.Second).UnixMilli() {
			t.Errorf("share %+v: version and time must be the interval's end", sh)
		}
	}

	// The same demand again: nothing moved, nothing written (heartbeat is 2 intervals).
	demand(s, 1, "hot", [3]int{800, 100, 100})
	if again := keyShares(s.Advance(t0.Add(20*time.Second)).Shares, "hot"); len(again) != 0 {
		t.Errorf("unchanged shares were rewritten: %v", again)
	}
	// Demand moves to region b; the EWMA (alpha 0.8) follows within two intervals.
	demand(s, 2, "hot", [3]int{0, 1000, 0})
	demand(s, 3, "hot", [3]int{0, 1000, 0})
	s.Advance(t0.Add(30 * time.Second))
	moved := keyShares(s.Advance(t0.Add(40*time.Second)).Shares, "hot")
	if moved["b"] < 0.6 || moved["a"] >= moved["b"] {
		t.Errorf("after the shift: %v, want b the largest", moved)
	}
	if moved["c"] < 0.05-1e-9 {
		t.Errorf("region c fell below the floor: %v", moved)
	}
}

func TestSharesIgnoreLightKeysAndOtherRules(t *testing.T) {
	s := newShares(t)
	demand(s, 0, "light", [3]int{5, 0, 0}) // below MinDemand
	out := s.Advance(t0.Add(10 * time.Second)).Shares
	if got := keyShares(out, "light"); len(got) != 0 {
		t.Errorf("a light key got shares: %v", got)
	}
	// The default split still follows the regions' totals.
	def := map[string]float64{}
	for _, sh := range out {
		if sh.Key == "" {
			def[sh.Region] = sh.Fraction
		}
	}
	if math.Abs(def["a"]-0.9) > 1e-9 || math.Abs(def["b"]-0.05) > 1e-9 {
		t.Errorf("default split %v", def)
	}
	if _, err := New(Options{Regions: regions, Floor: 0.4}); err == nil {
		t.Error("a floor of 0.4 over 3 regions must be refused")
	}
}

// A merge tier that takes over restores the stage's checkpoint: smoothed
// demand, last written shares and idle counts carry over, so the shares it
// writes are those the first would have written.
func TestSharesCheckpoint(t *testing.T) {
	load := [][3]int{{800, 100, 100}, {800, 100, 100}, {0, 1000, 0}, {0, 1000, 0}, {300, 300, 300}, {0, 0, 900}}
	feedAll := func(l *stage.Local, from, to int) []rules.Share {
		var out []rules.Share
		for i := from; i < to; i++ {
			demand(l, i, "hot", load[i])
			demand(l, i, "cold", [3]int{30, 0, 0})
			out = append(out, l.Advance(t0.Add(time.Duration(i+1)*10*time.Second)).Shares...)
		}
		return out
	}
	want := feedAll(newShares(t), 0, len(load))

	mk := func() *Shares {
		s, err := New(Options{Regions: regions, Rules: []*rules.Rule{global}, Interval: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	first := mk()
	got := feedAll(stage.NewLocal([]stage.Stage{first}, 3, time.Minute), 0, 3)
	state, err := first.MarshalState()
	if err != nil {
		t.Fatal(err)
	}
	second := mk()
	if err := second.UnmarshalState(state); err != nil {
		t.Fatal(err)
	}
	got = append(got, feedAll(stage.NewLocal([]stage.Stage{second}, 3, time.Minute), 3, len(load))...)
	if len(want) == 0 || !reflect.DeepEqual(got, want) {
		t.Fatalf("with a takeover:\n%+v\nwithout:\n%+v", got, want)
	}
	if err := second.UnmarshalState(append(state, 0)); err == nil {
		t.Fatal("a state with a trailing byte was accepted")
	}
}

// Pinned and G-Counter rules are global without shares: the stage splits
// neither, only the plain global rule beside them.
func TestSharesSkipPinnedAndGCounterRules(t *testing.T) {
	pinned := &rules.Rule{ID: "paid", Match: []rules.Match{{Key: rules.KeyAPIKey}}, Limit: 100, Period: time.Second, Burst: 100, Global: true, Pinned: true}
	quota := &rules.Rule{ID: "daily", Match: []rules.Match{{Key: rules.KeyAPIKey}}, Limit: 1000, Period: 24 * time.Hour, Algorithm: rules.FixedWindow, Global: true, GCounter: true}
	st, err := New(Options{Regions: regions, Rules: []*rules.Rule{pinned, global, quota}, Interval: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s := stage.NewLocal([]stage.Stage{st}, 3, time.Minute)
	demand(s, 0, "hot", [3]int{800, 100, 100})
	out := s.Advance(t0.Add(10 * time.Second)).Shares
	if len(out) == 0 {
		t.Fatal("no shares for the plain global rule")
	}
	for _, sh := range out {
		if sh.RuleID != global.ID {
			t.Errorf("a share of %s: %+v", sh.RuleID, sh)
		}
	}
}
