package aggregator

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/sketch"
)

// checkSet fails unless one key's written shares sum to at most 1, each in
// [floor, 1].
func checkSet(t *testing.T, what string, f []float64, floor float64) {
	t.Helper()
	sum := 0.0
	for _, x := range f {
		sum += x
		if !(x >= floor && x <= 1) {
			t.Fatalf("%s: share %v outside [floor %v, 1] in %v", what, x, floor, f)
		}
	}
	if sum > 1 {
		t.Fatalf("%s: shares %v sum to %.17g > 1", what, f, sum)
	}
}

// Shares sum to at most 1 and none is below the floor, for any demand: the
// split on its own, over random region counts, floors and demand vectors
// (zeros, ties, values from 1e-300 to 1e300).
func TestSplitSumsToAtMostOne(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	for i := range 50_000 {
		R := 1 + rng.IntN(12)
		floor := rng.Float64() / float64(R) * 0.999
		s, err := New(Options{Regions: names(R), Floor: floor})
		if err != nil {
			t.Fatal(err)
		}
		d := make([]float64, R)
		for j := range d {
			switch rng.IntN(5) {
			case 0: // silent
			case 1:
				d[j] = math.Ldexp(rng.Float64(), rng.IntN(2000)-1000)
			case 2:
				d[j] = float64(rng.IntN(3)) // ties
			default:
				d[j] = rng.Float64() * 1e6
			}
		}
		checkSet(t, fmt.Sprintf("case %d: %d regions, floor %v, demand %v", i, R, floor, d), s.split(d), s.o.Floor)
	}
}

func names(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("r%d", i)
	}
	return out
}

// The same property end to end through the stage: every set of shares a key
// gets written, interval after interval of random demand over several keys,
// regions going silent and coming back, sums to at most 1.
func TestWrittenSharesSumToAtMostOne(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 9))
	for run := range 8 {
		R := 2 + rng.IntN(6)
		reg := names(R)
		floor := rng.Float64() / float64(R) * 0.9
		g := &rules.Rule{ID: "g", Match: []rules.Match{{Key: rules.KeyAPIKey}}, Limit: 100, Period: time.Second, Burst: 100, Global: true}
		s, err := New(Options{Regions: reg, Rules: []*rules.Rule{g}, Floor: floor, Alpha: 0.2 + 0.8*rng.Float64(), MinDemand: 5})
		if err != nil {
			t.Fatal(err)
		}
		l := stage.NewLocal([]stage.Stage{s}, 2, 0)
		iv := s.o.Interval
		written := 0
		for i := range 25 {
			start := t0.Add(time.Duration(i) * iv)
			for j := range 200 {
				r := rng.IntN(R)
				if i%7 > 3 && r == 0 {
					continue // region 0 goes silent for a while
				}
				l.Observe(j, &decisionpb.Decision{Version: 1, Region: reg[r], Cost: uint32(1 + rng.IntN(3)),
					Outcome: decisionpb.Outcome_OUTCOME_ALLOWED, EventTimeMs: start.Add(time.Duration(j) * iv / 200).UnixMilli(),
					Descriptors: &decisionpb.Descriptors{ApiKey: fmt.Sprintf("k%d", rng.IntN(4))}})
			}
			sets := map[string][]float64{}
			for _, sh := range l.Advance(start.Add(iv)).Shares {
				k := sh.RuleID + "|" + sh.Key
				if len(sets[k]) != reg2idx(reg, sh.Region) {
					t.Fatalf("run %d: shares of %s not written together, in region order", run, k)
				}
				sets[k] = append(sets[k], sh.Fraction)
			}
			for k, f := range sets {
				if len(f) != R {
					t.Fatalf("run %d: %s: %d of %d regions written", run, k, len(f), R)
				}
				checkSet(t, fmt.Sprintf("run %d interval %d key %s", run, i, k), f, s.o.Floor)
				written++
			}
		}
		if written == 0 {
			t.Fatalf("run %d: nothing written", run)
		}
	}
}

func reg2idx(reg []string, r string) int {
	for i, x := range reg {
		if x == r {
			return i
		}
	}
	return -1
}

// A region that goes silent keeps its floor and the others reclaim the rest:
// after Options.Silent intervals without demand (2), its share is exactly the
// floor, well within the target of 5 intervals.
func TestSilentRegionFallsToItsFloor(t *testing.T) {
	s, err := New(Options{Regions: regions, Rules: []*rules.Rule{global}})
	if err != nil {
		t.Fatal(err)
	}
	l := stage.NewLocal([]stage.Stage{s}, 3, time.Minute)
	iv := s.o.Interval
	feed := func(i int, n [3]int) map[string]float64 {
		start := t0.Add(time.Duration(i) * iv)
		for r, c := range n {
			for j := range c {
				l.Observe(j, &decisionpb.Decision{Version: 1, Region: regions[r], Outcome: decisionpb.Outcome_OUTCOME_DENIED,
					EventTimeMs: start.Add(time.Duration(j) * iv / time.Duration(c)).UnixMilli(),
					Descriptors: &decisionpb.Descriptors{ApiKey: "hot"}})
			}
		}
		return keyShares(l.Advance(start.Add(iv)).Shares, "hot")
	}
	var last map[string]float64
	for i := range 4 {
		if got := feed(i, [3]int{700, 150, 150}); len(got) > 0 {
			last = got
		}
	}
	if last["a"] < 0.6 {
		t.Fatalf("region a's share %v with 70%% of the demand", last)
	}
	// Region a is lost: its demand stops.
	var at int
	for i := 4; i < 9; i++ {
		got := feed(i, [3]int{0, 150, 150})
		if len(got) > 0 {
			last = got
		}
		if last["a"] == s.o.Floor && at == 0 {
			at = i - 3
		}
	}
	if at == 0 || at > s.o.Silent {
		t.Fatalf("region a fell to its floor after %d intervals (0: never), want %d: %v", at, s.o.Silent, last)
	}
	if math.Abs(last["b"]-0.475) > 1e-9 || math.Abs(last["c"]-0.475) > 1e-9 {
		t.Errorf("regions b and c did not reclaim a's share: %v", last)
	}
	// It comes back: its share rises again at once.
	if got := feed(9, [3]int{700, 150, 150}); got["a"] < 0.5 {
		t.Errorf("region a back with 70%% of the demand: %v", got)
	}
}

// The long tail's split can come from configuration: the rule's default
// share is then the configured one whatever the traffic, and heavy keys still
// follow their own demand.
func TestDefaultSplitFromConfig(t *testing.T) {
	split := map[string]float64{"a": 0.5, "b": 0.3, "c": 0.2}
	s, err := New(Options{Regions: regions, Rules: []*rules.Rule{global}, DefaultSplit: split})
	if err != nil {
		t.Fatal(err)
	}
	l := stage.NewLocal([]stage.Stage{s}, 1, 0)
	for j := range 100 {
		l.Observe(0, &decisionpb.Decision{Version: 1, Region: "c", Outcome: decisionpb.Outcome_OUTCOME_ALLOWED,
			EventTimeMs: t0.Add(time.Duration(j) * time.Millisecond).UnixMilli(), Descriptors: &decisionpb.Descriptors{ApiKey: "hot"}})
	}
	out := l.Advance(t0.Add(s.o.Interval)).Shares
	def := map[string]float64{}
	for _, sh := range out {
		if sh.Key == "" {
			def[sh.Region] = sh.Fraction
		}
	}
	for r, f := range split {
		if def[r] != f {
			t.Errorf("default share of %s: %v, configured %v", r, def[r], f)
		}
	}
	if hot := keyShares(out, "hot"); hot["c"] < 0.89 {
		t.Errorf("the heavy key's shares do not follow its demand (all in c): %v", hot)
	}
	for _, bad := range []map[string]float64{{"a": 0.6, "b": 0.6}, {"x": 0.1}, {"a": -0.1}, {"a": math.NaN()}} {
		if _, err := New(Options{Regions: regions, DefaultSplit: bad}); err == nil {
			t.Errorf("default split %v accepted", bad)
		}
	}
	if _, err := New(Options{Regions: []string{"a", "a"}}); err == nil {
		t.Error("a region named twice accepted")
	}
}

// Partials and state that are not the stage's are refused, never a panic.
func TestSharesRefuseForeignBytes(t *testing.T) {
	s, err := New(Options{Regions: regions, Rules: []*rules.Rule{global}})
	if err != nil {
		t.Fatal(err)
	}
	p := s.NewPartial()
	p.Observe(&decisionpb.Decision{Version: 1, Region: "a", EventTimeMs: 1, Descriptors: &decisionpb.Descriptors{ApiKey: "k"}})
	b, err := p.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	for i := range len(b) {
		if _, err := s.DecodePartial(b[:i]); err == nil {
			t.Fatalf("a partial cut at %d of %d bytes decoded", i, len(b))
		}
	}
	back, err := s.DecodePartial(b)
	if err != nil {
		t.Fatal(err)
	}
	// A partial of another shape (2 regions) merges with an error and
	// finishes as nothing.
	two, _ := New(Options{Regions: []string{"a", "b"}, Rules: []*rules.Rule{global}})
	q := two.NewPartial()
	if err := back.Merge(q); err == nil {
		t.Error("a partial of 2 regions merged into one of 3")
	}
	if out := s.Finish(stage.Window{End: t0}, q); len(out.Shares) != 0 {
		t.Errorf("a foreign partial produced %v", out)
	}
	for _, st := range [][]byte{{1}, {1, 0}, {0xff, 0xff, 0xff, 0xff, 0x0f}} {
		if err := s.UnmarshalState(st); err == nil {
			t.Errorf("state %x accepted", st)
		}
	}
}

// A partial's count-min travels sparse: it decodes to the same estimates,
// and an interval's worth of records takes a fraction of the dense 106 KiB
// per rule.
func TestPartialCountMinIsSparse(t *testing.T) {
	s, err := New(Options{Regions: benchRegions, Rules: benchRules()})
	if err != nil {
		t.Fatal(err)
	}
	p := s.NewPartial()
	recs := benchRecords(500)
	for _, r := range recs {
		p.Observe(r)
	}
	b, err := p.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	dense := len(s.global) * (countMinHeader + 8*13_595)
	if len(b) > dense/4 {
		t.Errorf("500 records over 4 rules encode to %d bytes, more than a quarter of the dense count-mins' %d", len(b), dense)
	}
	back, err := s.DecodePartial(b)
	if err != nil {
		t.Fatal(err)
	}
	for i, rd := range p.(*interval).rules {
		got := back.(*interval).rules[i]
		if got.cms.Total() != rd.cms.Total() || !slices.Equal(got.totals, rd.totals) {
			t.Fatalf("rule %d: totals differ after the round trip", i)
		}
		for _, it := range rd.top.List() {
			h := sketch.Hash64(it.Key)
			for j := range benchRegions {
				if a, b := rd.cms.Estimate(s.regionHash(h, j)), got.cms.Estimate(s.regionHash(h, j)); a != b {
					t.Fatalf("rule %d key %s region %d: estimate %d, %d after the round trip", i, it.Key, j, a, b)
				}
			}
		}
	}
	// A full sketch round-trips too.
	q := s.NewPartial()
	for _, r := range benchRecords(1 << 16) {
		q.Observe(r)
	}
	full, err := q.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.DecodePartial(full); err != nil {
		t.Fatal(err)
	}
}

// FuzzSharesPartial: DecodePartial returns an error, never panics, on any
// bytes, and what it accepts encodes again.
func FuzzSharesPartial(f *testing.F) {
	s, err := New(Options{Regions: regions, Rules: []*rules.Rule{global}})
	if err != nil {
		f.Fatal(err)
	}
	p := s.NewPartial()
	for i := range 50 {
		p.Observe(&decisionpb.Decision{Version: 1, Region: regions[i%3], EventTimeMs: 1, Descriptors: &decisionpb.Descriptors{ApiKey: fmt.Sprint(i % 7)}})
	}
	b, err := p.MarshalBinary()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte{1})
	f.Fuzz(func(t *testing.T, b []byte) {
		x, err := s.DecodePartial(b)
		if err != nil {
			return
		}
		if _, err := x.MarshalBinary(); err != nil {
			t.Fatalf("a decoded partial does not encode: %v", err)
		}
		s.Finish(stage.Window{End: t0}, x)
	})
}

// A key that stops being heavy is not silent: its demand is no longer
// measured, so its shares keep their last proportions while it decays, until
// it retires, rather than falling to the even split.
func TestFadingKeyKeepsItsProportions(t *testing.T) {
	s, err := New(Options{Regions: regions, Rules: []*rules.Rule{global}})
	if err != nil {
		t.Fatal(err)
	}
	l := stage.NewLocal([]stage.Stage{s}, 1, time.Minute)
	iv := s.o.Interval
	tag := rules.EntityTag(global, &rules.Descriptors{rules.KeyAPIKey: "hot"})
	for i := range 8 {
		n := [3]int{700, 150, 150}
		if i >= 3 {
			n = [3]int{5, 0, 0} // below MinDemand: out of the heavy keys
		}
		start := t0.Add(time.Duration(i) * iv)
		for r, c := range n {
			for j := range c {
				l.Observe(0, &decisionpb.Decision{Version: 1, Region: regions[r], Outcome: decisionpb.Outcome_OUTCOME_ALLOWED,
					EventTimeMs: start.Add(time.Duration(r*c+j) * iv / 1200).UnixMilli(), Descriptors: &decisionpb.Descriptors{ApiKey: "hot"}})
			}
		}
		for _, sh := range l.Advance(start.Add(iv)).Shares {
			if sh.Key == tag && i >= 3 && sh.Region == "a" && sh.Fraction < 0.6 {
				t.Errorf("interval %d: the fading key's share in a fell to %v", i, sh.Fraction)
			}
		}
		if w := s.written[global.ID+"|"+tag]; i >= 3 && (w == nil || w.f[0] < 0.6) {
			t.Fatalf("interval %d: the fading key's shares are %+v, want a's above 0.6", i, w)
		}
	}
}
