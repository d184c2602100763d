package enforcer_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

const quotaRules = `
domain: q
rules:
  - {id: daily, match: [{key: api_key}], algorithm: fixed_window, calendar: day, limit: 100, global: true, g_counter: true}
`

// fakeClock is an injectable clock for Options.Clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }

// region is one region of a G-Counter test: its Redis and limiter.
type region struct {
	name string
	rdb  *redis.Client
	l    *enforcer.Limiter
}

func newRegions(t *testing.T, yaml string, clock *fakeClock, names ...string) []*region {
	t.Helper()
	var rs []*region
	for _, n := range names {
		rdb := redistest.Server(t)
		l, err := enforcer.New(rdb, mustSet(t, yaml), enforcer.Options{Region: n, Regions: len(names), Clock: clock.now, Budget: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, &region{n, rdb, l})
	}
	return rs
}

// exchange sends every region's counts to every other region, as the
// publisher and the appliers do through Kafka.
func exchange(t *testing.T, rs []*region, now time.Time) {
	t.Helper()
	ctx := context.Background()
	var all []decision.QuotaCount
	for _, r := range rs {
		qs, err := r.l.QuotaCounts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, qs...)
	}
	for _, r := range rs {
		if _, err := enforcer.MergeQuotaCounts(ctx, r.rdb, r.name, all, now); err != nil {
			t.Fatal(err)
		}
	}
}

// quotaCheck decides one request of cost 1 for key in region r.
func quotaCheck(t *testing.T, r *region, key string) enforcer.Decision {
	t.Helper()
	var req enforcer.Request
	req.Descriptors[rules.KeyAPIKey] = key
	d, err := r.l.Check(context.Background(), &req)
	if err != nil || d.Err != nil {
		t.Fatal(err, d.Err)
	}
	return d
}

// counts returns a window's hash of per-region counts in rdb.
func counts(t *testing.T, rdb *redis.Client, key string) map[string]int64 {
	t.Helper()
	h, err := rdb.HGetAll(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for k, v := range h {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("%s: field %s = %q", key, k, v)
		}
		out[k] = n
	}
	return out
}

// TestGCounterMergeIsElementWiseMax merges the same updates into two
// redis-servers in different orders, with redeliveries and stale updates
// mixed in: both end with the element-wise maximum, a stale or repeated
// update never lowers a count (and raises nothing), and a region's own
// count is never written from outside.
func TestGCounterMergeIsElementWiseMax(t *testing.T) {
	ctx := context.Background()
	x, y := redistest.Server(t), redistest.Server(t)
	day := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	now := day.Add(time.Hour)
	tag := fmt.Sprintf("%032x", 42)
	q := func(region string, n int64) decision.QuotaCount {
		return decision.QuotaCount{Rule: "daily", Tag: tag, Window: day, End: day.Add(24 * time.Hour), Region: region, Count: n}
	}
	var updates []decision.QuotaCount
	want := map[string]int64{}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, region := range []string{"b", "c", "d"} {
		for n := int64(1); n <= 20; n++ { // a region's counts only grow
			updates = append(updates, q(region, n*int64(1+rng.IntN(3))))
			want[region] = max(want[region], updates[len(updates)-1].Count)
		}
	}
	updates = append(updates, q("a", 999)) // x's and y's own region: never merged
	shuffled := append([]decision.QuotaCount(nil), updates...)
	rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	key := enforcer.QuotaKey(&updates[0])
	if _, err := x.HSet(ctx, key, "a", 7).Result(); err != nil {
		t.Fatal(err)
	}
	y.HSet(ctx, key, "a", 7)
	if _, err := enforcer.MergeQuotaCounts(ctx, x, "a", updates, now); err != nil {
		t.Fatal(err)
	}
	for i := range shuffled { // one at a time, in another order
		if _, err := enforcer.MergeQuotaCounts(ctx, y, "a", shuffled[i:i+1], now); err != nil {
			t.Fatal(err)
		}
	}
	want["a"] = 7
	for name, rdb := range map[string]*redis.Client{"in order": x, "shuffled": y} {
		if got := counts(t, rdb, key); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: counts %v, want the element-wise maximum %v", name, got, want)
		}
	}
	// Redelivery of everything, and stale counts below the merged ones:
	// nothing is raised, nothing lowered.
	stale := []decision.QuotaCount{q("b", 0), q("c", 1), q("d", want["d"]-1)}
	for _, batch := range [][]decision.QuotaCount{updates, shuffled, stale} {
		n, err := enforcer.MergeQuotaCounts(ctx, x, "a", batch, now)
		if err != nil || n != 0 {
			t.Errorf("redelivered or stale counts raised %d fields (err %v), want 0", n, err)
		}
	}
	if got := counts(t, x, key); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after redelivery: %v, want %v", got, want)
	}
	if ttl := x.PTTL(ctx, key).Val(); ttl <= 23*time.Hour || ttl > 23*time.Hour+time.Minute {
		t.Errorf("TTL %v, want to the window's end (23 h from now) plus a minute", ttl)
	}
	// A window long ended is not recreated; invalid counts are refused by
	// name and the valid ones of the batch still merged.
	old := q("b", 5)
	old.Window, old.End = day.Add(-48*time.Hour), day.Add(-24*time.Hour)
	bad := q("b", 3)
	bad.Tag = "{not-a-tag}"
	n, err := enforcer.MergeQuotaCounts(ctx, x, "a", []decision.QuotaCount{old, bad, q("e", 4)}, now)
	if err == nil || n != 1 {
		t.Errorf("merged %d (err %v): want the one valid count merged and the bad tag named", n, err)
	}
	if x.Exists(ctx, enforcer.QuotaKey(&old)).Val() != 0 {
		t.Error("a count of a window that ended a day ago created its key")
	}
}

// TestGCounterThreeRegions runs a daily quota of 100 in three regions:
// each counts only its own requests; after an exchange every region's
// merged count is the sum of the three; a region then admits only what is
// left of the global quota and denies once the merged count reaches it,
// for the rest of the window.
func TestGCounterThreeRegions(t *testing.T) {
	clock := &fakeClock{t: time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)}
	rs := newRegions(t, quotaRules, clock, "a", "b", "c")
	const key = "k-1"
	sent := map[string]int{"a": 40, "b": 30, "c": 20}
	for _, r := range rs {
		for range sent[r.name] {
			if d := quotaCheck(t, r, key); d.Outcome != decision.Allowed {
				t.Fatalf("region %s: %v before the quota was reached", r.name, d.Outcome)
			}
		}
	}
	daily := rs[0].l.Rules().Rule("daily")
	var desc rules.Descriptors
	desc[rules.KeyAPIKey] = key
	day := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	hkey := enforcer.QuotaKey(&decision.QuotaCount{Rule: "daily", Tag: rules.EntityTag(daily, &desc), Window: day})
	for _, r := range rs { // before the exchange: each region knows its own count only
		if got := counts(t, r.rdb, hkey); len(got) != 1 || got[r.name] != int64(sent[r.name]) {
			t.Errorf("region %s before the exchange: %v", r.name, got)
		}
	}
	exchange(t, rs, clock.now())
	for _, r := range rs {
		got := counts(t, r.rdb, hkey)
		sum := int64(0)
		for _, n := range got {
			sum += n
		}
		if len(got) != 3 || sum != 90 {
			t.Errorf("region %s after the exchange: %v, sum %d; want the three counts, sum 90", r.name, got, sum)
		}
		if got[r.name] != int64(sent[r.name]) {
			t.Errorf("region %s: own count %d, want %d", r.name, got[r.name], sent[r.name])
		}
	}
	// 10 left globally: region c takes them, then every region denies.
	for i := range 10 {
		if d := quotaCheck(t, rs[2], key); d.Outcome != decision.Allowed || d.Remaining != int64(9-i) {
			t.Fatalf("region c, request %d of the last 10: %v remaining %d", i, d.Outcome, d.Remaining)
		}
	}
	exchange(t, rs, clock.now())
	for _, r := range rs {
		d := quotaCheck(t, r, key)
		if d.Outcome != decision.Denied || d.Rule == nil || d.Rule.ID != "daily" || d.Reason != decision.ReasonOverLimit {
			t.Errorf("region %s at the global quota: %v by %v (%v), want denied by daily", r.name, d.Outcome, d.Rule, d.Reason)
		}
		if want := 15 * time.Hour; d.Wait != want { // until 00:00 UTC
			t.Errorf("region %s: wait %v, want %v (the window's end, midnight UTC)", r.name, d.Wait, want)
		}
	}
}

// TestGCounterRollsOverAtMidnightUTC spends a daily quota one millisecond
// before midnight UTC and checks that the next millisecond, the first of
// the next day, starts a fresh count (a new window, a new key), on the
// limiter's clock; and that a monthly quota rolls over on the 1st.
func TestGCounterRollsOverAtMidnightUTC(t *testing.T) {
	for _, c := range []struct {
		name, calendar string
		boundary       time.Time
	}{
		{"day", "day", time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)},
		{"month", "month", time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock := &fakeClock{t: c.boundary.Add(-time.Millisecond)}
			rs := newRegions(t, `
domain: q
rules:
  - {id: quota, match: [{key: api_key}], algorithm: fixed_window, calendar: `+c.calendar+`, limit: 3, global: true, g_counter: true}
`, clock, "a", "b")
			a, b := rs[0], rs[1]
			for range 2 {
				quotaCheck(t, a, "k")
			}
			quotaCheck(t, b, "k")
			exchange(t, rs, clock.now())
			if d := quotaCheck(t, a, "k"); d.Outcome != decision.Denied || d.Wait != time.Millisecond {
				t.Fatalf("last ms of the window: %v wait %v, want denied for 1 ms", d.Outcome, d.Wait)
			}
			clock.set(c.boundary)
			for i := range 3 {
				if d := quotaCheck(t, a, "k"); d.Outcome != decision.Allowed {
					t.Fatalf("first ms of the next window, request %d: %v", i, d.Outcome)
				}
			}
			if d := quotaCheck(t, a, "k"); d.Outcome != decision.Denied {
				t.Errorf("the new window's quota: %v, want denied after 3", d.Outcome)
			}
			qs, err := a.l.QuotaCounts(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if len(qs) != 1 || !qs[0].Window.Equal(c.boundary) || qs[0].Count != 3 || qs[0].Region != "a" {
				t.Errorf("counts after the rollover: %+v, want one of 3 in the window starting %s", qs, c.boundary)
			}
		})
	}
}

// TestGCounterRefund checks that a G-Counter's own count is given back when
// another part of the decision denies: here a pinned rule whose home is
// another region.
func TestGCounterRefund(t *testing.T) {
	clock := &fakeClock{t: time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)}
	la, _, ra, _ := twoRegions(t, `
domain: q
rules:
  - {id: daily, match: [{key: api_key}], algorithm: fixed_window, calendar: day, limit: 100, global: true, g_counter: true}
  - {id: paid, match: [{key: api_key}], limit: 2, period: 1h, global: true, pinned: true}
`, enforcer.Options{Budget: time.Second, Clock: clock.now})
	k := keysHomedIn(t, la.Rules().Rule("paid"), "b", []string{"a", "b"}, 1)[0]
	var outcomes []string
	for range 4 {
		var req enforcer.Request
		req.Descriptors[rules.KeyAPIKey] = k
		d, err := la.Check(context.Background(), &req)
		if err != nil || d.Err != nil {
			t.Fatal(err, d.Err)
		}
		outcomes = append(outcomes, d.Outcome.String())
	}
	if fmt.Sprint(outcomes) != "[allowed allowed denied denied]" {
		t.Errorf("outcomes %v", outcomes)
	}
	var desc rules.Descriptors
	desc[rules.KeyAPIKey] = k
	day := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	hkey := enforcer.QuotaKey(&decision.QuotaCount{Rule: "daily", Tag: rules.EntityTag(la.Rules().Rule("daily"), &desc), Window: day})
	if got := counts(t, ra, hkey); got["a"] != 2 {
		t.Errorf("own count %v, want 2: the two denied requests refunded", got)
	}
}

// TestGCounterInProcess runs a G-Counter quota on both backends (the
// in-process Redis of embedded mode too): each region's own field counts,
// merged fields count against the limit.
func TestGCounterInProcess(t *testing.T) {
	backends(t, func(t *testing.T, rdb redis.UniversalClient) {
		clock := &fakeClock{t: time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)}
		l, err := enforcer.New(rdb, mustSet(t, quotaRules), enforcer.Options{Region: "a", Regions: 2, Clock: clock.now, Budget: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		r := &region{name: "a", l: l}
		for range 5 {
			quotaCheck(t, r, "k")
		}
		qs, err := l.QuotaCounts(context.Background())
		if err != nil || len(qs) != 1 || qs[0].Count != 5 {
			t.Fatalf("counts %+v, %v", qs, err)
		}
		other := qs[0]
		other.Region, other.Count = "b", 94
		if _, err := enforcer.MergeQuotaCounts(context.Background(), rdb, "a", []decision.QuotaCount{other}, clock.now()); err != nil {
			t.Fatal(err)
		}
		var outs []string
		for range 2 {
			outs = append(outs, quotaCheck(t, r, "k").Outcome.String())
		}
		if fmt.Sprint(outs) != "[allowed denied]" {
			t.Errorf("with 5 here and 94 merged from b: %v, want one allowed then denied", outs)
		}
	})
}

// TestGCounterOvershootBound checks the bound docs/enforcement.md gives:
// between two exchanges each region admits against a stale view of the
// others, so the global count can pass the quota L by at most what the
// regions other than the last one admit in one exchange interval,
// ·m for R regions admitting at most m each per interval, and never
// falls short of L while there is demand. Three regions, L = 100, demand
// shifting from region to region, an exchange after each round.
func TestGCounterOvershootBound(t *testing.T) {
	for _, m := range []int{2, 7, 30} {
		t.Run(fmt.Sprintf("m=%d", m), func(t *testing.T) {
			clock := &fakeClock{t: time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)}
			rs := newRegions(t, quotaRules, clock, "a", "b", "c")
			total := 0
			for round := 0; round < 5+200/(m+m/2); round++ { // demand twice the quota
				for ri, r := range rs {
					// A region's demand this round: m, m/2 or none, rotating.
					n := [3]int{m, m / 2, 0}[(ri+round)%3]
					for range n {
						if quotaCheck(t, r, "k").Outcome == decision.Allowed {
							total++
						}
					}
				}
				exchange(t, rs, clock.now())
			}
			if bound := 100 + 2*m; total < 100 || total > bound {
				t.Errorf("%d admitted in all; want from the quota, 100, to 100 + (R-1)·m = %d", total, bound)
			}
			t.Logf("m=%d: %d admitted against a quota of 100 (bound %d)", m, total, 100+2*m)
		})
	}
}

// BenchmarkGCounterCheck decides one request against a daily G-Counter
// quota whose window holds the counts of 1 or 5 regions (this one's and
// merged ones), beside a plain fixed window on the same key for
// comparison: time and allocations per decision, back to back.
func BenchmarkGCounterCheck(b *testing.B) {
	for _, c := range []struct {
		name    string
		yaml    string
		regions int
	}{
		{"fixed_window", `{id: q, match: [{key: api_key}], algorithm: fixed_window, calendar: day, limit: 1000000000}`, 1},
		{"g_counter/regions=1", `{id: q, match: [{key: api_key}], algorithm: fixed_window, calendar: day, limit: 1000000000, global: true, g_counter: true}`, 1},
		{"g_counter/regions=5", `{id: q, match: [{key: api_key}], algorithm: fixed_window, calendar: day, limit: 1000000000, global: true, g_counter: true}`, 5},
	} {
		b.Run(c.name, func(b *testing.B) {
			rdb := redistest.Server(b)
			set, err := rules.Parse("b.yaml", []byte("domain: b\nrules:\n  - "+c.yaml+"\n"))
			if err != nil {
				b.Fatal(err)
			}
			l, err := enforcer.New(rdb, set, enforcer.Options{Region: "r0", Regions: c.regions, Budget: time.Second, HotKeys: enforcer.HotKeyOptions{Table: -1}})
			if err != nil {
				b.Fatal(err)
			}
			var req enforcer.Request
			req.Descriptors[rules.KeyAPIKey] = "k"
			ctx := context.Background()
			var d enforcer.Decision
			if err := l.Decide(ctx, &req, &d); err != nil || d.Err != nil {
				b.Fatal(err, d.Err)
			}
			if qs, _ := l.QuotaCounts(ctx); len(qs) == 1 {
				var merged []decision.QuotaCount
				for r := 1; r < c.regions; r++ {
					q := qs[0]
					q.Region, q.Count = fmt.Sprintf("r%d", r), 1000
					merged = append(merged, q)
				}
				if _, err := enforcer.MergeQuotaCounts(ctx, rdb, "r0", merged, time.Now()); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if err := l.Decide(ctx, &req, &d); err != nil || d.Err != nil || d.Outcome != decision.Allowed {
					b.Fatal(err, d.Err, d.Outcome)
				}
			}
		})
	}
}
