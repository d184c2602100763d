package enforcer_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

// backends runs the same test body against a real redis-server and the
// in-process Redis that embedded mode uses.
func backends(t *testing.T, body func(t *testing.T, rdb redis.UniversalClient)) {
	t.Run("redis-server", func(t *testing.T) { body(t, redistest.Server(t)) })
	t.Run("in-process", func(t *testing.T) {
		m := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		body(t, c)
	})
}

// stateField returns field i of a token bucket's ("t ts pd") or a sliding
// window's ("w c p ts") stored state.
func stateField(t *testing.T, rdb redis.UniversalClient, key string, i int) int64 {
	t.Helper()
	v, err := rdb.Get(context.Background(), key).Result()
	if err != nil {
		t.Fatalf("%s: %v", key, err)
	}
	f := strings.Fields(v)
	if i >= len(f) {
		t.Fatalf("%s: state %q has no field %d", key, v, i)
	}
	n, err := strconv.ParseInt(f[i], 10, 64)
	if err != nil {
		t.Fatalf("%s: state %q: %v", key, v, err)
	}
	return n
}

func mustSet(t *testing.T, yaml string) *rules.Set {
	t.Helper()
	s, err := rules.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func at(ms int64) time.Time { return time.UnixMilli(1_700_000_000_000 + ms) }

// newLimiter returns a limiter over rdb with the rules in yaml.
func newLimiter(t *testing.T, rdb redis.UniversalClient, yaml string) *enforcer.Limiter {
	t.Helper()
	l, err := enforcer.New(rdb, mustSet(t, yaml), enforcer.Options{Budget: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

type step struct {
	ms         int64
	user, ip   string
	cost       uint32
	outcome    decision.Outcome
	remaining  int64
	retryAfter time.Duration
	wait       time.Duration
	rule       string
	reason     decision.Reason
}

func run(t *testing.T, l *enforcer.Limiter, steps []step) {
	t.Helper()
	for i, s := range steps {
		req := &enforcer.Request{Cost: s.cost, Now: at(s.ms)}
		req.Descriptors[rules.KeyUser] = s.user
		req.Descriptors[rules.KeyClientIP] = s.ip
		d, err := l.Check(context.Background(), req)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if d.Err != nil {
			t.Fatalf("step %d: storage error %v", i, d.Err)
		}
		if d.Outcome != s.outcome || d.Remaining != s.remaining || d.RetryAfter != s.retryAfter || d.Reason != s.reason {
			t.Errorf("step %d at %d ms: got %v rem %d retry %v reason %q; want %v rem %d retry %v reason %q",
				i, s.ms, d.Outcome, d.Remaining, d.RetryAfter, d.Reason, s.outcome, s.remaining, s.retryAfter, s.reason)
		}
		if s.wait != 0 && d.Wait != s.wait {
			t.Errorf("step %d: wait %v, want %v", i, d.Wait, s.wait)
		}
		if s.rule != "" && (d.Rule == nil || d.Rule.ID != s.rule) {
			t.Errorf("step %d: rule %v, want %s", i, d.Rule, s.rule)
		}
	}
}

func TestTokenBucket(t *testing.T) {
	const A, B = decision.Allowed, decision.Denied
	cases := []struct {
		name  string
		rules string
		steps []step
	}{
		{"retry after counts partial tokens", `
domain: t
rules: [{id: r, match: [{key: user}], limit: 1, period: 1s, burst: 1}]`, []step{
			{ms: 0, user: "u", outcome: A, remaining: 0},
			{ms: 200, user: "u", outcome: B, remaining: 0, retryAfter: time.Second, wait: 800 * time.Millisecond, rule: "r", reason: decision.ReasonOverLimit},
			{ms: 1000, user: "u", outcome: A, remaining: 0},
		}},
		{"cost above capacity", `
domain: t
rules: [{id: r, match: [{key: user}], limit: 10, period: 1s, burst: 10}]`, []step{
			{ms: 0, user: "u", cost: 11, outcome: B, remaining: 10, reason: decision.ReasonCostExceedsCapacity, rule: "r"},
			{ms: 1, user: "u", cost: 10, outcome: A, remaining: 0},
		}},
		{"stale time mints nothing", `
domain: t
rules: [{id: r, match: [{key: user}], limit: 1, period: 100ms, burst: 10}]`, []step{
			{ms: 1000, user: "u", cost: 10, outcome: A, remaining: 0},
			// Stamped 900, but the bucket's time is 1000: the token is there at 1100, 200 ms from the request's time.
			{ms: 900, user: "u", cost: 1, outcome: B, remaining: 0, retryAfter: time.Second, wait: 200 * time.Millisecond, reason: decision.ReasonOverLimit},
			{ms: 1100, user: "u", cost: 2, outcome: B, remaining: 1, retryAfter: time.Second, wait: 100 * time.Millisecond, reason: decision.ReasonOverLimit},
		}},
		{"small capacity is still limited", `
domain: t
rules: [{id: r, match: [{key: user}], limit: 3, period: 1s, burst: 1}]`, []step{
			{ms: 0, user: "u", outcome: A}, {ms: 10, user: "u", outcome: B, retryAfter: time.Second, reason: decision.ReasonOverLimit},
			{ms: 20, user: "u", outcome: B, retryAfter: time.Second, reason: decision.ReasonOverLimit},
			{ms: 90, user: "u", outcome: B, retryAfter: time.Second, reason: decision.ReasonOverLimit},
		}},
		{"refill over an uneven period reaches exactly full", `
domain: t
rules: [{id: r, match: [{key: user}], limit: 10, period: 13s, burst: 10}]`, []step{
			{ms: 0, user: "u", cost: 10, outcome: A, remaining: 0},
			{ms: 12999, user: "u", cost: 10, outcome: B, remaining: 9, retryAfter: time.Second, wait: time.Millisecond, reason: decision.ReasonOverLimit},
			{ms: 13000, user: "u", cost: 10, outcome: A, remaining: 0},
		}},
		{"a denied request consumes nothing from any rule", `
domain: t
rules:
  - {id: tenant, match: [{key: client_ip}], limit: 5, period: 1m}
  - {id: user, match: [{key: user}], limit: 3, period: 1m}`, []step{
			{ms: 0, user: "a", ip: "t", outcome: A, remaining: 2},
			{ms: 100, user: "a", ip: "t", outcome: A, remaining: 1},
			{ms: 200, user: "a", ip: "t", outcome: A, remaining: 0},
			{ms: 300, user: "a", ip: "t", outcome: B, remaining: 0, rule: "user", retryAfter: 20 * time.Second, reason: decision.ReasonOverLimit},
			{ms: 400, user: "a", ip: "t", outcome: B, remaining: 0, rule: "user", retryAfter: 20 * time.Second, reason: decision.ReasonOverLimit},
			{ms: 1000, user: "b", ip: "t", outcome: A, remaining: 1},
			{ms: 1100, user: "b", ip: "t", outcome: A, remaining: 0},
			{ms: 1200, user: "b", ip: "t", outcome: B, remaining: 0, rule: "tenant", retryAfter: 11 * time.Second, reason: decision.ReasonOverLimit},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			backends(t, func(t *testing.T, rdb redis.UniversalClient) {
				run(t, newLimiter(t, rdb, c.rules), c.steps)
			})
		})
	}
}

func TestKeysHaveTTLAndStoredTimeNeverMovesBack(t *testing.T) {
	rdb := redistest.Server(t)
	l := newLimiter(t, rdb, `
domain: t
rules: [{id: r, match: [{key: user}], limit: 1, period: 100ms, burst: 10}]`)
	run(t, l, []step{{ms: 1000, user: "u", cost: 10, outcome: decision.Allowed}})
	run(t, l, []step{{ms: 900, user: "u", outcome: decision.Denied, retryAfter: time.Second, reason: decision.ReasonOverLimit}})
	keys, err := rdb.Keys(context.Background(), "sl:*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys %v, %v", keys, err)
	}
	ttl, _ := rdb.PTTL(context.Background(), keys[0]).Result()
	// Refill to full takes 1 s; a caller-supplied clock adds 60 s of slack.
	if ttl <= 60*time.Second || ttl > 61*time.Second {
		t.Errorf("PTTL %v: want in (60 s, refill-to-full + 60 s]", ttl)
	}
	if ts := stateField(t, rdb, keys[0], 1); ts != at(1000).UnixMilli() {
		t.Errorf("stored ts %d, want %d", ts, at(1000).UnixMilli())
	}
}

func TestHostileValuesStayInTheirOwnKeys(t *testing.T) {
	rdb := redistest.Server(t)
	l := newLimiter(t, rdb, `
domain: t
rules: [{id: r, match: [{key: user}], limit: 1, period: 1h, burst: 1}]`)
	big := string(make([]byte, 10<<10))
	for _, u := range []string{"a}{b", "{x}", "a:b\n", big, "a", "a\x00"} {
		run(t, l, []step{{ms: 0, user: u, outcome: decision.Allowed}})
	}
	keys, _ := rdb.Keys(context.Background(), "sl:*").Result()
	if len(keys) != 6 {
		t.Fatalf("got %d keys, want 6 distinct buckets", len(keys))
	}
	for _, k := range keys {
		if len(k) > 64 {
			t.Errorf("key %q longer than 64 bytes", k)
		}
	}
}

func TestShadowRuleNeverDenies(t *testing.T) {
	backends(t, func(t *testing.T, rdb redis.UniversalClient) {
		l := newLimiter(t, rdb, `
domain: t
rules:
  - {id: s, match: [{key: user}], limit: 1, period: 1m, mode: shadow}
  - {id: e, match: [{key: client_ip}], limit: 3, period: 1m}`)
		run(t, l, []step{
			{ms: 0, user: "u", ip: "i", outcome: decision.Allowed, remaining: 2},
			{ms: 1, user: "u", ip: "i", outcome: decision.ShadowDenied, remaining: 1, rule: "s"},
			{ms: 2, user: "u", ip: "i", outcome: decision.ShadowDenied, remaining: 0, rule: "s"},
			{ms: 3, user: "u", ip: "i", outcome: decision.Denied, remaining: 0, rule: "e", retryAfter: 20 * time.Second, reason: decision.ReasonOverLimit},
		})
	})
}

func TestStorageFailureUsesFailureMode(t *testing.T) {
	dead := deadRedis(t)
	defer dead.Close()
	for _, c := range []struct {
		mode string
		want decision.Outcome
	}{{"open", decision.DegradedOpen}, {"closed", decision.DegradedClosed}} {
		l, err := enforcer.New(dead, mustSet(t, `
domain: t
rules: [{id: r, match: [{key: user}], limit: 1, period: 1s, failure_mode: `+c.mode+`}]`), enforcer.Options{Budget: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		req := &enforcer.Request{Now: at(0)}
		req.Descriptors[rules.KeyUser] = "u"
		d, err := l.Check(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if d.Outcome != c.want || d.Err == nil || d.Remaining != -1 {
			t.Errorf("%s: got %v err %v remaining %d; want %v with an error and remaining -1", c.mode, d.Outcome, d.Err, d.Remaining, c.want)
		}
		if c.want == decision.DegradedClosed && (d.Reason != decision.ReasonLimiterUnavailable || d.RetryAfter != time.Second) {
			t.Errorf("closed: reason %q retry %v", d.Reason, d.RetryAfter)
		}
	}
}

type sinkFunc func(decision.Record)

func (f sinkFunc) Log(r decision.Record) { f(r) }

func TestEveryDecisionReachesTheSink(t *testing.T) {
	var got []decision.Record
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true})
	l, err := enforcer.New(rdb, mustSet(t, `
domain: t
rules: [{id: r, match: [{key: user}], limit: 1, period: 1m}]`), enforcer.Options{Budget: time.Second, Region: "eu", Sink: sinkFunc(func(r decision.Record) { got = append(got, r) })})
	if err != nil {
		t.Fatal(err)
	}
	run(t, l, []step{{ms: 0, user: "u", outcome: decision.Allowed}, {ms: 5, user: "u", outcome: decision.Denied, retryAfter: 60 * time.Second, reason: decision.ReasonOverLimit}})
	if len(got) != 2 || got[0].Outcome != decision.Allowed || got[1].Outcome != decision.Denied || got[1].DenyingRule != "r" ||
		got[1].Region != "eu" || !got[1].Time.Equal(at(5)) {
		t.Fatalf("records %+v", got)
	}
}

// With Redis TIME the TTL is the refill time plus 1 s.
func TestRedisClockTTL(t *testing.T) {
	rdb := redistest.Server(t)
	l := newLimiter(t, rdb, `
domain: t
rules: [{id: r, match: [{key: user}], limit: 1, period: 1s, burst: 5}]`)
	req := &enforcer.Request{}
	req.Descriptors[rules.KeyUser] = "u"
	d, err := l.Check(context.Background(), req)
	if err != nil || d.Outcome != decision.Allowed || time.Since(d.Now) > time.Minute || d.Remaining != 4 {
		t.Fatalf("%+v %v", d, err)
	}
	keys, _ := rdb.Keys(context.Background(), "sl:*").Result()
	if len(keys) != 1 {
		t.Fatalf("keys %v", keys)
	}
	// 5 s to refill the burst, plus 1 s of slack from the start of the next
	// second of Redis's clock (decide.lua's epochTTL): the key's TTL is set
	// at most once a second.
	if ttl, _ := rdb.PTTL(context.Background(), keys[0]).Result(); ttl <= 6*time.Second || ttl > 7*time.Second {
		t.Errorf("PTTL %v, want in (6 s, 7 s]", ttl)
	}
}

// A token bucket's key keeps its TTL while it is written again in the same
// second of Redis's clock, and is given a new one in the next second; its
// expiry never falls before the time the bucket is full again (what a key
// that expired would claim). 40 decisions 60 ms apart span three seconds.
func TestTTLSetOncePerSecond(t *testing.T) {
	rdb := redistest.Server(t)
	l := newLimiter(t, rdb, `
domain: t
rules: [{id: r, match: [{key: user}], limit: 100, period: 1s, burst: 500}]`)
	ctx := context.Background()
	req := &enforcer.Request{}
	req.Descriptors[rules.KeyUser] = "u"
	const limit, capUnits, base = 100, 500 * 1000, 5000 // units per ms, burst × period, TTL base ms
	var prevExpiry, prevSec int64 = -1, -1
	sets, seconds := 0, 0
	for i := 0; i < 40; i++ {
		if d, err := l.Check(ctx, req); err != nil || d.Outcome != decision.Allowed {
			t.Fatalf("decision %d: %+v %v", i, d, err)
		}
		keys, _ := rdb.Keys(ctx, "sl:*").Result()
		if len(keys) != 1 {
			t.Fatalf("keys %v", keys)
		}
		v, err := rdb.Get(ctx, keys[0]).Result()
		if err != nil {
			t.Fatal(err)
		}
		var units, ts, period int64
		if _, err := fmt.Sscanf(v, "%d %d %d", &units, &ts, &period); err != nil {
			t.Fatalf("state %q: %v", v, err)
		}
		// The expiry itself (Unix ms), not PTTL and TIME read one after the
		// other: on a loaded machine ms pass between those two reads.
		expiry, err := rdb.Do(ctx, "PEXPIRETIME", keys[0]).Int64()
		if err != nil {
			t.Fatal(err)
		}
		full := ts + (capUnits-units+limit-1)/limit // when the bucket is full again
		if expiry < full {
			t.Fatalf("decision %d: the key expires at %d, before the bucket is full at %d (state %q)", i, expiry, full, v)
		}
		if sec := ts / 1000; sec != prevSec {
			seconds++
			prevSec = sec
			// Set at the second's first write, as an absolute time (PXAT):
			// exactly the next second + TTL + 1 s, however late Redis runs
			// the SET after reading its clock (a PX from TIME was 1 ms past
			// it in a loaded make test).
			if want := (sec+1)*1000 + base + 1000; expiry != want {
				t.Errorf("decision %d: expiry %d, want the next second + TTL + 1 s (%d)", i, expiry, want)
			}
		}
		if expiry != prevExpiry {
			sets++
		}
		prevExpiry = expiry
		time.Sleep(60 * time.Millisecond)
	}
	if seconds < 3 || sets > seconds {
		t.Errorf("the TTL was set %d times over %d seconds of Redis's clock, want at most once a second", sets, seconds)
	}
}

// The script runs by EVALSHA; after SCRIPT FLUSH (a restarted or failed-over
// Redis) the NOSCRIPT reply makes the client load it again, with no error.
func TestScriptReloadsAfterNoScript(t *testing.T) {
	rdb := redistest.Server(t)
	l := newLimiter(t, rdb, `
domain: t
rules: [{id: r, match: [{key: user}], limit: 2, period: 1m}]`)
	run(t, l, []step{{ms: 0, user: "u", outcome: decision.Allowed, remaining: 1}})
	if err := rdb.ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	run(t, l, []step{{ms: 1, user: "u", outcome: decision.Allowed, remaining: 0}})
	stats, _ := rdb.Info(context.Background(), "commandstats").Result()
	if !strings.Contains(stats, "cmdstat_evalsha:") {
		t.Errorf("the script never ran by EVALSHA:\n%s", stats)
	}
}

// A global rule enforces this region's share of its limit: the static split
// 1/Regions without a share, the aggregator's fraction once Refresh has read
// it from Redis, and the static split again once that share is stale.
func TestGlobalRuleUsesItsShare(t *testing.T) {
	backends(t, func(t *testing.T, rdb redis.UniversalClient) {
		set := mustSet(t, `
domain: t
rules: [{id: g, match: [{key: user}], limit: 100, period: 1m, global: true}]`)
		l, err := enforcer.New(rdb, set, enforcer.Options{Budget: time.Second, Regions: 4, ShareTTL: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		check := func(ms int64, user string) enforcer.Decision {
			t.Helper()
			req := &enforcer.Request{Now: at(ms)}
			req.Descriptors[rules.KeyUser] = user
			d, err := l.Check(context.Background(), req)
			if err != nil || d.Err != nil {
				t.Fatal(err, d.Err)
			}
			return d
		}
		if d := check(0, "a"); d.Limit != 25 || d.Remaining != 24 || d.Shared {
			t.Fatalf("static split: limit %d remaining %d shared %v; want 25, 24, false", d.Limit, d.Remaining, d.Shared)
		}
		tag := rules.EntityTag(set.Rule("g"), &rules.Descriptors{rules.KeyUser: "b"})
		err = store.NewStore(rdb).PutShares(context.Background(), []rules.Share{
			{RuleID: "g", Key: tag, Region: "local", Fraction: 0.8, Version: 1, ComputedAt: at(0)},
			{RuleID: "g", Region: "local", Fraction: 0.1, Version: 1, ComputedAt: at(0)},
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Refresh(context.Background(), at(0)); err != nil {
			t.Fatal(err)
		}
		if d := check(1000, "b"); d.Limit != 80 || d.Remaining != 79 || !d.Shared {
			t.Errorf("entity share: limit %d remaining %d shared %v; want 80, 79, true", d.Limit, d.Remaining, d.Shared)
		}
		if d := check(1000, "c"); d.Limit != 10 || !d.Shared {
			t.Errorf("default share: limit %d shared %v; want 10, true", d.Limit, d.Shared)
		}
		if d := check(31000, "d"); d.Limit != 25 || d.Shared {
			t.Errorf("stale share: limit %d shared %v; want the static 25, false", d.Limit, d.Shared)
		}
		// A share stamped more than ShareTTL ahead (a skewed clock) is not fresh either.
		if d := check(-31000, "e"); d.Limit != 25 || d.Shared {
			t.Errorf("share from the future: limit %d shared %v; want the static 25, false", d.Limit, d.Shared)
		}
		if d := check(-29000, "f"); d.Limit != 10 || !d.Shared {
			t.Errorf("share 29 s ahead: limit %d shared %v; want 10, true", d.Limit, d.Shared)
		}
	})
}

// Nil arguments are refused, not a panic.
func TestNilArguments(t *testing.T) {
	l := newLimiter(t, redistest.Server(t), "domain: d\nrules: [{id: r, match: [{key: user}], limit: 1, period: 1s}]")
	if _, err := l.Check(context.Background(), nil); !errors.Is(err, enforcer.ErrBadRequest) {
		t.Errorf("nil request: %v, want ErrBadRequest", err)
	}
	if err := l.Decide(context.Background(), &enforcer.Request{}, nil); !errors.Is(err, enforcer.ErrBadRequest) {
		t.Errorf("nil decision: %v, want ErrBadRequest", err)
	}
	r := &enforcer.Request{}
	r.Descriptors[rules.KeyUser] = "u"
	//lint:ignore SA1012 a nil context is what this test passes
	if d, err := l.Check(nil, r); err != nil || d.Outcome != decision.Allowed { //nolint:staticcheck
		t.Errorf("nil context: %v %v, want allowed", d.Outcome, err)
	}
	if err := l.Release(context.Background(), nil); err != nil {
		t.Errorf("Release(nil): %v", err)
	}
}
