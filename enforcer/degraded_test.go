package enforcer_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/internal/syncbuf"
	"github.com/sluice-rl/sluice/rules"
)

// Degraded decisions that know what Redis knew: the fallback continues from
// Redis's last answer per key, owes Redis what it grants, divides by the
// region's enforcers as learned through Redis, and answers shed checks.

// seriesValue returns the value of the one series of name with the given
// label pairs in reg (a counter's or a gauge's).
func seriesValue(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
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
					found = found || lp.GetName() == labels[i] && lp.GetValue() == labels[i+1]
				}
				if !found {
					continue series
				}
			}
			return m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no series %s%v", name, labels)
	return 0
}

// proxied returns a client of a fresh redis-server through a fault proxy,
// set up as the sidecar's (no retries, context deadlines, one dial).
func proxied(t *testing.T) (*redis.Client, *redistest.Proxy) {
	t.Helper()
	p := redistest.NewProxy(t, redistest.Addr(t))
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true, DialerRetries: 1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { c.Close() })
	return c, p
}

// reachable waits until rdb's pool dials again: after as many failed dials
// as its pool size, go-redis answers with the last dial error until a dial
// in the background (once a second) succeeds.
func reachable(t *testing.T, rdb redis.UniversalClient) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for rdb.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatal("Redis unreachable 5 s after the fault ended")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// outcomes decides n requests for user u at ms and counts the outcomes.
func outcomes(t *testing.T, l *enforcer.Limiter, ms int64, u string, n int) map[decision.Outcome]int {
	t.Helper()
	m := map[decision.Outcome]int{}
	for range n {
		m[decideAny(t, l, req(ms, 1, rules.KeyUser, u)).Outcome]++
	}
	return m
}

// TestFallbackContinuesFromRedis: with Redis gone, a key Redis had
// exhausted stays denied, a key with R left gets this enforcer's share of R
// (R ÷ instances), a key never seen a full local bucket; once Redis answers
// again, what the fallback granted is charged to Redis, so that the limit
// holds over the outage and after it.
func TestFallbackContinuesFromRedis(t *testing.T) {
	rdb, p := proxied(t)
	reg := prometheus.NewRegistry()
	l, err := enforcer.New(rdb, mustSet(t, `
domain: f
rules:
  - {id: hour, match: [{key: user}], limit: 10, period: 1h}
`), enforcer.Options{Budget: time.Second, Breaker: enforcer.BreakerOptions{Failures: 1000}, Fallback: enforcer.FallbackOptions{Instances: 2, Headroom: 1.2}, HotKeys: enforcer.HotKeyOptions{Table: -1}, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	if got := outcomes(t, l, 0, "spent", 12); got[decision.Allowed] != 10 || got[decision.Denied] != 2 {
		t.Fatalf("through Redis: %v, want 10 allowed and 2 denied", got)
	}
	if got := outcomes(t, l, 0, "half", 4); got[decision.Allowed] != 4 {
		t.Fatalf("through Redis: %v, want 4 allowed", got)
	}
	p.Inject(redistest.Refuse, 0)
	// One of two enforcers: the exhausted key gets nothing; the key with 6
	// left 3; a key never seen floor(10 × 1.2 ÷ 2) = 6, as before.
	for _, c := range []struct {
		user string
		want int
	}{{"spent", 0}, {"half", 3}, {"new", 6}} {
		got := outcomes(t, l, 10, c.user, 8)
		if got[decision.DegradedOpen] != c.want || got[decision.DegradedClosed] != 8-c.want {
			t.Errorf("%s with Redis down: %v, want %d degraded_open of 8", c.user, got, c.want)
		}
	}
	if n := seriesValue(t, reg, "sluice_enforcer_fallback_rules_total", "from", "remembered"); n != 16 {
		t.Errorf("%v rules decided from the remembered state, want 16", n)
	}
	if n := seriesValue(t, reg, "sluice_enforcer_debt_keys"); n != 2 {
		t.Errorf("%v keys owing, want 2 (half, new)", n)
	}
	d := decideAny(t, l, req(20, 1, rules.KeyUser, "spent"))
	if d.Reason != decision.ReasonLocalOverLimit || d.Wait < 6*time.Minute || d.Wait > 13*time.Minute {
		t.Errorf("the exhausted key: %v, wait %v; want local_over_limit until its share of a token refills (10 ÷ 2 × 1.2 an hour: 10 min)", d.Reason, d.Wait)
	}

	// Redis is back: the 9 units granted are charged (Refresh charges them,
	// as does the first answer), and Redis decides from there.
	p.Inject(redistest.Pass, 0)
	reachable(t, rdb)
	if err := l.Refresh(context.Background(), time.Now()); err != nil {
		t.Fatal(err)
	}
	if n := seriesValue(t, reg, "sluice_enforcer_debt_units_charged_total"); n != 9 {
		t.Errorf("%v units charged, want 9", n)
	}
	for _, c := range []struct {
		user string
		want int
	}{{"spent", 0}, {"half", 3}, {"new", 4}} {
		got := outcomes(t, l, 30, c.user, 8)
		if got[decision.Allowed] != c.want {
			t.Errorf("%s through Redis after the outage: %v, want %d allowed: 10 over the outage and after", c.user, got, c.want)
		}
	}
	if n := seriesValue(t, reg, "sluice_enforcer_debt_keys"); n != 0 {
		t.Errorf("%v keys still owing", n)
	}
}

// TestFallbackDebtsAcrossARestart: Redis restarted empty; what the fallback
// granted during the outage is charged to the new, empty Redis, whose
// keys start full: the key's limit holds over the outage and after it, not
// the limit again.
func TestFallbackDebtsAcrossARestart(t *testing.T) {
	rdb, p := proxied(t)
	l, err := enforcer.New(rdb, mustSet(t, `
domain: f
rules:
  - {id: hour, match: [{key: user}], limit: 10, period: 1h}
  - {id: win, match: [{key: tenant}], limit: 10, period: 1h, algorithm: fixed_window}
  - {id: slide, match: [{key: api_key}], limit: 10, period: 1h, algorithm: sliding_window}
`), enforcer.Options{Budget: time.Second, Breaker: enforcer.BreakerOptions{Failures: 1000}, Fallback: enforcer.FallbackOptions{Instances: 1, Headroom: 1}, HotKeys: enforcer.HotKeyOptions{Table: -1}})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []rules.Key{rules.KeyUser, rules.KeyTenant, rules.KeyAPIKey} {
		for range 4 {
			if d := decideAny(t, l, req(0, 1, k, "a")); d.Outcome != decision.Allowed {
				t.Fatalf("%v through Redis: %v", k, d.Outcome)
			}
		}
	}
	p.Inject(redistest.Refuse, 0)
	for _, k := range []rules.Key{rules.KeyUser, rules.KeyTenant, rules.KeyAPIKey} {
		n := 0
		for range 10 {
			if decideAny(t, l, req(10, 1, k, "a")).Outcome == decision.DegradedOpen {
				n++
			}
		}
		if n != 6 {
			t.Errorf("%v with Redis down: %d allowed, want the 6 Redis said were left", k, n)
		}
	}
	fresh := redistest.Addr(t) // Redis restarted empty
	p.SetUpstream(fresh)
	p.Inject(redistest.Pass, 0)
	reachable(t, rdb)
	if err := l.Refresh(context.Background(), time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, k := range []rules.Key{rules.KeyUser, rules.KeyTenant, rules.KeyAPIKey} {
		n := 0
		for range 10 {
			if decideAny(t, l, req(20, 1, k, "a")).Outcome == decision.Allowed {
				n++
			}
		}
		if n != 4 {
			t.Errorf("%v through the restarted Redis: %d allowed, want 4: the outage's 6 were charged to it", k, n)
		}
	}
	// Every key charged has a TTL.
	keys, err := rdb.Keys(context.Background(), "sl:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if ttl := rdb.PTTL(context.Background(), k).Val(); ttl <= 0 {
			t.Errorf("%s has no TTL (%v)", k, ttl)
		}
	}
}

// TestShedChecksAreDecided: a check that finds no place at the gate for its
// whole wait is answered by its rules' failure modes (and the remembered
// state), not refused with an error.
func TestShedChecksAreDecided(t *testing.T) {
	rdb, p := proxied(t)
	reg := prometheus.NewRegistry()
	l, err := enforcer.New(rdb, mustSet(t, `
domain: f
rules:
  - {id: open, match: [{key: user}], limit: 2, period: 1h}
  - {id: closed, match: [{key: tenant}], limit: 100, period: 1h, failure_mode: closed}
`), enforcer.Options{Budget: time.Second, MaxInFlight: 1, HotKeys: enforcer.HotKeyOptions{Table: -1}, Fallback: enforcer.FallbackOptions{Instances: 1, Headroom: 1}, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	// "spent" is exhausted in Redis.
	outcomes(t, l, 0, "spent", 3)
	// One decision holds the only place while Redis is slow.
	p.Inject(redistest.Delay, 500*time.Millisecond)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		decideAny(t, l, req(0, 1, rules.KeyUser, "holder"))
	}()
	time.Sleep(100 * time.Millisecond)
	shed := func(kv ...any) enforcer.Decision {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		defer cancel()
		var d enforcer.Decision
		if err := l.Decide(ctx, req(0, 1, kv...), &d); err != nil {
			t.Fatalf("a shed check returned an error: %v", err)
		}
		if d.Err != enforcer.ErrOverloaded || d.Path != decision.PathFallback {
			t.Fatalf("a shed check: err %v on %v, want ErrOverloaded on the fallback path", d.Err, d.Path)
		}
		return d
	}
	if d := shed(rules.KeyUser, "spent"); d.Outcome != decision.DegradedClosed || d.Reason != decision.ReasonLocalOverLimit {
		t.Errorf("shed, a key Redis had exhausted: %v (%v), want degraded_closed, local_over_limit", d.Outcome, d.Reason)
	}
	if d := shed(rules.KeyUser, "new"); d.Outcome != decision.DegradedOpen {
		t.Errorf("shed, a key never seen: %v, want degraded_open", d.Outcome)
	}
	if d := shed(rules.KeyTenant, "t"); d.Outcome != decision.DegradedClosed || d.Reason != decision.ReasonLimiterUnavailable {
		t.Errorf("shed, a fail-closed rule: %v (%v), want degraded_closed, limiter_unavailable", d.Outcome, d.Reason)
	}
	wg.Wait()
	if n := seriesValue(t, reg, "sluice_enforcer_shed_total"); n != 3 {
		t.Errorf("%v shed, want 3", n)
	}
	if n := seriesValue(t, reg, "sluice_enforcer_redis_errors_total", "cause", "timeout"); n != 0 {
		t.Errorf("%v Redis timeouts counted: a shed check is no Redis error", n)
	}
}

// TestInstancesLearnedThroughRedis: each enforcer's Refresh renews its
// heartbeat and learns how many are live; the count divides the local
// buckets, is kept while Redis is away, and --instances overrides it.
func TestInstancesLearnedThroughRedis(t *testing.T) {
	rdb, p := proxied(t)
	set := `
domain: f
rules:
  - {id: hour, match: [{key: user}], limit: 30, period: 1h}
`
	var ls []*enforcer.Limiter
	var regs []*prometheus.Registry
	for i := range 3 {
		reg := prometheus.NewRegistry()
		l, err := enforcer.New(rdb, mustSet(t, set), enforcer.Options{Instance: fmt.Sprint(i), Budget: time.Second, Breaker: enforcer.BreakerOptions{Failures: 1000}, Fallback: enforcer.FallbackOptions{Headroom: 1}, HotKeys: enforcer.HotKeyOptions{Table: -1}, Registerer: reg})
		if err != nil {
			t.Fatal(err)
		}
		ls, regs = append(ls, l), append(regs, reg)
	}
	if n := seriesValue(t, regs[0], "sluice_enforcer_fallback_instances"); n != 1 || seriesValue(t, regs[0], "sluice_enforcer_fallback_instances_learned") != 0 {
		t.Errorf("before a heartbeat: %v instances, want the default 1, not learned", n)
	}
	for range 2 {
		for _, l := range ls {
			if err := l.Refresh(context.Background(), time.Now()); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i, reg := range regs {
		if n := seriesValue(t, reg, "sluice_enforcer_fallback_instances"); n != 3 || seriesValue(t, reg, "sluice_enforcer_fallback_instances_learned") != 1 {
			t.Errorf("enforcer %d: %v instances, want 3 learned through Redis", i, n)
		}
	}
	reg := prometheus.NewRegistry()
	over, err := enforcer.New(rdb, mustSet(t, set), enforcer.Options{Fallback: enforcer.FallbackOptions{Instances: 5}, Budget: time.Second, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	if err := over.Refresh(context.Background(), time.Now()); err != nil {
		t.Fatal(err)
	}
	if n := seriesValue(t, reg, "sluice_enforcer_fallback_instances"); n != 5 || seriesValue(t, reg, "sluice_enforcer_fallback_instances_learned") != 0 {
		t.Errorf("overridden: %v instances, want 5", n)
	}
	if n, _ := rdb.ZCard(context.Background(), "sluice:instances").Result(); n != 3 {
		t.Errorf("%d heartbeats in Redis, want 3 (an override sends none)", n)
	}
	// One that stops leaves the count at once (found by a fresh user: a
	// graceful stop was counted until its heartbeat's TTL ran out).
	gone, err := enforcer.New(rdb, mustSet(t, set), enforcer.Options{Instance: "gone", Budget: time.Second, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	if err := gone.Refresh(context.Background(), time.Now()); err != nil {
		t.Fatal(err)
	}
	if n, _ := rdb.ZCard(context.Background(), "sluice:instances").Result(); n != 4 {
		t.Errorf("%d heartbeats in Redis, want 4", n)
	}
	gone.Close()
	if n, _ := rdb.ZCard(context.Background(), "sluice:instances").Result(); n != 3 {
		t.Errorf("%d heartbeats in Redis after one closed, want 3", n)
	}
	// Redis goes away: the count is kept, and a key never seen gets a
	// third of the rule.
	p.Inject(redistest.Refuse, 0)
	if err := ls[0].Refresh(context.Background(), time.Now()); err == nil {
		t.Fatal("a refresh with Redis down succeeded")
	}
	if n := seriesValue(t, regs[0], "sluice_enforcer_fallback_instances"); n != 3 {
		t.Errorf("with Redis down: %v instances, want the 3 learned", n)
	}
	if got := outcomes(t, ls[0], 0, "u", 15); got[decision.DegradedOpen] != 10 {
		t.Errorf("a key never seen, with Redis down: %v, want 30 ÷ 3 = 10 degraded_open", got)
	}
}

// TestStartWithRedisDown: an enforcer that starts while Redis is down has
// no remembered state and says so; its fallback divides by the override,
// or else by DefaultInstances.
func TestStartWithRedisDown(t *testing.T) {
	for _, c := range []struct {
		instances, want int
		from            string
	}{{0, enforcer.DefaultInstances, "default"}, {4, 4, "override"}} {
		t.Run(c.from, func(t *testing.T) {
			var log bytes.Buffer
			reg := prometheus.NewRegistry()
			l, err := enforcer.New(deadRedis(t), mustSet(t, "domain: f\nrules: [{id: hour, match: [{key: user}], limit: 40, period: 1h}]"),
				enforcer.Options{Fallback: enforcer.FallbackOptions{Instances: c.instances, Headroom: 1}, Budget: time.Second, Registerer: reg,
					Logger: slog.New(slog.NewTextHandler(&log, nil))})
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Refresh(context.Background(), time.Now()); err == nil {
				t.Fatal("a refresh with Redis down succeeded")
			}
			if got := outcomes(t, l, 0, "u", 50); got[decision.DegradedOpen] != 40/c.want {
				t.Errorf("%v, want %d degraded_open: 40 ÷ %d", got, 40/c.want, c.want)
			}
			if n := seriesValue(t, reg, "sluice_enforcer_remembered_keys"); n != 0 {
				t.Errorf("%v keys remembered", n)
			}
			if n := seriesValue(t, reg, "sluice_enforcer_fallback_instances"); n != float64(c.want) {
				t.Errorf("%v instances, want %d", n, c.want)
			}
			out := log.String()
			if strings.Count(out, "no remembered Redis state") != 1 || !strings.Contains(out, "instances_from="+c.from) {
				t.Errorf("the log does not say once that there is no remembered state, from %s:\n%s", c.from, out)
			}
		})
	}
}

// TestLateScriptSentAgain: a call that reached Redis past its deadline (a
// sidecar that stalled before writing it, here a network that held it)
// committed nothing, so it is sent once more with a fresh deadline when the
// wait has room: Redis decides, and counts the request once.
func TestLateScriptSentAgain(t *testing.T) {
	rdb, p := proxied(t)
	reg := prometheus.NewRegistry()
	l, err := enforcer.New(rdb, mustSet(t, "domain: f\nrules: [{id: hour, match: [{key: user}], limit: 10, period: 1h}]"),
		enforcer.Options{Budget: 200 * time.Millisecond, HotKeys: enforcer.HotKeyOptions{Table: -1}, NoPipeline: true, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	decideAny(t, l, req(0, 1, rules.KeyUser, "warm")) // a connection in the pool
	p.Inject(redistest.Blackhole, 0)
	go func() {
		time.Sleep(250 * time.Millisecond) // past the script's deadline, within the 400 ms wait
		p.Inject(redistest.Pass, 0)
	}()
	d := decideAny(t, l, req(0, 1, rules.KeyUser, "u"))
	if d.Err != nil || d.Outcome != decision.Allowed || d.Remaining != 9 {
		t.Fatalf("%v (err %v), remaining %d; want allowed by Redis, 9 left: counted once", d.Outcome, d.Err, d.Remaining)
	}
	if n := seriesValue(t, reg, "sluice_enforcer_late_retries_total"); n != 1 {
		t.Errorf("%v late retries, want 1", n)
	}
}

// TestUnansweredGrantsAreOwed: checks whose calls Redis never answered (a
// frozen or blackholed Redis: timeouts while this process ran on time) are
// owed, and charged when Redis answers again: a fixed window lets its
// limit through over the outage and after, not the limit plus what the
// fallback granted meanwhile (a fresh user's 4 s SIGSTOP let 460 of 300
// through).
func TestUnansweredGrantsAreOwed(t *testing.T) {
	rdb, p := proxied(t)
	reg := prometheus.NewRegistry()
	l, err := enforcer.New(rdb, mustSet(t, "domain: f\nrules: [{id: fw, algorithm: fixed_window, match: [{key: user}], limit: 10, period: 1h}]"),
		enforcer.Options{Budget: 20 * time.Millisecond, Breaker: enforcer.BreakerOptions{Failures: 1000}, Fallback: enforcer.FallbackOptions{Instances: 1}, HotKeys: enforcer.HotKeyOptions{Table: -1}, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	// Warm: the connection dialled and the script loaded, on a key of its
	// own (a cold first call under the race detector on a loaded machine
	// can miss the 20 ms budget).
	for i := 0; decideAny(t, l, req(0, 1, rules.KeyUser, "warm")).Path != decision.PathRedis; i++ {
		if i == 50 {
			t.Fatal("no decision on Redis in 50 tries")
		}
	}
	if got := outcomes(t, l, 0, "u", 4); got[decision.Allowed] != 4 {
		t.Fatalf("through Redis: %v, want 4 allowed", got)
	}
	p.Inject(redistest.Blackhole, 0)
	// A grant is owed when its timeout was Redis's; one whose wait this
	// process stalled through is not (its answer may have come unread: see
	// enforcer's owes), so on a loaded machine the limit may be passed by
	// those grants, and by no others.
	granted, stalled := 0, 0
	for range 8 {
		d := decideAny(t, l, req(10, 1, rules.KeyUser, "u"))
		if d.Outcome == decision.DegradedOpen {
			granted++
			if errors.Is(d.Err, enforcer.ErrStalled) {
				stalled++
			}
		}
	}
	if granted == 0 {
		t.Fatalf("with Redis blackholed: nothing granted by the fallback, want some degraded_open")
	}
	p.Inject(redistest.Pass, 0)
	reachable(t, rdb)
	if err := l.Refresh(context.Background(), time.Now()); err != nil {
		t.Fatal(err)
	}
	if n := seriesValue(t, reg, "sluice_enforcer_debt_units_charged_total"); n != float64(granted-stalled) {
		t.Errorf("%v units charged, want the %d granted while Redis did not answer (%d more while this process stalled)", n, granted-stalled, stalled)
	}
	after := outcomes(t, l, 20, "u", 12)
	if total := 4 + granted + after[decision.Allowed]; total < 10 || total > 10+stalled {
		t.Errorf("allowed 4 before, %d during (%d while this process stalled), %d after the outage: %d in all, want the limit, 10", granted, stalled, after[decision.Allowed], total)
	}
}

// TestUnderTheLimitThroughAnOutage: found by a fresh user. A client at 7
// requests a second under a 10/s token bucket (burst 20), through a 10 s
// outage decided by the fallback from Redis's last answer, was denied 100%
// for 4 to 7 s after Redis came back: the 70 units granted were charged
// all at once, against a bucket whose refill over the outage had been
// capped at 20. Had every request reached Redis none would have been
// denied; none may be after the charge (on the caller's clock: exact).
//
// Found again by a fresh user, without the refresh: the first decision after
// the recovery reached Redis before the charge its answer started, wrote the
// key, and the charge, finding the key written after its first grant,
// charged the 70 units at once (6.5 s denied). A decision for a key the
// fallback owes for now charges the debts first; the case "first decision"
// leaves the charge to it (it fails without chargeFirst: 17 of 21 denied);
// "breaker" has the circuit breaker open through the outage, so that the
// first decision after it is a half-open probe, and its charge one too (it
// passes without chargeFirst too: here the charge its answer started lands
// first; it checks that charging as a probe closes the breaker).
func TestUnderTheLimitThroughAnOutage(t *testing.T) {
	t.Run("refresh", func(t *testing.T) { underTheLimitThroughAnOutage(t, true, false) })
	t.Run("first decision", func(t *testing.T) { underTheLimitThroughAnOutage(t, false, false) })
	t.Run("breaker", func(t *testing.T) { underTheLimitThroughAnOutage(t, false, true) })
}

func underTheLimitThroughAnOutage(t *testing.T, refresh, breaker bool) {
	rdb, p := proxied(t)
	opts := enforcer.Options{Budget: time.Second, Breaker: enforcer.BreakerOptions{Failures: 1000}, Fallback: enforcer.FallbackOptions{Instances: 1, Headroom: 1}, HotKeys: enforcer.HotKeyOptions{Table: -1}}
	const cooldown = 200 * time.Millisecond
	if breaker {
		opts.Breaker.Failures, opts.Breaker.Cooldown, opts.Breaker.Ramp = 2, cooldown, -1
	}
	l, err := enforcer.New(rdb, mustSet(t, "domain: f\nrules: [{id: r, match: [{key: user}], limit: 10, period: 1s, burst: 20}]"), opts)
	if err != nil {
		t.Fatal(err)
	}
	const step = 1000 / 7 // ms between requests
	ms := int64(0)
	for range 7 {
		if d := decideAny(t, l, req(ms, 1, rules.KeyUser, "u")); d.Outcome != decision.Allowed {
			t.Fatalf("at %d ms through Redis: %v", ms, d.Outcome)
		}
		ms += step
	}
	p.Inject(redistest.Refuse, 0)
	for range 70 {
		if d := decideAny(t, l, req(ms, 1, rules.KeyUser, "u")); d.Outcome != decision.DegradedOpen {
			t.Fatalf("at %d ms with Redis down: %v, want allowed by the fallback", ms, d.Outcome)
		}
		ms += step
	}
	p.Inject(redistest.Pass, 0)
	reachable(t, rdb)
	if breaker {
		if !l.BreakerOpen() {
			t.Fatal("the breaker is not open after the outage")
		}
		time.Sleep(cooldown + 50*time.Millisecond) // half-open: the next decision is a probe
	}
	if refresh {
		if err := l.Refresh(context.Background(), time.Now()); err != nil { // charges the debts
			t.Fatal(err)
		}
	}
	denied := 0
	for range 21 {
		d := decideAny(t, l, req(ms, 1, rules.KeyUser, "u"))
		if d.Outcome == decision.Denied {
			denied++
		} else if d.Outcome != decision.Allowed {
			t.Fatalf("at %d ms, Redis back: %v", ms, d.Outcome)
		}
		ms += step
	}
	if denied > 0 {
		t.Errorf("%d of 21 requests at 7/s denied after the outage's debt was charged, want none: the client never passed 10/s", denied)
	}
}

// TestRampSendsNewKeysToRedis: found by a fresh user. In the breaker's ramp
// after a recovery, a decision the ramp kept off Redis for a key Redis had
// never answered for was granted from a full local bucket (limit ×
// Headroom) while the ramp's other decisions got the same key's whole limit
// from Redis: a fixed window of 50 let up to 110 through in the second
// after a 0.5 s stall. In the ramp, a key Redis has not answered for goes to
// Redis; one it has is kept off until its place in the ramp (decided from
// what Redis said).
func TestRampSendsNewKeysToRedis(t *testing.T) {
	const known = 20
	l, _ := rampLimiter(t, "domain: f\nrules: [{id: fw, algorithm: fixed_window, match: [{key: user}], limit: 50, period: 1h}]", time.Minute, known, 0)
	// The ramp (a minute, from a tenth of the keys on Redis) is on.
	kept := 0
	for i := range 2 * known {
		if d := decideAny(t, l, req(0, 1, rules.KeyUser, fmt.Sprint("known-", i%known))); errors.Is(d.Err, enforcer.ErrBreakerRamp) {
			kept++
		}
	}
	if kept < known {
		t.Fatalf("the ramp kept %d of %d decisions on keys Redis knows off Redis, want most: the ramp is not on", kept, 2*known)
	}
	for i := range 40 {
		if d := decideAny(t, l, req(0, 1, rules.KeyUser, fmt.Sprint("new-", i))); d.Path != decision.PathRedis {
			t.Errorf("a key Redis never answered for, in the ramp: %v (%v), want decided on Redis", d.Path, d.Err)
		}
	}
}

// rampLimiter returns a limiter of yaml (Fallback.Instances 1) whose breaker has
// just closed after an outage: Redis answered one decision on each of the
// keys known-0 … known-(known−1) (user), then refused until the breaker
// opened, while the first spent of them were sent one more decision each
// (decided by the fallback, from what Redis said); then Redis came
// back and a probe closed the breaker, so that its ramp (of the duration
// given) has begun. It returns the decisions allowed per key so far.
func rampLimiter(t *testing.T, yaml string, ramp time.Duration, known, spent int) (*enforcer.Limiter, map[string]int) {
	t.Helper()
	rdb, p := proxied(t)
	reg := prometheus.NewRegistry()
	l, err := enforcer.New(rdb, mustSet(t, yaml),
		enforcer.Options{Budget: time.Second, Breaker: enforcer.BreakerOptions{Failures: 2, Cooldown: 200 * time.Millisecond, Ramp: ramp},
			Fallback: enforcer.FallbackOptions{Instances: 1}, HotKeys: enforcer.HotKeyOptions{Table: -1, LeaseBlock: -1}, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[string]int{}
	decideOn := func(u string) enforcer.Decision {
		d := decideAny(t, l, req(0, 1, rules.KeyUser, u))
		if d.Outcome.Allow() {
			allowed[u]++
		}
		return d
	}
	for i := range known {
		decideOn(fmt.Sprint("known-", i)) // Redis answers for it
	}
	p.Inject(redistest.Refuse, 0)
	for i := 0; seriesValue(t, reg, "sluice_enforcer_breaker_trips_total") == 0; i++ {
		if i == 100 {
			t.Fatal("the breaker did not open with Redis refusing")
		}
		decideAny(t, l, req(0, 1, rules.KeyUser, "tripper"))
	}
	for i := range spent {
		decideOn(fmt.Sprint("known-", i))
	}
	p.Inject(redistest.Pass, 0)
	reachable(t, rdb)
	// After the cool-down a probe closes the breaker and the ramp begins.
	deadline := time.Now().Add(5 * time.Second)
	for decideAny(t, l, req(0, 1, rules.KeyUser, "prober")).Path != decision.PathRedis {
		if time.Now().After(deadline) {
			t.Fatal("no decision on Redis within 5 s of its recovery")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return l, allowed
}

// TestRampGrantsAKeyFromOnePlace: found by a fresh user. In the breaker's
// ramp, the decisions it kept off Redis for a key Redis had answered for
// were granted from Redis's last answer while those it let through were
// granted by Redis from the same units, the fallback's grants charged to
// Redis only after it answered: a burst in the ramp's second passed up to
// twice what was left (7-8 of a fixed window of 5; 10 of 5 for a key seen
// once before the outage). Each key here, seen once before the outage (half
// of them also decided by the fallback during it), is offered a decision
// each 100 ms through the ramp, twice as many as its window holds: each gets
// exactly its window, wherever its place in the ramp falls.
func TestRampGrantsAKeyFromOnePlace(t *testing.T) {
	const keys, limit = 12, 5
	l, allowed := rampLimiter(t, fmt.Sprintf("domain: f\nrules: [{id: fw, algorithm: fixed_window, match: [{key: user}], limit: %d, period: 1h}]", limit),
		time.Second, keys, keys/2)
	ramped, onRedis := 0, 0
	unanswered := map[string]int{} // decisions sent to Redis and not answered in time: it may have counted them
	trace := map[string][]string{}
	for round := range 2 * limit {
		for k := range keys {
			u := fmt.Sprint("known-", k)
			d := decideAny(t, l, req(0, 1, rules.KeyUser, u))
			if d.Outcome.Allow() {
				allowed[u]++
			}
			switch {
			case errors.Is(d.Err, enforcer.ErrBreakerRamp):
				ramped++
			case d.Path == decision.PathRedis:
				onRedis++
			case d.Err != nil && !errors.Is(d.Err, enforcer.ErrBreakerOpen):
				unanswered[u]++
			}
			trace[u] = append(trace[u], fmt.Sprintf("%v/%v", d.Outcome, d.Path))
		}
		if round < 2*limit-1 {
			time.Sleep(100 * time.Millisecond)
		}
	}
	t.Logf("in the ramp: %d decisions kept off Redis, %d on Redis", ramped, onRedis)
	if ramped == 0 || onRedis == 0 {
		t.Fatalf("%d decisions kept off Redis by the ramp and %d on Redis: want both (the ramp is a second)", ramped, onRedis)
	}
	// Exact, but for a decision Redis may have counted without this process
	// reading the answer in time (a loaded machine: ErrStalled, a timeout),
	// which the fallback then decided: it may have denied a unit Redis spent.
	for k := range keys {
		u := fmt.Sprint("known-", k)
		if got := allowed[u]; got > limit || got < limit-unanswered[u] {
			t.Errorf("%s: %d allowed, want exactly %d (offered more; %d unanswered): %v", u, got, limit, unanswered[u], trace[u])
		}
	}
}

// TestBreakerLogsAnOutageOnce: found by a fresh user. Through an outage
// each cool-down logged two lines (half-open, open again): about two a
// second, where every other Redis failure logs once per 10 s. The opening
// and the close are logged at once; the cool-downs between, once per 10 s,
// with the failed probes counted (and the close says how many there were).
func TestBreakerLogsAnOutageOnce(t *testing.T) {
	rdb, p := proxied(t)
	var logged syncbuf.Buffer
	l, err := enforcer.New(rdb, mustSet(t, "domain: f\nrules: [{id: r, match: [{key: user}], limit: 1000, period: 1s}]"),
		enforcer.Options{Budget: time.Second, Breaker: enforcer.BreakerOptions{Failures: 2, Cooldown: 50 * time.Millisecond, Ramp: -1},
			Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	if err != nil {
		t.Fatal(err)
	}
	decideAny(t, l, req(0, 1, rules.KeyUser, "u"))
	p.Inject(redistest.Refuse, 0)
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		decideAny(t, l, req(0, 1, rules.KeyUser, "u")) // about 20 cool-downs
	}
	lines := strings.Count(logged.String(), "redis circuit breaker")
	if lines < 1 || lines > 2 {
		t.Errorf("%d breaker lines in a 1 s outage of 50 ms cool-downs, want the opening and at most one on its cool-downs:\n%s", lines, logged.String())
	}
	p.Inject(redistest.Pass, 0)
	reachable(t, rdb)
	for deadline := time.Now().Add(5 * time.Second); l.BreakerOpen() || !strings.Contains(logged.String(), "to=closed"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no close logged within 5 s of the recovery:\n%s", logged.String())
		}
		decideAny(t, l, req(0, 1, rules.KeyUser, "u"))
	}
	if !regexp.MustCompile(`to=closed failed_probes=[1-9]`).MatchString(logged.String()) {
		t.Errorf("the close does not count the failed probes:\n%s", logged.String())
	}
}

// TestFailedChargeIsLogged: found by a fresh user. With an ACL user that
// may not run INCRBY (which charge.lua runs for a fixed window), every
// charge of a fixed window's debt failed, was owed again and retried after
// each answer, for ever, with nothing logged. A failed charge is logged
// (once per 10 s), naming the cause.
func TestFailedChargeIsLogged(t *testing.T) {
	addr := redistest.Addr(t)
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	if err := admin.Do(context.Background(), "ACL", "SETUSER", "noincr", "on", ">pw", "~*", "&*", "+@all", "-incrby").Err(); err != nil {
		t.Fatal(err)
	}
	p := redistest.NewProxy(t, addr)
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), Username: "noincr", Password: "pw", MaxRetries: -1, ContextTimeoutEnabled: true, DialerRetries: 1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	var logged syncbuf.Buffer
	reg := prometheus.NewRegistry()
	l, err := enforcer.New(rdb, mustSet(t, "domain: f\nrules: [{id: fw, algorithm: fixed_window, match: [{key: user}], limit: 50, period: 1h}]"),
		enforcer.Options{Budget: time.Second, Breaker: enforcer.BreakerOptions{Failures: 1000}, Fallback: enforcer.FallbackOptions{Instances: 1}, HotKeys: enforcer.HotKeyOptions{Table: -1}, Registerer: reg,
			Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	if err != nil {
		t.Fatal(err)
	}
	decideAny(t, l, req(0, 1, rules.KeyUser, "u")) // Redis answers (the decision's script may run INCRBY's neighbours, not INCRBY)
	p.Inject(redistest.Refuse, 0)
	if d := decideAny(t, l, req(0, 1, rules.KeyUser, "u")); d.Path != decision.PathFallback {
		t.Fatalf("with Redis refusing: %v, want the fallback", d.Path)
	}
	p.Inject(redistest.Pass, 0)
	reachable(t, rdb)
	if err := l.Refresh(context.Background(), time.Now()); err != nil {
		t.Fatal(err)
	}
	if seriesValue(t, reg, "sluice_enforcer_debt_charge_errors_total") == 0 {
		t.Fatal("the charge did not fail: the ACL user may run INCRBY")
	}
	// (Redis does not name the command a script was refused.)
	if s := logged.String(); !strings.Contains(s, "charging the fallback's debts to Redis failed") || !strings.Contains(s, "cause=noperm") {
		t.Errorf("a failed charge (NOPERM) not logged with its cause:\n%s", s)
	}
}
