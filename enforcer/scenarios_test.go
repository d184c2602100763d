package enforcer_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// The numbered scenarios of the enforcement-engine issue, against a real
// redis-server (and, for scenario 9, a 3-master Redis Cluster). Times are ms
// after a day boundary, so fixed windows start at 0.

var day0 = time.UnixMilli(1_700_006_400_000) // 2023-11-15T00:00:00Z

func atDay(ms int64) time.Time { return day0.Add(time.Duration(ms) * time.Millisecond) }

// req builds a request; kv are descriptor key, value pairs.
func req(ms int64, cost uint32, kv ...any) *enforcer.Request {
	r := &enforcer.Request{Now: atDay(ms), Cost: cost}
	for i := 0; i+1 < len(kv); i += 2 {
		r.Descriptors[kv[i].(rules.Key)] = kv[i+1].(string)
	}
	return r
}

func decide(t *testing.T, l *enforcer.Limiter, r *enforcer.Request) enforcer.Decision {
	t.Helper()
	d, err := l.Check(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	if d.Err != nil {
		t.Fatalf("storage error: %v", d.Err)
	}
	return d
}

// status returns the status of rule id in d.
func status(t *testing.T, d *enforcer.Decision, id string) enforcer.Status {
	t.Helper()
	for _, s := range d.Statuses {
		if s.Rule.ID == id {
			return s
		}
	}
	t.Fatalf("rule %s did not match; matched %v", id, d.Matched())
	return enforcer.Status{}
}

func header(d *enforcer.Decision, name string) string {
	for _, h := range d.AppendHeaders(nil, enforcer.AllHeaders) {
		if h.Name == name {
			return h.Value
		}
	}
	return ""
}

var algorithms = []string{"token_bucket", "sliding_window", "fixed_window"}

func TestScenario1DenyConsumesNothingAcrossRules(t *testing.T) {
	for _, alg := range algorithms {
		t.Run(alg, func(t *testing.T) {
			l := newLimiter(t, redistest.Server(t), fmt.Sprintf(`
domain: s
rules:
  - {id: tenant, algorithm: %[1]s, match: [{key: tenant}], limit: 5, period: 1m}
  - {id: user, algorithm: %[1]s, match: [{key: user}], limit: 3, period: 1m}`, alg))
			allowed := 0
			for i := int64(0); i < 6; i++ {
				d := decide(t, l, req(i*100, 0, rules.KeyTenant, "T", rules.KeyUser, "A"))
				if d.Outcome == decision.Allowed {
					allowed++
				} else if d.Outcome != decision.Denied || d.Rule.ID != "user" {
					t.Fatalf("request %d: %v by %v, want denied by the user rule", i, d.Outcome, d.Rule)
				}
			}
			if allowed != 3 {
				t.Fatalf("user A: %d allowed, want 3", allowed)
			}
			for _, ms := range []int64{1000, 1100} {
				if d := decide(t, l, req(ms, 0, rules.KeyTenant, "T", rules.KeyUser, "B")); d.Outcome != decision.Allowed {
					t.Fatalf("user B at %d: %v by %s, want allowed: A's denied requests must not have consumed tenant tokens", ms, d.Outcome, d.Rule.ID)
				} else if ms == 1100 {
					if s := status(t, &d, "tenant"); s.Remaining != 0 {
						t.Errorf("tenant remaining %d, want 0", s.Remaining)
					}
				}
			}
		})
	}
}

func TestScenario2DeniedRequestConsumesNothing(t *testing.T) {
	for _, alg := range algorithms {
		t.Run(alg, func(t *testing.T) {
			l := newLimiter(t, redistest.Server(t), fmt.Sprintf(`
domain: s
rules: [{id: w, algorithm: %s, match: [{key: user}], limit: 10, period: 1m}]`, alg))
			for _, s := range []struct {
				ms        int64
				cost      uint32
				want      decision.Outcome
				remaining int64
			}{{0, 3, decision.Allowed, 7}, {100, 8, decision.Denied, 7}, {200, 7, decision.Allowed, 0}} {
				d := decide(t, l, req(s.ms, s.cost, rules.KeyUser, "u"))
				if d.Outcome != s.want || d.Remaining != s.remaining {
					t.Errorf("at %d cost %d: %v remaining %d, want %v remaining %d", s.ms, s.cost, d.Outcome, d.Remaining, s.want, s.remaining)
				}
			}
		})
	}
}

func TestScenario3CostAboveCapacity(t *testing.T) {
	for _, alg := range algorithms {
		t.Run(alg, func(t *testing.T) {
			l := newLimiter(t, redistest.Server(t), fmt.Sprintf(`
domain: s
rules: [{id: c, algorithm: %s, match: [{key: user}], limit: 10, period: 1s}]`, alg))
			d := decide(t, l, req(0, 11, rules.KeyUser, "u"))
			if d.Outcome != decision.Denied || d.Reason != decision.ReasonCostExceedsCapacity || d.Reason.String() != "cost exceeds capacity" ||
				d.RetryAfter != 0 || d.Remaining != 10 || header(&d, "Retry-After") != "" {
				t.Errorf("got %v %q retry %v remaining %d Retry-After %q; want denied, cost exceeds capacity, no Retry-After, remaining 10",
					d.Outcome, d.Reason, d.RetryAfter, d.Remaining, header(&d, "Retry-After"))
			}
		})
	}
}

func TestScenario4RetryAfterCountsPartialTokens(t *testing.T) {
	l := newLimiter(t, redistest.Server(t), `
domain: s
rules: [{id: b, match: [{key: user}], limit: 1, period: 1s, burst: 1}]`)
	if d := decide(t, l, req(0, 0, rules.KeyUser, "u")); d.Outcome != decision.Allowed {
		t.Fatalf("at 0: %v", d.Outcome)
	}
	d := decide(t, l, req(200, 0, rules.KeyUser, "u"))
	if d.Outcome != decision.Denied || d.Wait != 800*time.Millisecond || header(&d, "Retry-After") != "1" {
		t.Errorf("at 200: %v wait %v Retry-After %q; want denied, 800ms, 1", d.Outcome, d.Wait, header(&d, "Retry-After"))
	}
	if d := decide(t, l, req(1000, 0, rules.KeyUser, "u")); d.Outcome != decision.Allowed {
		t.Errorf("at 1000: %v, want allowed", d.Outcome)
	}
}

func TestScenario5StaleTimeMintsNothing(t *testing.T) {
	rdb := redistest.Server(t)
	l := newLimiter(t, rdb, `
domain: s
rules: [{id: b, match: [{key: user}], limit: 1, period: 100ms, burst: 10}]`)
	if d := decide(t, l, req(1000, 10, rules.KeyUser, "u")); d.Outcome != decision.Allowed {
		t.Fatalf("at 1000: %v", d.Outcome)
	}
	if d := decide(t, l, req(900, 1, rules.KeyUser, "u")); d.Outcome != decision.Denied {
		t.Errorf("stamped 900: %v, want denied", d.Outcome)
	}
	keys, _ := rdb.Keys(context.Background(), "sl:*").Result()
	if len(keys) != 1 {
		t.Fatalf("keys %v", keys)
	}
	if ts := stateField(t, rdb, keys[0], 1); ts != atDay(1000).UnixMilli() {
		t.Errorf("stored time %d, want %d (1000): it must never move back", ts, atDay(1000).UnixMilli())
	}
	d := decide(t, l, req(1100, 2, rules.KeyUser, "u"))
	if d.Outcome != decision.Denied || header(&d, "Retry-After") != "1" {
		t.Errorf("at 1100 cost 2: %v Retry-After %q; want denied, 1", d.Outcome, header(&d, "Retry-After"))
	}
}

func TestScenario6SmallCapacityIsStillLimited(t *testing.T) {
	rdb := redistest.Server(t)
	l := newLimiter(t, rdb, `
domain: s
rules: [{id: b, match: [{key: user}], limit: 3, period: 1s, burst: 1}]`)
	allowed := 0
	for ms := int64(0); ms < 100; ms += 10 {
		if d := decide(t, l, req(ms, 0, rules.KeyUser, "u")); d.Outcome == decision.Allowed {
			allowed++
		}
	}
	if allowed != 1 {
		t.Errorf("%d allowed, want only the first", allowed)
	}
	keys, _ := rdb.Keys(context.Background(), "sl:*").Result()
	if len(keys) != 1 {
		t.Fatalf("keys %v", keys)
	}
	if ttl := rdb.PTTL(context.Background(), keys[0]).Val(); ttl <= 0 {
		t.Errorf("PTTL %v, want positive", ttl)
	}
}

func TestScenario7RulesOnSameDescriptorsHaveSeparateCounters(t *testing.T) {
	for _, alg := range algorithms {
		t.Run(alg, func(t *testing.T) {
			l := newLimiter(t, redistest.Server(t), fmt.Sprintf(`
domain: s
rules:
  - {id: broad, algorithm: %[1]s, match: [{key: api_key}], limit: 1000, period: 1m}
  - {id: search, algorithm: %[1]s, match: [{key: api_key}, {key: route, value: search}], limit: 10, period: 1m}`, alg))
			allowed := 0
			for i := int64(0); i < 11; i++ {
				d := decide(t, l, req(i, 0, rules.KeyAPIKey, "k", rules.KeyRoute, "search"))
				if d.Outcome == decision.Allowed {
					allowed++
				}
				if i == 9 {
					if s, b := status(t, &d, "search"), status(t, &d, "broad"); s.Remaining != 0 || b.Remaining != 990 {
						t.Errorf("after the 10th: search remaining %d, broad %d; want 0 and 990", s.Remaining, b.Remaining)
					}
				}
			}
			if allowed != 10 {
				t.Errorf("%d allowed, want 10", allowed)
			}
		})
	}
}

// delayHook makes every script call reach Redis late: before the call goes
// out it runs arrive (which moves the enforcer's clock on) and sleeps.
type delayHook struct {
	on     atomic.Bool
	arrive func()
}

func (h *delayHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *delayHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.on.Load() && (cmd.Name() == "evalsha" || cmd.Name() == "eval") {
			h.arrive()
			time.Sleep(40 * time.Millisecond)
		}
		return next(ctx, cmd)
	}
}
func (h *delayHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func TestScenario8LateWriteLandsInItsOwnWindow(t *testing.T) {
	rdb := redistest.Server(t)
	var clock atomic.Int64 // the enforcer's clock, ms after day0
	hook := &delayHook{arrive: func() { clock.Store(60_030) }}
	rdb.AddHook(hook)
	set := mustSet(t, `
domain: s
rules: [{id: fw, algorithm: fixed_window, match: [{key: user}], limit: 2, period: 60s}]`)
	l, err := enforcer.New(rdb, set, enforcer.Options{Budget: time.Second, Clock: func() time.Time { return atDay(clock.Load()) }})
	if err != nil {
		t.Fatal(err)
	}
	check := func() enforcer.Decision {
		var r enforcer.Request // no Now: the window comes from the enforcer's clock
		r.Descriptors[rules.KeyUser] = "u"
		return decide(t, l, &r)
	}
	for _, ms := range []int64{58_000, 59_000} {
		clock.Store(ms)
		if d := check(); d.Outcome != decision.Allowed {
			t.Fatalf("at %d: %v", ms, d.Outcome)
		}
	}
	clock.Store(59_990)
	hook.on.Store(true) // the window is computed at 59 990; the write arrives at 60 030
	d := check()
	hook.on.Store(false)
	if d.Outcome != decision.Denied || d.Remaining != 0 {
		t.Errorf("late write: %v remaining %d; want denied in the first window", d.Outcome, d.Remaining)
	}
	if clock.Load() != 60_030 {
		t.Fatal("the hook did not run")
	}
	if d := check(); d.Outcome != decision.Allowed || d.Remaining != 1 {
		t.Errorf("at 60 030: %v remaining %d; want allowed in the second window, remaining 1", d.Outcome, d.Remaining)
	}
	keys, _ := rdb.Keys(context.Background(), "sl:*").Result()
	for _, k := range keys {
		if ttl := rdb.PTTL(context.Background(), k).Val(); ttl < 60*time.Second {
			t.Errorf("%s: PTTL %v; a window's key must outlive it by a slack", k, ttl)
		}
	}
}

func TestScenario9Cluster(t *testing.T) {
	rdb := redistest.Cluster(t)
	l := newLimiter(t, rdb, `
domain: s
rules:
  - {id: user, match: [{key: user}], limit: 2, period: 1s, burst: 2}
  - {id: tenant, match: [{key: tenant}], limit: 100, period: 1m}
  - {id: ip, match: [{key: client_ip}], limit: 1, period: 1m}`)
	allowed, denied := 0, 0
	for i := 0; i < 5; i++ {
		var r enforcer.Request // Redis TIME: the 5 requests fall within a few ms
		r.Descriptors[rules.KeyUser] = "u-cluster"
		d := decide(t, l, &r)
		switch d.Outcome {
		case decision.Allowed:
			allowed++
		case decision.Denied:
			denied++
		}
	}
	if allowed != 2 || denied != 3 {
		t.Errorf("per-user bucket on the cluster: %d allowed, %d denied; want 2 and 3", allowed, denied)
	}
	// Three entities, three slots (checked), one round trip.
	var r enforcer.Request
	r.Descriptors[rules.KeyUser], r.Descriptors[rules.KeyTenant], r.Descriptors[rules.KeyClientIP] = "u-multi", "t-multi", "192.0.2.9"
	before := l.RoundTrips()
	d := decide(t, l, &r)
	if d.Outcome != decision.Allowed || len(d.Statuses) != 3 {
		t.Fatalf("tenant+user+ip: %v with %d rules", d.Outcome, len(d.Statuses))
	}
	if n := l.RoundTrips() - before; n != 1 {
		t.Errorf("%d round trips for three slots, want 1 (one pipeline)", n)
	}
	// The IP rule is now empty: the next request is denied there and the
	// user and tenant reservations, made in other slots, are refunded.
	r.Descriptors[rules.KeyUser] = "u-multi2"
	d = decide(t, l, &r)
	if d.Outcome != decision.Denied || d.Rule.ID != "ip" {
		t.Fatalf("second request: %v by %v, want denied by ip", d.Outcome, d.Rule)
	}
	if u, tn := status(t, &d, "user"), status(t, &d, "tenant"); u.Remaining != 2 || tn.Remaining != 99 {
		t.Errorf("denied request: user remaining %d, tenant %d; want 2 and 99, after the refund, as on a single node", u.Remaining, tn.Remaining)
	}
	r.Descriptors[rules.KeyClientIP] = "192.0.2.10"
	d = decide(t, l, &r)
	if s := status(t, &d, "user"); d.Outcome != decision.Allowed || s.Remaining != 1 {
		t.Errorf("after the refund: %v, user remaining %d; want allowed with 1 left (the denied request's token came back)", d.Outcome, s.Remaining)
	}
	if s := status(t, &d, "tenant"); s.Remaining != 98 {
		t.Errorf("tenant remaining %d, want 98 (2 allowed requests; the denied one refunded)", s.Remaining)
	}
	slots := map[uint16]bool{}
	for _, st := range d.Statuses {
		slots[enforcer.Slot("{"+rules.EntityTag(st.Rule, &r.Descriptors)+"}")] = true
	}
	if len(slots) < 2 {
		t.Errorf("the three entities share a slot (%v): the test would not cross slots", slots)
	}
}

func TestScenario10ResetIsNeverZeroOrNegative(t *testing.T) {
	l := newLimiter(t, redistest.Server(t), `
domain: s
rules: [{id: fw, algorithm: fixed_window, match: [{key: user}], limit: 2, period: 10s}]`)
	for _, s := range []struct {
		ms         int64
		want       decision.Outcome
		retryAfter string
		remaining  int64
	}{
		{0, decision.Allowed, "", 1}, {1000, decision.Allowed, "", 0},
		{2000, decision.Denied, "8", 0}, {9500, decision.Denied, "1", 0},
		{10_000, decision.Allowed, "", 1},
	} {
		d := decide(t, l, req(s.ms, 0, rules.KeyUser, "u"))
		if d.Outcome != s.want || header(&d, "Retry-After") != s.retryAfter || d.Remaining != s.remaining {
			t.Errorf("at %d: %v Retry-After %q remaining %d; want %v %q %d", s.ms, d.Outcome, header(&d, "Retry-After"), d.Remaining, s.want, s.retryAfter, s.remaining)
		}
		if d.Reset <= 0 {
			t.Errorf("at %d: reset %v, want > 0", s.ms, d.Reset)
		}
	}
}

func TestScenario11HeadersAgree(t *testing.T) {
	l := newLimiter(t, redistest.Server(t), `
domain: s
rules: [{id: fw, algorithm: fixed_window, match: [{key: user}], limit: 5, period: 60s}]`)
	for i := int64(0); i < 5; i++ {
		d := decide(t, l, req(i*400, 0, rules.KeyUser, "u"))
		want := fmt.Sprintf(`"fw";r=%d;t=%d`, 4-i, 60-(i*400)/1000)
		if d.Outcome != decision.Allowed || header(&d, "RateLimit") != want || header(&d, "RateLimit-Policy") != `"fw";q=5;w=60` {
			t.Errorf("request %d: %v RateLimit %q Policy %q; want allowed, %q", i+1, d.Outcome, header(&d, "RateLimit"), header(&d, "RateLimit-Policy"), want)
		}
	}
	d := decide(t, l, req(2000, 0, rules.KeyUser, "u"))
	want := map[string]string{
		"Retry-After": "58", "RateLimit": `"fw";r=0;t=58`, "RateLimit-Policy": `"fw";q=5;w=60`,
		"X-RateLimit-Limit": "5", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "58",
	}
	if d.Outcome != decision.Denied {
		t.Fatalf("6th: %v, want denied", d.Outcome)
	}
	for name, v := range want {
		if got := header(&d, name); got != v {
			t.Errorf("%s: %q, want %q", name, got, v)
		}
	}
	if hs := d.AppendHeaders(nil, enforcer.HeadersLegacy); len(hs) != 3 {
		t.Errorf("legacy only: %v", hs)
	}
}

// TestSentinel: the same atomic multi-rule decision through Redis Sentinel
// (go-redis's failover client finds the master).
func TestSentinel(t *testing.T) {
	l := newLimiter(t, redistest.Sentinel(t), `
domain: s
rules:
  - {id: user, match: [{key: user}], limit: 2, period: 1m}
  - {id: ip, match: [{key: client_ip}], limit: 3, period: 1m}`)
	var outcomes []decision.Outcome
	for i := int64(0); i < 3; i++ {
		d := decide(t, l, req(i, 0, rules.KeyUser, "u", rules.KeyClientIP, "192.0.2.1"))
		outcomes = append(outcomes, d.Outcome)
	}
	d := decide(t, l, req(3, 0, rules.KeyUser, "v", rules.KeyClientIP, "192.0.2.1"))
	if fmt.Sprint(outcomes) != "[allowed allowed denied]" || d.Outcome != decision.Allowed || d.Remaining != 0 {
		t.Errorf("through Sentinel: %v, then %v remaining %d; want [allowed allowed denied], then allowed with the IP rule at 0",
			outcomes, d.Outcome, d.Remaining)
	}
}

// TestEveryKeyHasATTL: after traffic through every algorithm, with allows,
// denies, shadow rules, releases and (on the Cluster) refunds, every key the
// limiter wrote has a TTL: none is left to live forever.
func TestEveryKeyHasATTL(t *testing.T) {
	const yaml = `
domain: s
rules:
  - {id: tb, match: [{key: user}], limit: 3, period: 1s}
  - {id: sw, algorithm: sliding_window, match: [{key: client_ip}], limit: 4, period: 10s}
  - {id: fw, algorithm: fixed_window, match: [{key: tenant}], limit: 5, calendar: day, timezone: Europe/Berlin}
  - {id: cc, algorithm: concurrency, match: [{key: api_key}], limit: 2, lease: 5s}
  - {id: sh, mode: shadow, match: [{key: user}], limit: 1, period: 1h}`
	body := func(t *testing.T, rdb redis.UniversalClient, scan func(func(k string, ttl time.Duration))) {
		l := newLimiter(t, rdb, yaml)
		for i := 0; i < 40; i++ {
			var r enforcer.Request // Redis TIME
			r.Descriptors[rules.KeyUser] = fmt.Sprint("u", i%3)
			r.Descriptors[rules.KeyClientIP] = fmt.Sprint("192.0.2.", i%5)
			r.Descriptors[rules.KeyTenant] = fmt.Sprint("t", i%2)
			r.Descriptors[rules.KeyAPIKey] = fmt.Sprint("k", i%4)
			d := decide(t, l, &r)
			if i%2 == 0 {
				if err := l.Release(context.Background(), &d); err != nil {
					t.Fatal(err)
				}
			}
		}
		n := 0
		scan(func(k string, ttl time.Duration) {
			n++
			if ttl <= 0 {
				t.Errorf("%s: TTL %v", k, ttl)
			}
		})
		if n < 10 {
			t.Fatalf("only %d keys written", n)
		}
	}
	t.Run("redis-server", func(t *testing.T) {
		rdb := redistest.Server(t)
		body(t, rdb, func(f func(string, time.Duration)) {
			for _, k := range rdb.Keys(context.Background(), "sl:*").Val() {
				f(k, rdb.PTTL(context.Background(), k).Val())
			}
		})
	})
	t.Run("cluster", func(t *testing.T) {
		rdb := redistest.Cluster(t)
		body(t, rdb, func(f func(string, time.Duration)) {
			var mu sync.Mutex // ForEachMaster calls the nodes in parallel
			_ = rdb.ForEachMaster(context.Background(), func(ctx context.Context, c *redis.Client) error {
				for _, k := range c.Keys(ctx, "sl:*").Val() {
					ttl := c.PTTL(ctx, k).Val()
					mu.Lock()
					f(k, ttl)
					mu.Unlock()
				}
				return nil
			})
		})
	})
}

// TestDenyReportsTheLongestBlock: when several rules deny, the decision
// names the one that blocks longest, so Retry-After is enough for all of
// them; a cost beyond a rule's capacity wins over any wait. On a single node
// and across Cluster slots, where the rules below live in different slots.
func TestDenyReportsTheLongestBlock(t *testing.T) {
	const yaml = `
domain: s
rules:
  - {id: fast, match: [{key: client_ip}], limit: 1, period: 1s, burst: 10}
  - {id: slow, match: [{key: user}], limit: 1, period: 1m, burst: 10}
  - {id: small, match: [{key: tenant}], limit: 3, period: 1h}`
	backends := map[string]func(t *testing.T) redis.UniversalClient{
		"redis-server": func(t *testing.T) redis.UniversalClient { return redistest.Server(t) },
		"cluster":      func(t *testing.T) redis.UniversalClient { return redistest.Cluster(t) },
	}
	for name, rdb := range backends {
		t.Run(name, func(t *testing.T) {
			l := newLimiter(t, rdb(t), yaml)
			r := func(ms int64, cost uint32, tenant string) *enforcer.Request {
				return req(ms, cost, rules.KeyClientIP, "192.0.2.1", rules.KeyUser, "u", rules.KeyTenant, tenant)
			}
			if d := decide(t, l, r(0, 10, "")); d.Outcome != decision.Allowed { // empties fast and slow; no tenant
				t.Fatalf("first: %v", d.Outcome)
			}
			d := decide(t, l, r(0, 1, "t2"))
			if d.Outcome != decision.Denied || d.Rule.ID != "slow" || d.RetryAfter != time.Minute || !status(t, &d, "fast").Denied || !status(t, &d, "slow").Denied {
				t.Errorf("both fast and slow empty: %v by %v, Retry-After %v; want denied by slow, 60 s, both marked", d.Outcome, d.Rule, d.RetryAfter)
			}
			if d := decide(t, l, r(59_999, 1, "t2")); d.Outcome != decision.Denied {
				t.Errorf("1 ms before: %v", d.Outcome)
			}
			if d := decide(t, l, r(60_000, 1, "t2")); d.Outcome != decision.Allowed {
				t.Errorf("at now + Retry-After: %v by %v, want allowed", d.Outcome, d.Rule)
			}
			// slow is empty again (fast holds 9): cost 5 must wait for slow, and can never fit small's 3.
			d = decide(t, l, r(60_001, 5, "t3"))
			if d.Outcome != decision.Denied || d.Rule.ID != "small" || d.Reason != decision.ReasonCostExceedsCapacity || d.RetryAfter != 0 {
				t.Errorf("cost beyond small's capacity: %v by %v, %q, Retry-After %v; want small, cost exceeds capacity, none", d.Outcome, d.Rule, d.Reason, d.RetryAfter)
			}
		})
	}
}
