package enforcer_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

// Hot keys: the deny cache, leases and split keys, and shadow mode on every
// decision path. Times are the caller's (Request.Now).

func hotLimiter(t *testing.T, rdb redis.UniversalClient, yaml string, o enforcer.Options) *enforcer.Limiter {
	t.Helper()
	if o.Budget == 0 {
		o.Budget = time.Second
	}
	l, err := enforcer.New(rdb, mustSet(t, yaml), o)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func userReq(ms int64, cost uint32, u string) *enforcer.Request {
	r := &enforcer.Request{Now: at(ms), Cost: cost}
	r.Descriptors[rules.KeyUser] = u
	return r
}

func TestDenyCache(t *testing.T) {
	backends(t, func(t *testing.T, rdb redis.UniversalClient) {
		// 1 token a second, burst 2; leases off so that only the cache acts.
		l := hotLimiter(t, rdb, "domain: d\nrules: [{id: r, match: [{key: user}], limit: 1, period: 1s, burst: 2}]",
			enforcer.Options{HotKeys: enforcer.HotKeyOptions{Rate: -1}})
		decide(t, l, userReq(0, 2, "u"))
		d := decide(t, l, userReq(0, 1, "u"))
		if d.Outcome != decision.Denied || d.Path != decision.PathRedis || d.Wait != time.Second {
			t.Fatalf("got %v on %v wait %v, want denied by Redis with a 1 s wait", d.Outcome, d.Path, d.Wait)
		}
		trips := l.RoundTrips()
		full := d.Reset // 2 s to a full bucket of 2
		for ms := int64(1); ms < 1000; ms += 111 {
			d = decide(t, l, userReq(ms, 1, "u"))
			want := time.Duration(1000-ms) * time.Millisecond
			if wantReset := full - time.Duration(ms)*time.Millisecond; d.Reset != wantReset {
				// The headers' reset must not jump with the path taken.
				t.Errorf("at %d: reset %v from the cache, want %v (Redis's, counted down)", ms, d.Reset, wantReset)
			}
			if d.Outcome != decision.Denied || d.Path != decision.PathDenyCache || d.Wait != want || d.RetryAfter != time.Second || d.Remaining != 0 || d.Rule.ID != "r" {
				t.Fatalf("at %d: got %v on %v wait %v retry %v remaining %d; want denied from the cache, wait %v",
					ms, d.Outcome, d.Path, d.Wait, d.RetryAfter, d.Remaining, want)
			}
		}
		if n := l.RoundTrips() - trips; n != 0 {
			t.Errorf("%d Redis round trips while the key was known to be empty, want 0", n)
		}
		// Another cost is not known: Redis decides it.
		if d = decide(t, l, userReq(500, 2, "u")); d.Path != decision.PathRedis || d.Outcome != decision.Denied {
			t.Errorf("cost 2: got %v on %v, want denied by Redis", d.Outcome, d.Path)
		}
		// At the wait's end Redis is asked again, and allows.
		if d = decide(t, l, userReq(1000, 1, "u")); d.Path != decision.PathRedis || d.Outcome != decision.Allowed {
			t.Errorf("at the wait's end: got %v on %v, want allowed by Redis", d.Outcome, d.Path)
		}
	})
}

// A request that consumes from a key makes its cached waits for other costs
// stale: they are dropped, not served.
func TestDenyCacheDropsStaleWaits(t *testing.T) {
	l := hotLimiter(t, redistest.Server(t), "domain: d\nrules: [{id: r, match: [{key: user}], limit: 1, period: 1s, burst: 3}]",
		enforcer.Options{HotKeys: enforcer.HotKeyOptions{Rate: -1}})
	decide(t, l, userReq(0, 2, "u"))      // 1 left
	d := decide(t, l, userReq(0, 3, "u")) // denied: 2 s to 3 tokens
	if d.Outcome != decision.Denied || d.Wait != 2*time.Second {
		t.Fatalf("got %v wait %v, want denied with 2 s", d.Outcome, d.Wait)
	}
	decide(t, l, userReq(10, 1, "u")) // takes the last token: 3 tokens are now 2.99 s away
	d = decide(t, l, userReq(20, 3, "u"))
	if d.Path != decision.PathRedis || d.Wait != 2980*time.Millisecond {
		t.Errorf("got %v wait %v, want Redis's own wait of 2.98 s, not the cache's 1.98 s", d.Path, d.Wait)
	}
}

// A hot key's tokens are taken in blocks and served locally: far fewer
// Redis calls, the same number of requests allowed (within the block), and
// a request that needs more than the block holds is decided as if there
// were no leases.
func TestLeases(t *testing.T) {
	const rules = "domain: d\nrules: [{id: r, match: [{key: user}], limit: 1000, period: 1s}]"
	run := func(t *testing.T, o enforcer.Options) (allowed int, trips uint64, l *enforcer.Limiter) {
		l = hotLimiter(t, redistest.Server(t), rules, o)
		// 2 000 requests a second for 2 s: twice the limit.
		for i := int64(0); i < 4000; i++ {
			d := decide(t, l, userReq(i/2, 1, "hot"))
			if d.Outcome == decision.Allowed {
				allowed++
			}
		}
		return allowed, l.RoundTrips(), l
	}
	plainAllowed, plainTrips, _ := run(t, enforcer.Options{HotKeys: enforcer.HotKeyOptions{Table: -1}})
	leaseAllowed, leaseTrips, l := run(t, enforcer.Options{})
	t.Logf("without leases: %d allowed, %d round trips; with: %d allowed, %d round trips", plainAllowed, plainTrips, leaseAllowed, leaseTrips)
	if plainTrips < 10*leaseTrips {
		t.Errorf("leases made %d round trips against %d: want at least 10x fewer", leaseTrips, plainTrips)
	}
	// One instance holds at most one block (50): it may serve up to that
	// many late, never more than the limit allows plus the block.
	if leaseAllowed > plainAllowed+50 || leaseAllowed < plainAllowed-50 {
		t.Errorf("leases allowed %d, without %d: want within one block (50)", leaseAllowed, plainAllowed)
	}
	// A request costing more than the lease holds: the lease goes back to
	// Redis with it, and it is decided exactly.
	d := decide(t, l, userReq(5000, 1000, "hot"))
	if d.Outcome != decision.Allowed || d.Path != decision.PathRedis || d.Remaining != 0 {
		t.Errorf("cost 1000 after 3 s idle: got %v on %v remaining %d, want allowed by Redis with 0 left", d.Outcome, d.Path, d.Remaining)
	}
}

// Several instances leasing one key stay within limit + block × instances.
func TestLeaseOvershootBound(t *testing.T) {
	rdb := redistest.Server(t)
	const yaml = "domain: d\nrules: [{id: r, match: [{key: user}], limit: 500, period: 1s}]"
	var ls []*enforcer.Limiter
	for i := range 4 {
		ls = append(ls, hotLimiter(t, rdb, yaml, enforcer.Options{Instance: fmt.Sprint(i), HotKeys: enforcer.HotKeyOptions{Rate: 10}}))
	}
	allowed := 0
	// 4 000 requests a second over 1 s, round robin: the bucket starts full
	// (500) and refills 500 in the second.
	for i := int64(0); i < 4000; i++ {
		if d := decide(t, ls[i%4], userReq(i/4, 1, "hot")); d.Outcome.Allow() {
			allowed++
		}
	}
	bound := 500 + 500 + 50*4
	t.Logf("%d allowed in 1 s by 4 leasing instances; bucket 500 + refill 500 + 4 blocks of 50 = %d", allowed, bound)
	if allowed > bound {
		t.Errorf("%d allowed, more than the bound %d", allowed, bound)
	}
	if allowed < 900 {
		t.Errorf("%d allowed: leases under-serve by more than two blocks", allowed)
	}
}

// A key the pipeline marks split is counted in N sub-keys of limit/N, the
// sub-key chosen by the instance.
func TestSplitKeys(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	const yaml = "domain: d\nrules: [{id: r, match: [{key: tenant}], limit: 40, period: 1h}]"
	set := mustSet(t, yaml)
	tag := rules.EntityTag(set.Rule("r"), &rules.Descriptors{rules.KeyTenant: "big"})
	if err := store.NewStore(rdb).PutHotKeys(ctx, []rules.HotKey{{RuleID: "r", Key: tag, Split: 4, ExpiresAt: at(3_600_000)}}); err != nil {
		t.Fatal(err)
	}
	tenant := func(ms int64) *enforcer.Request {
		r := &enforcer.Request{Now: at(ms)}
		r.Descriptors[rules.KeyTenant] = "big"
		return r
	}
	for _, inst := range []string{"0", "1", "5"} { // 5 % 4 = 1: instance 1's sub-key
		l := hotLimiter(t, rdb, yaml, enforcer.Options{Instance: inst, HotKeys: enforcer.HotKeyOptions{Table: -1}})
		if err := l.Refresh(ctx, at(0)); err != nil {
			t.Fatal(err)
		}
		d := decide(t, l, tenant(0))
		want := int64(9)
		if inst == "5" {
			want = 8 // instance 1 took one already
		}
		if d.Limit != 10 || d.Remaining != want {
			t.Errorf("instance %s: limit %d remaining %d, want 10 and %d (a quarter of 40, on sub-key %s)", inst, d.Limit, d.Remaining, want, inst)
		}
	}
	keys, _ := rdb.Keys(ctx, "sl:*").Result()
	if len(keys) != 2 || !strings.HasSuffix(keys[0], ":s0") && !strings.HasSuffix(keys[0], ":s1") {
		t.Errorf("keys %v, want sub-keys s0 and s1", keys)
	}
	// Unsplit once the mark expires.
	l := hotLimiter(t, rdb, yaml, enforcer.Options{Instance: "0", HotKeys: enforcer.HotKeyOptions{Table: -1}})
	if err := l.Refresh(ctx, at(3_600_000)); err != nil {
		t.Fatal(err)
	}
	if d := decide(t, l, tenant(3_600_000)); d.Limit != 40 {
		t.Errorf("after the mark expired: limit %d, want 40", d.Limit)
	}
}

// Options.Shadow: every request is allowed, and the would-be denials are
// recorded on every path that can deny: Redis, the deny cache and the
// fallback.
func TestShadowOnEveryPath(t *testing.T) {
	const yaml = `
domain: d
rules:
  - {id: r, match: [{key: user}], limit: 1, period: 1s}
  - {id: login, match: [{key: route, value: /login}], limit: 100, period: 1s, failure_mode: closed}`
	var recs []decision.Record
	reg := prometheus.NewRegistry()
	sink := sinkFunc(func(r decision.Record) { recs = append(recs, r) })
	l := hotLimiter(t, redistest.Server(t), yaml, enforcer.Options{Shadow: true, HotKeys: enforcer.HotKeyOptions{Rate: -1}, Sink: sink, Registerer: reg})
	decide(t, l, userReq(0, 1, "u"))
	for _, want := range []decision.Path{decision.PathRedis, decision.PathDenyCache} {
		d := decide(t, l, userReq(1, 1, "u"))
		if d.Outcome != decision.ShadowDenied || d.Path != want || d.Shadow == nil || d.Shadow.ID != "r" || !d.Outcome.Allow() {
			t.Fatalf("got %v on %v shadow %v, want shadow_denied by r on %v", d.Outcome, d.Path, d.Shadow, want)
		}
		if rec := recs[len(recs)-1]; rec.ShadowRule != "r" || rec.Path != want || rec.Outcome != decision.ShadowDenied {
			t.Errorf("record %+v: want shadow rule r on %v", rec, want)
		}
	}
	// Redis down: the fail-closed login rule would have denied.
	dead := hotLimiter(t, deadRedis(t), yaml, enforcer.Options{Shadow: true, Sink: sink, Registerer: prometheus.NewRegistry()})
	r := userReq(0, 1, "v")
	r.Descriptors[rules.KeyRoute] = "/login"
	d, err := dead.Check(context.Background(), r)
	if err != nil || d.Outcome != decision.DegradedOpen || d.Path != decision.PathFallback || d.Shadow == nil || d.Shadow.ID != "login" {
		t.Fatalf("Redis down: got %v on %v shadow %v (%v), want degraded_open with login's would-deny", d.Outcome, d.Path, d.Shadow, err)
	}
	if rec := recs[len(recs)-1]; rec.ShadowRule != "login" || rec.Path != decision.PathFallback {
		t.Errorf("record %+v: want shadow rule login on fallback", rec)
	}
	// A fail-open rule's empty local bucket would have denied too.
	for range 2 {
		d, _ = dead.Check(context.Background(), userReq(0, 1, "w"))
	}
	if d.Outcome != decision.DegradedOpen || d.Shadow == nil || d.Shadow.ID != "r" {
		t.Errorf("local bucket empty: got %v shadow %v, want degraded_open with r's would-deny", d.Outcome, d.Shadow)
	}
	for path, want := range map[string]float64{"redis": 1, "deny_cache": 1} {
		if got := testutil.ToFloat64(metricWith(t, reg, "sluice_enforcer_would_deny_total", "path", path)); got != want {
			t.Errorf("would_deny_total{path=%q} = %v, want %v", path, got, want)
		}
	}
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	l := hotLimiter(t, redistest.Server(t), "domain: d\nrules: [{id: r, match: [{key: user}], limit: 1, period: 1h}]",
		enforcer.Options{Registerer: reg, HotKeys: enforcer.HotKeyOptions{Rate: -1}})
	for range 3 {
		decide(t, l, userReq(0, 1, "u"))
	}
	if _, err := l.Check(context.Background(), &enforcer.Request{}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, outcome, rule string
		want                float64
	}{{"allowed", "allowed", "r", 1}, {"denied", "denied", "r", 2}, {"no rule", "allowed", "", 1}} {
		got := testutil.ToFloat64(metricWith(t, reg, "sluice_enforcer_decisions_total", "outcome", c.outcome, "rule", c.rule))
		if got != c.want {
			t.Errorf("%s: decisions_total{outcome=%s,rule=%q} = %v, want %v", c.name, c.outcome, c.rule, got, c.want)
		}
	}
	if n := testutil.ToFloat64(metricWith(t, reg, "sluice_enforcer_deny_cache_hits_total")); n != 1 {
		t.Errorf("deny cache hits %v, want 1 (the third request)", n)
	}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "sluice_enforcer_redis_duration_seconds" {
			if n := mf.GetMetric()[0].GetHistogram().GetSampleCount(); n != 2 {
				t.Errorf("Redis latency histogram has %d samples, want 2 (two Redis calls)", n)
			}
			return
		}
	}
	t.Error("no sluice_enforcer_redis_duration_seconds")
}

// metricWith returns a collector for the one series of name with the given
// label pairs, from reg.
func metricWith(t *testing.T, reg *prometheus.Registry, name string, labels ...string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue series
				}
			}
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue() // whichever it is
			c := prometheus.NewCounter(prometheus.CounterOpts{Name: name})
			c.Add(v)
			return c
		}
	}
	t.Fatalf("no series %s%v", name, labels)
	return nil
}

// Leases under concurrency (run with -race): 16 goroutines on 2 limiters
// share one hot key for 2 s of Redis time; what they allow stays within the
// bucket plus its refill plus one block per instance, and the lease path
// serves most of them.
func TestLeasesConcurrent(t *testing.T) {
	rdb := redistest.Server(t)
	const yaml = "domain: d\nrules: [{id: r, match: [{key: user}], limit: 200, period: 1s}]"
	ls := []*enforcer.Limiter{
		hotLimiter(t, rdb, yaml, enforcer.Options{Instance: "0", HotKeys: enforcer.HotKeyOptions{Rate: 10}}),
		hotLimiter(t, rdb, yaml, enforcer.Options{Instance: "1", HotKeys: enforcer.HotKeyOptions{Rate: 10}}),
	}
	var allowed, leased, total atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(2 * time.Second)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := ls[g%2]
			var d enforcer.Decision
			r := &enforcer.Request{} // Redis TIME: one clock for both limiters
			r.Descriptors[rules.KeyUser] = "hot"
			for time.Now().Before(stop) {
				if err := l.Decide(context.Background(), r, &d); err != nil || d.Err != nil {
					t.Error(err, d.Err)
					return
				}
				total.Add(1)
				if d.Outcome == decision.Allowed {
					allowed.Add(1)
					if d.Path == decision.PathLease {
						leased.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	// At most: 200 in the bucket, 200 a second refilled over the run (2 s,
	// plus slack for the time the goroutines overran), one block (50) per
	// instance.
	bound := int64(200 + 200*2.5 + 2*50)
	t.Logf("%d requests, %d allowed (%d from leases); bound %d", total.Load(), allowed.Load(), leased.Load(), bound)
	if allowed.Load() > bound {
		t.Errorf("%d allowed, more than %d", allowed.Load(), bound)
	}
	if allowed.Load() < 400 {
		t.Errorf("%d allowed: under-served by more than the blocks", allowed.Load())
	}
	if leased.Load() == 0 {
		t.Error("no decision came from a lease")
	}
}

// Leased tokens a request was to give back to Redis with its call stay in
// their lease when the deny cache answers it instead, without a call.
func TestDenyCacheKeepsTheLease(t *testing.T) {
	l := hotLimiter(t, redistest.Server(t), `
domain: d
rules:
  - {id: a, match: [{key: user}], limit: 100000, period: 1s}
  - {id: b, match: [{key: api_key}], limit: 100, period: 1h}`, enforcer.Options{HotKeys: enforcer.HotKeyOptions{Rate: 10}})
	both := func(ms int64, cost uint32) enforcer.Decision {
		r := userReq(ms, cost, "hot")
		r.Descriptors[rules.KeyAPIKey] = "k"
		return decide(t, l, r)
	}
	ms := int64(0)
	warm := func() { // user alone, until a's lease serves
		for i := 0; i < 200; i++ {
			ms++
			if d := decide(t, l, userReq(ms, 1, "hot")); d.Path == decision.PathLease {
				return
			}
		}
		t.Fatal("a's key never leased")
	}
	warm()
	ms++
	if d := both(ms, 60); d.Outcome != decision.Allowed { // b: 40 left
		t.Fatalf("first cost 60: %v", d.Outcome)
	}
	ms++
	if d := both(ms, 60); d.Outcome != decision.Denied || d.Rule.ID != "b" || d.Path != decision.PathRedis {
		t.Fatalf("second cost 60: %v by %v on %v, want denied by b in Redis", d.Outcome, d.Rule, d.Path)
	}
	warm() // a leases a block again
	ms++
	if d := both(ms, 60); d.Outcome != decision.Denied || d.Path != decision.PathDenyCache {
		t.Fatalf("third cost 60: %v on %v, want denied from the cache", d.Outcome, d.Path)
	}
	ms++
	if d := decide(t, l, userReq(ms, 1, "hot")); d.Path != decision.PathLease {
		t.Errorf("after the cache's deny, a's next request went to %v: its leased tokens were lost", d.Path)
	}
}

// TestShareTimestampMetric: the gauge is 0 with no share, then the newest
// loaded share's ComputedAt, whichever rule or region it belongs to.
func TestShareTimestampMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	rdb := redistest.Server(t)
	l := hotLimiter(t, rdb, "domain: d\nrules: [{id: g, match: [{key: user}], limit: 10, period: 1m, global: true}]",
		enforcer.Options{Registerer: reg, Regions: 2, Region: "a"})
	gauge := func() float64 {
		return testutil.ToFloat64(metricWith(t, reg, "sluice_enforcer_share_newest_timestamp_seconds"))
	}
	if got := gauge(); got != 0 {
		t.Fatalf("no share loaded: gauge %v, want 0", got)
	}
	older, newer := time.Unix(1_700_000_000, 0), time.Unix(1_700_000_030, 500_000_000)
	ctx := context.Background()
	if err := store.NewStore(rdb).PutShares(ctx, []rules.Share{
		{RuleID: "g", Region: "a", Fraction: 0.25, Version: 1, ComputedAt: older},
		{RuleID: "g", Key: "x", Region: "a", Fraction: 0.75, Version: 2, ComputedAt: newer},
	}); err != nil {
		t.Fatal(err)
	}
	if err := l.Refresh(ctx, newer); err != nil {
		t.Fatal(err)
	}
	if got, want := gauge(), 1_700_000_030.5; got != want {
		t.Errorf("gauge %v, want %v (the newer share's ComputedAt)", got, want)
	}
}
