package enforcer_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// The engine's algorithms and keying: concurrency leases, IP keying, rule
// changes over live state, the sliding window's exact waits, and hostile
// descriptor values. Times are the caller's (Request.Now), ms after at(0),
// which is a multiple of 10 s since the epoch.

// engCheck decides one request at ms with the given descriptors (key, value
// pairs) and cost, failing the test on an error or a storage failure.
func engCheck(t *testing.T, l *enforcer.Limiter, ms int64, cost uint32, kv ...any) enforcer.Decision {
	t.Helper()
	r := &enforcer.Request{Now: at(ms), Cost: cost}
	for i := 0; i+1 < len(kv); i += 2 {
		r.Descriptors[kv[i].(rules.Key)] = kv[i+1].(string)
	}
	d, err := l.Check(context.Background(), r)
	if err != nil {
		t.Fatalf("at %d: %v", ms, err)
	}
	if d.Err != nil {
		t.Fatalf("at %d: storage error %v", ms, d.Err)
	}
	return d
}

// bucketKey is the Redis key of rule id (of set) for the descriptors d,
// as the enforcer names it.
func bucketKey(set *rules.Set, id string, d rules.Descriptors) string {
	r := set.Rule(id)
	return fmt.Sprintf("sl:{%s}:%s:%d", rules.EntityTag(r, &d), r.ID, r.Algorithm)
}

const ccRules = `
domain: c
rules:
  - {id: cc, algorithm: concurrency, match: [{key: user}], limit: 2, lease: 10s}
  - {id: tb, match: [{key: user}, {key: tenant}], limit: 1, period: 1h}`

func TestConcurrencyLeases(t *testing.T) {
	backends(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		set := mustSet(t, ccRules)
		l, err := enforcer.New(rdb, set, enforcer.Options{Budget: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		key := bucketKey(set, "cc", rules.Descriptors{rules.KeyUser: "u"})
		held := func(want int64) {
			t.Helper()
			if n := rdb.ZCard(ctx, key).Val(); n != want {
				t.Errorf("%d leases in Redis, want %d", n, want)
			}
		}
		allowed := func(d enforcer.Decision, remaining int64, reset time.Duration) {
			t.Helper()
			if d.Outcome != decision.Allowed || len(d.Leases) != 1 || d.Remaining != remaining || d.Reset != reset || d.Limit != 2 {
				t.Fatalf("got %v with %d leases, remaining %d reset %v limit %d; want allowed with 1 lease, remaining %d reset %v limit 2",
					d.Outcome, len(d.Leases), d.Remaining, d.Reset, d.Limit, remaining, reset)
			}
			if d.Leases[0].Key != key {
				t.Errorf("lease key %q, want %q", d.Leases[0].Key, key)
			}
		}
		denied := func(d enforcer.Decision, wait time.Duration) {
			t.Helper()
			if d.Outcome != decision.Denied || d.Reason != decision.ReasonOverLimit || d.Rule == nil || d.Rule.ID != "cc" ||
				d.Wait != wait || d.RetryAfter != (wait+time.Second-1)/time.Second*time.Second || len(d.Leases) != 0 || d.Remaining != 0 {
				t.Fatalf("got %v (%q by %v) wait %v retry %v leases %d remaining %d; want denied over_limit by cc, wait %v, no lease, remaining 0",
					d.Outcome, d.Reason, d.Rule, d.Wait, d.RetryAfter, len(d.Leases), d.Remaining, wait)
			}
			if d.RetryAfter <= 0 || d.RetryAfter > 10*time.Second {
				t.Errorf("Retry-After %v: want within (0, lease TTL]", d.RetryAfter)
			}
		}
		u := func(ms int64) enforcer.Decision { return engCheck(t, l, ms, 0, rules.KeyUser, "u") }

		d1 := u(0)
		allowed(d1, 1, 0)
		d2 := u(100)
		allowed(d2, 0, 9900*time.Millisecond) // the first lease runs out at 10 000
		if d1.Leases[0].ID == d2.Leases[0].ID {
			t.Fatalf("two requests hold the same lease id %q", d1.Leases[0].ID)
		}
		held(2)
		denied(u(200), 9800*time.Millisecond)
		held(2) // the denied request took no lease

		if err := l.Release(ctx, &d1); err != nil || len(d1.Leases) != 0 {
			t.Fatalf("Release: %v, %d leases left on the decision", err, len(d1.Leases))
		}
		held(1)
		if err := l.Release(ctx, &d1); err != nil { // nothing left to release
			t.Fatal(err)
		}
		held(1)
		d5 := u(300)
		allowed(d5, 0, 9800*time.Millisecond) // d2's lease runs out at 10 100
		held(2)

		// Not released, d2's lease (from 100) frees itself at 100 + 10 s.
		denied(u(10_099), time.Millisecond)
		d7 := u(10_100)
		allowed(d7, 0, 200*time.Millisecond) // d5's runs out at 10 300
		held(2)
		if err := l.Release(ctx, &d2); err != nil { // expired already: removes nothing else
			t.Fatal(err)
		}
		held(2)
		denied(u(10_200), 100*time.Millisecond)
		if ttl := rdb.PTTL(ctx, key).Val(); ttl <= 60*time.Second || ttl > 70*time.Second {
			t.Errorf("PTTL %v: want the lease TTL plus the caller-clock slack, in (60 s, 70 s]", ttl)
		}

		// A request denied by another rule takes no concurrency slot.
		vkey := bucketKey(set, "cc", rules.Descriptors{rules.KeyUser: "v"})
		a := engCheck(t, l, 0, 0, rules.KeyUser, "v", rules.KeyTenant, "T")
		if a.Outcome != decision.Allowed || len(a.Leases) != 1 || len(a.Statuses) != 2 {
			t.Fatalf("v with tenant: %v, %d leases, %d rules", a.Outcome, len(a.Leases), len(a.Statuses))
		}
		if err := l.Release(ctx, &a); err != nil {
			t.Fatal(err)
		}
		b := engCheck(t, l, 1, 0, rules.KeyUser, "v", rules.KeyTenant, "T") // tb is empty
		if b.Outcome != decision.Denied || b.Rule.ID != "tb" || b.Reason != decision.ReasonOverLimit ||
			b.Wait != 3_599_999*time.Millisecond || b.RetryAfter != time.Hour || len(b.Leases) != 0 {
			t.Fatalf("v denied by tb: got %v by %v wait %v retry %v leases %d; want denied by tb, wait 3599.999s, retry 1h, no lease",
				b.Outcome, b.Rule, b.Wait, b.RetryAfter, len(b.Leases))
		}
		if s := status(t, &b, "cc"); s.Remaining != 2 || s.Denied {
			t.Errorf("cc after a deny by tb: remaining %d denied %v; want 2 free slots, not denied", s.Remaining, s.Denied)
		}
		if n := rdb.ZCard(ctx, vkey).Val(); n != 0 {
			t.Errorf("%d leases for v after a deny by another rule, want 0", n)
		}
		for i, want := range []decision.Outcome{decision.Allowed, decision.Allowed, decision.Denied} {
			if d := engCheck(t, l, 2+int64(i), 0, rules.KeyUser, "v"); d.Outcome != want {
				t.Errorf("v request %d: %v, want %v: both slots must still be free", i+1, d.Outcome, want)
			}
		}
	})
}

// Two enforcers on one Redis share a concurrency limit: their leases must
// not collide, whatever the enforcers' options.
func TestConcurrencyLeasesOfTwoLimitersAreDistinct(t *testing.T) {
	backends(t, func(t *testing.T, rdb redis.UniversalClient) {
		set := mustSet(t, ccRules)
		l1, err := enforcer.New(rdb, set, enforcer.Options{Budget: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		l2, err := enforcer.New(rdb, set, enforcer.Options{Budget: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		d1 := engCheck(t, l1, 0, 0, rules.KeyUser, "u")
		d2 := engCheck(t, l2, 1, 0, rules.KeyUser, "u")
		if d1.Outcome != decision.Allowed || d2.Outcome != decision.Allowed {
			t.Fatalf("%v, %v: want both allowed", d1.Outcome, d2.Outcome)
		}
		if d1.Leases[0].ID == d2.Leases[0].ID {
			t.Errorf("two enforcers gave two requests the same lease id %q: they hold one slot between them", d1.Leases[0].ID)
		}
		if d := engCheck(t, l1, 2, 0, rules.KeyUser, "u"); d.Outcome != decision.Denied {
			t.Errorf("third request in flight: %v, want denied (limit 2)", d.Outcome)
		}
	})
}

func TestIPv6AndIPv4Keying(t *testing.T) {
	backends(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		set64 := mustSet(t, "domain: ip\nrules: [{id: ip, match: [{key: client_ip}], limit: 1, period: 1m}]")
		set128 := mustSet(t, "domain: ip\nrules: [{id: ip128, match: [{key: client_ip}], limit: 1, period: 1m}]")
		var recs []decision.Record
		l64, err := enforcer.New(rdb, set64, enforcer.Options{Budget: time.Second, Sink: sinkFunc(func(r decision.Record) { recs = append(recs, r) })})
		if err != nil {
			t.Fatal(err)
		}
		l128, err := enforcer.New(rdb, set128, enforcer.Options{Budget: time.Second, IPv6Prefix: 128})
		if err != nil {
			t.Fatal(err)
		}
		ms := int64(0)
		check := func(l *enforcer.Limiter, ip string, want decision.Outcome) {
			t.Helper()
			ms++
			r := &enforcer.Request{Now: at(ms), RequestID: "req"}
			r.Descriptors[rules.KeyClientIP] = ip
			r.Descriptors[rules.KeyUser] = "someone"
			before := r.Descriptors
			d, err := l.Check(ctx, r)
			if err != nil || d.Err != nil {
				t.Fatalf("%s: %v %v", ip, err, d.Err)
			}
			if d.Outcome != want {
				t.Errorf("%s: %v, want %v", ip, d.Outcome, want)
			}
			if r.Descriptors != before {
				t.Errorf("%s: the caller's descriptors changed to %q", ip, r.Descriptors)
			}
		}
		keyed := func(set *rules.Set, id, norm string) {
			t.Helper()
			k := bucketKey(set, id, rules.Descriptors{rules.KeyClientIP: norm})
			if n := rdb.Exists(ctx, k).Val(); n != 1 {
				t.Errorf("no bucket keyed by %q (%s)", norm, k)
			}
		}
		notKeyed := func(set *rules.Set, id, raw string) {
			t.Helper()
			k := bucketKey(set, id, rules.Descriptors{rules.KeyClientIP: raw})
			if n := rdb.Exists(ctx, k).Val(); n != 0 {
				t.Errorf("a bucket keyed by the raw %q exists", raw)
			}
		}

		// The default /64.
		check(l64, "2001:db8:1:2::1", decision.Allowed)
		check(l64, "2001:db8:1:2:ffff::9", decision.Denied)
		check(l64, "2001:DB8:1:2::ABCD", decision.Denied)
		check(l64, "2001:db8:1:3::1", decision.Allowed)
		keyed(set64, "ip", "2001:db8:1:2::/64")
		keyed(set64, "ip", "2001:db8:1:3::/64")
		notKeyed(set64, "ip", "2001:db8:1:2::1")
		check(l64, "::ffff:192.0.2.7", decision.Allowed)
		check(l64, "192.0.2.7", decision.Denied)
		check(l64, "192.0.2.8", decision.Allowed)
		check(l64, "::ffff:c000:208", decision.Denied) // 192.0.2.8, mapped, in hex
		keyed(set64, "ip", "192.0.2.7")
		notKeyed(set64, "ip", "::ffff:192.0.2.7")
		check(l64, "fe80::1%eth0", decision.Allowed)
		check(l64, "fe80::2", decision.Denied)
		keyed(set64, "ip", "fe80::/64")
		// Ports (http.Request.RemoteAddr), an IPv4 zone and spaces do not make new buckets.
		check(l64, "198.51.100.1", decision.Allowed)
		check(l64, "198.51.100.1:5555", decision.Denied)
		check(l64, " 198.51.100.1 ", decision.Denied)
		check(l64, "198.51.100.1%eth0", decision.Denied)
		check(l64, "[2001:db8:9:9::1]:443", decision.Allowed)
		check(l64, "2001:db8:9:9::2", decision.Denied)
		check(l64, "[::ffff:198.51.100.1]:80", decision.Denied)
		keyed(set64, "ip", "2001:db8:9:9::/64")
		check(l64, "host.example", decision.Allowed)
		check(l64, "host.example", decision.Denied)
		check(l64, "host.example.", decision.Allowed)
		keyed(set64, "ip", "host.example")

		// /128: every address its own bucket.
		check(l128, "2001:db8:1:2::1", decision.Allowed)
		check(l128, "2001:db8:1:2:ffff::9", decision.Allowed)
		check(l128, "2001:db8:1:2::1", decision.Denied)
		check(l128, "2001:0db8:0001:0002:0000:0000:0000:0001", decision.Denied)
		keyed(set128, "ip128", "2001:db8:1:2::1")
		keyed(set128, "ip128", "2001:db8:1:2:ffff::9")
		check(l128, "fe80::1%eth0", decision.Allowed)
		check(l128, "fe80::1", decision.Denied) // the zone is not part of the key
		check(l128, "fe80::1%eth1", decision.Denied)
		check(l128, "fe80::2%eth0", decision.Allowed)
		keyed(set128, "ip128", "fe80::1")
		notKeyed(set128, "ip128", "fe80::1%eth0")
		check(l128, "::ffff:192.0.2.7", decision.Allowed)
		check(l128, "192.0.2.7", decision.Denied)
		check(l128, "host.example", decision.Allowed)
		keyed(set128, "ip128", "host.example")

		// The decision record carries the caller's descriptors as given.
		wantRecs := []string{"2001:db8:1:2::1", "2001:db8:1:2:ffff::9", "2001:DB8:1:2::ABCD", "2001:db8:1:3::1",
			"::ffff:192.0.2.7", "192.0.2.7", "192.0.2.8", "::ffff:c000:208", "fe80::1%eth0", "fe80::2",
			"198.51.100.1", "198.51.100.1:5555", " 198.51.100.1 ", "198.51.100.1%eth0", "[2001:db8:9:9::1]:443", "2001:db8:9:9::2", "[::ffff:198.51.100.1]:80",
			"host.example", "host.example", "host.example."}
		if len(recs) != len(wantRecs) {
			t.Fatalf("%d records, want %d", len(recs), len(wantRecs))
		}
		for i, want := range wantRecs {
			r := recs[i]
			if r.Descriptors[rules.KeyClientIP] != want || r.Descriptors[rules.KeyUser] != "someone" || len(r.Matched) != 1 || r.Matched[0] != "ip" {
				t.Errorf("record %d: client_ip %q user %q matched %v; want %q, someone, [ip]", i, r.Descriptors[rules.KeyClientIP], r.Descriptors[rules.KeyUser], r.Matched, want)
			}
		}

		for _, p := range []int{-1, 129} {
			if _, err := enforcer.New(rdb, set64, enforcer.Options{Budget: time.Second, IPv6Prefix: p}); err == nil {
				t.Errorf("IPv6Prefix %d accepted", p)
			}
		}
	})
}

func TestRuleChangeKeepsTokenBucketState(t *testing.T) {
	backends(t, func(t *testing.T, rdb redis.UniversalClient) {
		const (
			A = "{id: r, match: [{key: user}], limit: 10, period: 1m, burst: 10}"
			B = "{id: r, match: [{key: user}], limit: 20, period: 1m, burst: 20}"  // raised
			C = "{id: r, match: [{key: user}], limit: 10, period: 1m, burst: 2}"   // lowered capacity
			D = "{id: r, match: [{key: user}], limit: 10, period: 30s, burst: 10}" // changed period
		)
		set := func(r string) *rules.Set { return mustSet(t, "domain: rc\nrules: ["+r+"]") }
		l, err := enforcer.New(rdb, set(A), enforcer.Options{Budget: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		type want struct {
			outcome    decision.Outcome
			reason     decision.Reason
			remaining  int64
			limit      int64
			wait       time.Duration
			retryAfter time.Duration
		}
		step := func(ms int64, cost uint32, w want) {
			t.Helper()
			d := engCheck(t, l, ms, cost, rules.KeyUser, "u")
			got := want{d.Outcome, d.Reason, d.Remaining, d.Limit, d.Wait, d.RetryAfter}
			if got != w {
				t.Errorf("at %d cost %d: got %+v, want %+v", ms, cost, got, w)
			}
		}
		const ok, no = decision.Allowed, decision.Denied
		over := decision.ReasonOverLimit
		// A: 10 a minute; 6 taken, 4 whole tokens left (240 000 units of 60 000).
		step(0, 6, want{ok, 0, 4, 10, 0, 0})
		// Raised to 20 a minute: the 4 tokens stay, none are added at once.
		l.SetRules(set(B))
		step(0, 5, want{no, over, 4, 20, 3 * time.Second, 3 * time.Second}) // 1 token short at 20/min: 3 s
		step(0, 4, want{ok, 0, 0, 20, 0, 0})                                // allowed under A, allowed still
		step(30_000, 1, want{ok, 0, 9, 20, 0, 0})                           // 30 s at 20/min = 10 tokens
		// Lowered to a capacity of 2: the 9 tokens clamp to 2, nothing minted.
		l.SetRules(set(C))
		step(30_000, 1, want{ok, 0, 1, 2, 0, 0})
		step(30_000, 1, want{ok, 0, 0, 2, 0, 0})
		step(30_000, 1, want{no, over, 0, 2, 6 * time.Second, 6 * time.Second}) // 1 token at 10/min: 6 s
		step(30_000, 3, want{no, decision.ReasonCostExceedsCapacity, 0, 2, 0, 0})
		// Back to A: 21 s at 10/min refill 3.5 tokens; one taken leaves 2.5.
		l.SetRules(set(A))
		step(51_000, 1, want{ok, 0, 2, 10, 0, 0})
		// The period halves: 2.5 tokens of 1 min are 2.5 tokens of 30 s; the
		// 2 whole ones (and the half) are kept.
		l.SetRules(set(D))
		step(51_000, 3, want{no, over, 2, 10, 1500 * time.Millisecond, 2 * time.Second}) // half a token at 10/30 s: 1.5 s
		step(51_000, 2, want{ok, 0, 0, 10, 0, 0})
		step(51_000, 1, want{no, over, 0, 10, 1500 * time.Millisecond, 2 * time.Second})
		step(52_499, 1, want{no, over, 0, 10, time.Millisecond, time.Second})
		step(52_500, 1, want{ok, 0, 0, 10, 0, 0})
	})
}

const swRules = `
domain: sw
rules:
  - {id: sw, algorithm: sliding_window, match: [{key: user}], limit: 10, period: 10s}
  - {id: sw7, algorithm: sliding_window, match: [{key: api_key}], limit: 7, period: 3s}`

func TestSlidingExact(t *testing.T) {
	backends(t, func(t *testing.T, rdb redis.UniversalClient) {
		l := newLimiter(t, rdb, swRules)
		step := func(ms int64, want decision.Outcome, remaining int64, wait time.Duration) {
			t.Helper()
			d := engCheck(t, l, ms, 0, rules.KeyUser, "u")
			if d.Outcome != want || d.Remaining != remaining || d.Wait != wait {
				t.Errorf("at %d: %v remaining %d wait %v; want %v remaining %d wait %v", ms, d.Outcome, d.Remaining, d.Wait, want, remaining, wait)
			}
			if want == decision.Denied && (d.Reason != decision.ReasonOverLimit || d.RetryAfter != (wait+time.Second-1)/time.Second*time.Second) {
				t.Errorf("at %d: reason %q retry %v", ms, d.Reason, d.RetryAfter)
			}
		}
		for i := int64(0); i < 10; i++ {
			step(i*100, decision.Allowed, 9-i, 0)
		}
		// The 11th, at 1 000: this window is full. In the next one the 10
		// weigh (10 000 - e)/10 000 at e ms in, and one more fits when
		// 10 (10 000 - e)/10 000 + 0 + 1 <= 10, i.e. e >= 1 000: at 11 000.
		step(1000, decision.Denied, 0, 10_000*time.Millisecond)
		step(10_000, decision.Denied, 0, 1000*time.Millisecond)
		step(10_500, decision.Denied, 0, 500*time.Millisecond)
		step(10_999, decision.Denied, 0, time.Millisecond)
		step(11_000, decision.Allowed, 0, 0)
		// Now 1 in this window: 10 (10 000 - e)/10 000 + 1 + 1 <= 10 at e >= 2 000.
		step(11_000, decision.Denied, 0, 1000*time.Millisecond)
		step(11_999, decision.Denied, 0, time.Millisecond)
		step(12_000, decision.Allowed, 0, 0)
		// In the window after next, nothing of the first remains: 10 free.
		step(30_000, decision.Allowed, 9, 0)
	})
}

// A denied request's Wait lands on the first ms at which the same request
// is allowed, from random states of two sliding windows.
func TestSlidingExactWaitFromRandomStates(t *testing.T) {
	backends(t, func(t *testing.T, rdb redis.UniversalClient) {
		l := newLimiter(t, rdb, swRules)
		rng := rand.New(rand.NewPCG(2026, 3))
		type spec struct {
			key    rules.Key
			limit  int64
			period int64
		}
		specs := []spec{{rules.KeyUser, 10, 10_000}, {rules.KeyAPIKey, 7, 3000}}
		probes, sameWindow, laterWindow := 0, 0, 0
		for trial := 0; trial < 30; trial++ {
			sp := specs[trial%2]
			who := fmt.Sprintf("r%d", trial)
			ms := rng.Int64N(3 * sp.period)
			for i := 0; i < 40; i++ {
				ms += rng.Int64N(sp.period / 3)
				cost := uint32(1)
				if rng.IntN(4) == 0 {
					cost = uint32(1 + rng.Int64N(sp.limit))
				}
				d := engCheck(t, l, ms, cost, sp.key, who)
				if d.Outcome == decision.Allowed {
					continue
				}
				if d.Outcome != decision.Denied || d.Reason != decision.ReasonOverLimit || d.Wait <= 0 ||
					d.RetryAfter != (d.Wait+time.Second-1)/time.Second*time.Second {
					t.Fatalf("trial %d at %d cost %d: %v %q wait %v retry %v", trial, ms, cost, d.Outcome, d.Reason, d.Wait, d.RetryAfter)
				}
				w := d.Wait.Milliseconds()
				if before := engCheck(t, l, ms+w-1, cost, sp.key, who); before.Outcome != decision.Denied || before.Wait != time.Millisecond {
					t.Fatalf("trial %d: denied at %d cost %d with wait %d ms, but at %d (1 ms early): %v wait %v; want denied, wait 1ms",
						trial, ms, cost, w, ms+w-1, before.Outcome, before.Wait)
				}
				if after := engCheck(t, l, ms+w, cost, sp.key, who); after.Outcome != decision.Allowed {
					t.Fatalf("trial %d: denied at %d cost %d with wait %d ms, but at %d: %v, want allowed", trial, ms, cost, w, ms+w, after.Outcome)
				}
				probes++
				// at(0) is a multiple of both periods: windows are ms / period.
				if (ms+w)/sp.period == ms/sp.period {
					sameWindow++
				} else {
					laterWindow++
				}
				ms += w
			}
		}
		t.Logf("%d denies probed: %d waits within the window, %d into a later one", probes, sameWindow, laterWindow)
		if probes < 100 || sameWindow < 20 || laterWindow < 20 {
			t.Errorf("%d denies probed (%d waits within the window, %d into a later one): too few to mean anything", probes, sameWindow, laterWindow)
		}
	})
}

func TestHostileKeys(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	set := mustSet(t, `
domain: h
rules:
  - {id: tb, match: [{key: user}], limit: 1, period: 1h}
  - {id: sw, algorithm: sliding_window, match: [{key: user}], limit: 1, period: 1h}
  - {id: fw, algorithm: fixed_window, match: [{key: user}], limit: 1, period: 1h}
  - {id: cc, algorithm: concurrency, match: [{key: user}], limit: 1, lease: 1m}
  - {id: ut, match: [{key: user}, {key: tenant}], limit: 1, period: 1h}
  - {id: pair, match: [{key: api_key}, {key: route}], limit: 1, period: 1h}`)
	l, err := enforcer.New(rdb, set, enforcer.Options{Budget: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("{}:\n\x00", 2048) // 10 KiB
	hostile := []string{"{", "}", "}{", "\n", ":", "\x00", big}
	for _, v := range hostile {
		d := engCheck(t, l, 0, 0, rules.KeyUser, v, rules.KeyTenant, v)
		if d.Outcome != decision.Allowed || len(d.Statuses) != 5 {
			t.Fatalf("%q: %v with %d rules, want allowed by 5", v[:min(len(v), 8)], d.Outcome, len(d.Statuses))
		}
		if d := engCheck(t, l, 1, 0, rules.KeyUser, v, rules.KeyTenant, v); d.Outcome != decision.Denied {
			t.Errorf("%q again: %v, want denied (each bucket holds 1)", v[:min(len(v), 8)], d.Outcome)
		}
	}
	// The fixed window of at(0) starts at 1 699 999 200 000 (472 222 hours).
	fwKey := bucketKey(set, "fw", rules.Descriptors{rules.KeyUser: big}) + ":1699999200000"
	if rdb.Exists(ctx, fwKey).Val() != 1 {
		t.Errorf("no key %s", fwKey)
	}
	// Values that differ only in where a separator falls are different entities.
	for i, p := range []struct {
		key, route string
		want       decision.Outcome
	}{
		{"a:b", "c", decision.Allowed}, {"a", "b:c", decision.Allowed},
		{"ab", "c", decision.Allowed}, {"a", "bc", decision.Allowed},
		{"a}", "{c", decision.Allowed}, {"a}{", "c", decision.Allowed},
		{"a:b", "c", decision.Denied},
	} {
		if d := engCheck(t, l, 2, 0, rules.KeyAPIKey, p.key, rules.KeyRoute, p.route); d.Outcome != p.want {
			t.Errorf("pair %d (%q, %q): %v, want %v", i, p.key, p.route, d.Outcome, p.want)
		}
	}

	keys, err := rdb.Keys(ctx, "sl:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := len(hostile)*5 + 6; len(keys) != want {
		t.Errorf("%d keys, want %d: 5 per hostile value and 6 pairs", len(keys), want)
	}
	shape := regexp.MustCompile(`^sl:\{[0-9a-f]{32}\}:(tb:0|sw:1|fw:2:1699999200000|cc:3|ut:0|pair:0)$`)
	for _, k := range keys {
		if strings.Count(k, "{") != 1 || strings.Count(k, "}") != 1 || !shape.MatchString(k) {
			t.Errorf("key %q: want sl:{32 hex}:rule:algorithm with exactly one hash tag", k)
		}
		if ttl := rdb.PTTL(ctx, k).Val(); ttl <= 0 {
			t.Errorf("key %q: PTTL %v, want > 0", k, ttl)
		}
	}
}

// TestDomain: a request names the rule set it is checked against; another
// domain's request matches none of this set's rules, an empty domain means
// the set's own.
func TestDomain(t *testing.T) {
	l := newLimiter(t, redistest.Server(t), "domain: api\nrules: [{id: r, match: [{key: user}], limit: 1, period: 1m}]")
	check := func(domain string) enforcer.Decision {
		r := req(0, 1, rules.KeyUser, "u")
		r.Domain = domain
		return decide(t, l, r)
	}
	if d := check("api"); d.Outcome != decision.Allowed || len(d.Statuses) != 1 {
		t.Fatalf("own domain: %v with %d rules", d.Outcome, len(d.Statuses))
	}
	if d := check(""); d.Outcome != decision.Denied {
		t.Errorf("empty domain: %v, want denied by the set's rule", d.Outcome)
	}
	if d := check("other"); d.Outcome != decision.Allowed || len(d.Statuses) != 0 {
		t.Errorf("another domain: %v with %d rules; want allowed by no rule", d.Outcome, len(d.Statuses))
	}
}

// TestConcurrencyHeaders: a concurrency limit is not a rate policy, so it is
// not in RateLimit-Policy; when it binds, RateLimit's reset is the time until
// a slot frees, the same as the status says.
func TestConcurrencyHeaders(t *testing.T) {
	l := newLimiter(t, redistest.Server(t), `
domain: c
rules:
  - {id: cc, algorithm: concurrency, match: [{key: user}], limit: 1, lease: 5s}
  - {id: rate, match: [{key: user}], limit: 100, period: 1m}`)
	d := decide(t, l, req(0, 1, rules.KeyUser, "u"))
	if d.Outcome != decision.Allowed || header(&d, "RateLimit-Policy") != `"rate";q=100;w=60` {
		t.Errorf("policy %q, want only the rate rule", header(&d, "RateLimit-Policy"))
	}
	l2 := newLimiter(t, redistest.Server(t), `
domain: c
rules: [{id: cc, algorithm: concurrency, match: [{key: user}], limit: 1, lease: 5s}]`)
	d = decide(t, l2, req(0, 1, rules.KeyUser, "u"))
	if st := status(t, &d, "cc"); d.Outcome != decision.Allowed || st.Remaining != 0 || st.Reset != 5*time.Second ||
		header(&d, "RateLimit") != `"cc";r=0;t=5` || header(&d, "X-RateLimit-Reset") != "5" {
		t.Errorf("last slot taken: reset %v, RateLimit %q, X-RateLimit-Reset %q; want 5s, t=5, 5", st.Reset, header(&d, "RateLimit"), header(&d, "X-RateLimit-Reset"))
	}
}

// TestConcurrencyDenyHeaders: when a concurrency limit denies, the policy
// RateLimit names is listed in RateLimit-Policy.
func TestConcurrencyDenyHeaders(t *testing.T) {
	l := newLimiter(t, redistest.Server(t), `
domain: c
rules:
  - {id: cc, algorithm: concurrency, match: [{key: user}], limit: 1, lease: 30s}
  - {id: rate, match: [{key: user}], limit: 100, period: 1m}`)
	decide(t, l, req(0, 1, rules.KeyUser, "u"))
	d := decide(t, l, req(2000, 1, rules.KeyUser, "u"))
	if d.Outcome != decision.Denied || header(&d, "RateLimit") != `"cc";r=0;t=28` || header(&d, "RateLimit-Policy") != `"cc";q=1, "rate";q=100;w=60` {
		t.Errorf("%v: RateLimit %q, Policy %q", d.Outcome, header(&d, "RateLimit"), header(&d, "RateLimit-Policy"))
	}
}

// TestBudgetUnderAMillisecondRefused: the script's deadline is in Redis's
// milliseconds, so a budget under 1 ms (a fresh user's --budget 1ns) would
// make every decision late; New refuses it, saying why.
func TestBudgetUnderAMillisecondRefused(t *testing.T) {
	set, err := rules.Parse("f.yaml", []byte("domain: f\nrules: [{id: r, match: [{key: user}], limit: 1, period: 1s}]"))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redistest.Server(t)
	for _, b := range []time.Duration{time.Nanosecond, 999 * time.Microsecond} {
		if _, err := enforcer.New(rdb, set, enforcer.Options{Budget: b}); err == nil || !strings.Contains(err.Error(), "at least 1ms") {
			t.Errorf("Budget %s: %v, want an error saying at least 1ms", b, err)
		}
	}
	if _, err := enforcer.New(rdb, set, enforcer.Options{Budget: time.Millisecond}); err != nil {
		t.Errorf("Budget 1ms: %v", err)
	}
}
