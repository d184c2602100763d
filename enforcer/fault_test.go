package enforcer_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// lossyConn loses one reply on demand: when armed, every read after it sends
// a script call (go-redis may peek before it reads the reply) waits for the
// read deadline and reports a timeout, while Redis has received the call and
// runs it. That is a reply lost to a
// slow network or a stalled server, the case in which a retry charges a
// request twice.
type lossyConn struct {
	net.Conn
	arm      *atomic.Bool
	lose     atomic.Bool
	deadline atomic.Int64 // unix ns
}

func (c *lossyConn) Write(b []byte) (int, error) {
	c.lose.Store(bytes.Contains(bytes.ToLower(b), []byte("evalsha")) && c.arm.CompareAndSwap(true, false))
	return c.Conn.Write(b)
}

func (c *lossyConn) SetReadDeadline(t time.Time) error {
	c.deadline.Store(t.UnixNano())
	return c.Conn.SetReadDeadline(t)
}

func (c *lossyConn) SetDeadline(t time.Time) error {
	c.deadline.Store(t.UnixNano())
	return c.Conn.SetDeadline(t)
}

func (c *lossyConn) Read(b []byte) (int, error) {
	if c.lose.Load() {
		time.Sleep(time.Until(time.Unix(0, c.deadline.Load())))
		return 0, os.ErrDeadlineExceeded
	}
	return c.Conn.Read(b)
}

// TestLostReplyIsChargedOnce: a decision whose reply is lost after Redis ran
// it degrades (the rule's failure mode decides) and its script runs exactly
// once: no layer retries it, on a single node or on a Cluster, whose client
// would otherwise retry timed-out commands in its redirect loop. (The
// fallback's grant is a debt, as for any timeout: see below.)
func TestLostReplyIsChargedOnce(t *testing.T) {
	const yaml = `
domain: f
rules: [{id: fw, algorithm: fixed_window, match: [{key: user}], limit: 10, period: 1h}]`
	var arm atomic.Bool
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &lossyConn{Conn: c, arm: &arm}, nil
	}
	body := func(t *testing.T, rdb redis.UniversalClient) {
		l := newLimiter(t, rdb, yaml)
		check := func() enforcer.Decision {
			d, err := l.Check(context.Background(), req(0, 1, rules.KeyUser, "u"))
			if err != nil {
				t.Fatal(err)
			}
			return d
		}
		if d := check(); d.Outcome != decision.Allowed || d.Remaining != 9 { // warm: script cached, slots known
			t.Fatalf("first: %v remaining %d", d.Outcome, d.Remaining)
		}
		arm.Store(true)
		if d := check(); d.Outcome != decision.DegradedOpen || d.Err == nil {
			t.Fatalf("lost reply: %v (err %v), want degraded_open with the error", d.Outcome, d.Err)
		}
		if arm.Load() {
			t.Fatal("no reply was lost: the test did not test")
		}
		time.Sleep(50 * time.Millisecond)
		// The lost call ran once (not retried: that would leave 5). Its reply
		// never came, so the wait timed out with this process on time: the
		// fallback's grant is owed (docs/enforcement.md: "only an answer
		// Redis held back over a budget after running the script in time is
		// counted twice") and charged before this decision (chargeFirst).
		if d := check(); d.Outcome != decision.Allowed || d.Remaining != 6 {
			t.Errorf("after the lost reply: %v remaining %d; want allowed, 6: the lost call counted once, and its fallback grant once as a debt", d.Outcome, d.Remaining)
		}
	}
	t.Run("redis-server", func(t *testing.T) {
		c := redis.NewClient(&redis.Options{Addr: redistest.Addr(t), Dialer: dial, MaxRetries: -1,
			ContextTimeoutEnabled: true, ReadTimeout: 500 * time.Millisecond})
		t.Cleanup(func() { c.Close() })
		body(t, c)
	})
	t.Run("cluster", func(t *testing.T) {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.ClusterAddrs(t), Dialer: dial,
			ContextTimeoutEnabled: true, ReadTimeout: 500 * time.Millisecond})
		t.Cleanup(func() { c.Close() })
		body(t, c)
	})
}

// TestResharding: decisions keep working while a slot migrates (ASK, which
// needs ASKING on the target) and after it moved (MOVED, before the client's
// slot map catches up), neither degraded nor charged twice.
func TestResharding(t *testing.T) {
	ctx := context.Background()
	addrs := redistest.ClusterAddrs(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	set := mustSet(t, "domain: f\nrules: [{id: fw, algorithm: fixed_window, match: [{key: user}], limit: 10, period: 1h}]")
	l, err := enforcer.New(rdb, set, enforcer.Options{Budget: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	check := func(user string) enforcer.Decision {
		d, err := l.Check(ctx, req(0, 1, rules.KeyUser, user))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	// Users whose keys share one slot: the slot of "u0".
	tagOf := func(user string) string {
		return rules.EntityTag(set.Rules[0], &rules.Descriptors{rules.KeyUser: user})
	}
	slot := enforcer.Slot("{" + tagOf("u0") + "}")
	var same []string
	for i := 1; len(same) < 2; i++ {
		if u := fmt.Sprint("u", i*7919); enforcer.Slot("{"+tagOf(u)+"}") == slot {
			same = append(same, u)
		}
	}
	if d := check("u0"); d.Outcome != decision.Allowed { // warm: the client knows the slot map
		t.Fatalf("warm: %v %v", d.Outcome, d.Err)
	}
	src, err := rdb.MasterForKey(ctx, "{"+tagOf("u0")+"}")
	if err != nil {
		t.Fatal(err)
	}
	var dst *redis.Client
	for _, a := range addrs {
		if a != src.Options().Addr {
			dst = redis.NewClient(&redis.Options{Addr: a})
			t.Cleanup(func() { dst.Close() })
			break
		}
	}
	srcID, dstID := src.ClusterMyID(ctx).Val(), dst.ClusterMyID(ctx).Val()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(dst.Do(ctx, "cluster", "setslot", slot, "importing", srcID).Err())
	must(src.Do(ctx, "cluster", "setslot", slot, "migrating", dstID).Err())
	// A new key in a migrating slot: the source answers ASK.
	if d := check(same[0]); d.Outcome != decision.Allowed || d.Remaining != 9 {
		t.Errorf("while the slot migrates: %v remaining %d (err %v); want allowed, 9", d.Outcome, d.Remaining, d.Err)
	}
	// Finish the move (u0's key stays behind on the source: move it).
	keys := src.ClusterGetKeysInSlot(ctx, int(slot), 100).Val()
	for _, k := range keys {
		must(src.Migrate(ctx, "127.0.0.1", dst.Options().Addr[len("127.0.0.1:"):], k, 0, time.Second).Err())
	}
	for _, c := range []*redis.Client{dst, src} {
		must(c.Do(ctx, "cluster", "setslot", slot, "node", dstID).Err())
	}
	// The client's map still says the source: MOVED, then followed.
	if d := check("u0"); d.Outcome != decision.Allowed || d.Remaining != 8 {
		t.Errorf("after the move: %v remaining %d (err %v); want allowed, 8 (u0's count moved with its key)", d.Outcome, d.Remaining, d.Err)
	}
	if d := check(same[1]); d.Outcome != decision.Allowed || d.Remaining != 9 {
		t.Errorf("a new key after the move: %v remaining %d (err %v)", d.Outcome, d.Remaining, d.Err)
	}
}

// TestFailClosedRefundsTheHealthySlots: a request whose slots are on two
// nodes, one of which does not answer before the request's deadline, fails
// closed; what the healthy node took is refunded although the request's own
// context has expired.
func TestFailClosedRefundsTheHealthySlots(t *testing.T) {
	ctx := context.Background()
	addrs := redistest.ClusterAddrs(t)
	var stallAddr atomic.Value // the address whose next script reply is lost
	stallAddr.Store("")
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &stallConn{lossyConn: &lossyConn{Conn: c, arm: new(atomic.Bool)}, addr: addr, stall: &stallAddr}, nil
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Dialer: dial, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	set := mustSet(t, `
domain: f
rules:
  - {id: login, algorithm: fixed_window, failure_mode: closed, match: [{key: user}], limit: 5, period: 15m}
  - {id: ip, match: [{key: client_ip}], limit: 100, period: 1s}`)
	// RefundBudget of a second: the refund is what is checked, not its
	// speed, and on a loaded machine the default 50 ms was missed.
	l, err := enforcer.New(rdb, set, enforcer.Options{Budget: time.Second, RefundBudget: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// A user and an IP on different nodes.
	user, ip := "bob", ""
	userNode, _ := rdb.MasterForKey(ctx, "{"+rules.EntityTag(set.Rules[0], &rules.Descriptors{rules.KeyUser: user})+"}")
	var ipNode *redis.Client
	for i := 1; ipNode == nil; i++ {
		cand := fmt.Sprintf("192.0.2.%d", i)
		n, _ := rdb.MasterForKey(ctx, "{"+rules.EntityTag(set.Rules[1], &rules.Descriptors{rules.KeyClientIP: cand})+"}")
		if n.Options().Addr != userNode.Options().Addr {
			ip, ipNode = cand, n
		}
	}
	check := func(d time.Duration, kv ...any) enforcer.Decision {
		c, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		dec, err := l.Check(c, req(0, 1, kv...))
		if err != nil {
			t.Fatal(err)
		}
		return dec
	}
	if d := check(time.Second, rules.KeyUser, user, rules.KeyClientIP, ip); d.Outcome != decision.Allowed { // warm
		t.Fatalf("warm: %v %v", d.Outcome, d.Err)
	}
	stallAddr.Store(ipNode.Options().Addr)
	// The silent node holds the request to its deadline, by which the
	// healthy node must have taken its unit (a late script takes nothing,
	// and there is then nothing to refund): a second, as the budget.
	d := check(time.Second, rules.KeyUser, user, rules.KeyClientIP, ip)
	stallAddr.Store("")
	if d.Outcome != decision.DegradedClosed {
		t.Fatalf("with the ip node silent: %v (err %v), want degraded_closed", d.Outcome, d.Err)
	}
	time.Sleep(50 * time.Millisecond)
	// Only the login rule matches now: it must hold 5 - 1 (the warm request) - 1.
	if d := check(time.Second, rules.KeyUser, user); d.Outcome != decision.Allowed || d.Remaining != 3 {
		t.Errorf("login after the failed request: %v remaining %d; want allowed, 3: the refused request's charge refunded", d.Outcome, d.Remaining)
	}
}

// stallConn loses the next script reply when its address is the one named.
type stallConn struct {
	*lossyConn
	addr  string
	stall *atomic.Value
}

func (c *stallConn) Write(b []byte) (int, error) {
	c.lose.Store(c.stall.Load().(string) == c.addr && bytes.Contains(bytes.ToLower(b), []byte("evalsha")))
	return c.Conn.Write(b)
}

// blackhole accepts connections and never answers, like a stalled Redis.
func blackhole(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c) // held open, never read
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// TestBudgetAndBreaker: against a Redis that never answers, each decision
// waits its budget, not the client's timeout, then the failure mode decides;
// after Breaker.Failures such failures the breaker opens and decisions no
// longer call Redis at all, nor start goroutines.
func TestBudgetAndBreaker(t *testing.T) {
	const budget = 20 * time.Millisecond
	rdb := redis.NewClient(&redis.Options{Addr: blackhole(t), MaxRetries: -1, ContextTimeoutEnabled: true, DialTimeout: time.Second})
	t.Cleanup(func() { rdb.Close() })
	l, err := enforcer.New(rdb, mustSet(t, "domain: f\nrules: [{id: r, match: [{key: user}], limit: 10, period: 1s, failure_mode: open_unlimited}]"),
		enforcer.Options{Budget: budget, Breaker: enforcer.BreakerOptions{Failures: 3, Cooldown: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	check := func() (enforcer.Decision, time.Duration) {
		start := time.Now()
		d, err := l.Check(context.Background(), req(0, 1, rules.KeyUser, "u"))
		if err != nil {
			t.Fatal(err)
		}
		return d, time.Since(start)
	}
	for i := 0; i < 3; i++ {
		d, took := check()
		if d.Outcome != decision.DegradedOpen || d.Err == nil || errors.Is(d.Err, enforcer.ErrBreakerOpen) {
			t.Fatalf("call %d: %v (err %v), want degraded_open from a timeout", i, d.Outcome, d.Err)
		}
		// Cut at the budget, not at the client's 3 s ReadTimeout (the upper
		// bound is loose: a loaded CI machine must not fail it).
		if took < budget || took > budget+time.Second {
			t.Errorf("call %d took %v, want the budget of %v", i, took, budget)
		}
	}
	trips, goroutines := l.RoundTrips(), runtime.NumGoroutine()
	for i := 0; i < 1000; i++ {
		d, _ := check()
		if d.Outcome != decision.DegradedOpen || !errors.Is(d.Err, enforcer.ErrBreakerOpen) {
			t.Fatalf("with the breaker open: %v (err %v)", d.Outcome, d.Err)
		}
	}
	// No Redis call, so no wait on one (how fast that is belongs to benchmarks).
	if l.RoundTrips() != trips {
		t.Errorf("%d Redis round trips with the breaker open, want 0", l.RoundTrips()-trips)
	}
	if g := runtime.NumGoroutine(); g > goroutines+2 {
		t.Errorf("goroutines %d -> %d", goroutines, g)
	}
}

// TestBreakerRecovers: once Redis answers again, the breaker's half-open
// probe after the cool-down succeeds and decisions use Redis again.
func TestBreakerRecovers(t *testing.T) {
	addr := redistest.Addr(t)
	rdb, stallAddr := stallingClient(t, addr)
	reg := prometheus.NewRegistry()
	l, err := enforcer.New(rdb, mustSet(t, "domain: f\nrules: [{id: r, match: [{key: user}], limit: 100, period: 1s}]"),
		enforcer.Options{Budget: 200 * time.Millisecond, Breaker: enforcer.BreakerOptions{Failures: 2, Cooldown: 300 * time.Millisecond, Probes: 1, Ramp: -1}, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	check := func() enforcer.Decision {
		d, err := l.Check(context.Background(), req(0, 1, rules.KeyUser, "u"))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	state := func() float64 {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() == "sluice_enforcer_breaker_state" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no sluice_enforcer_breaker_state")
		return -1
	}
	if d := check(); d.Outcome != decision.Allowed || state() != 0 {
		t.Fatalf("healthy: %v, breaker %v", d.Outcome, state())
	}
	stallAddr.Store(addr)
	check()
	check()
	if state() != 2 {
		t.Fatalf("after 2 timeouts the breaker is %v, want 2 (open)", state())
	}
	stallAddr.Store("")
	if d := check(); !errors.Is(d.Err, enforcer.ErrBreakerOpen) {
		t.Errorf("before the cool-down: %v (err %v), want no Redis call", d.Outcome, d.Err)
	}
	time.Sleep(350 * time.Millisecond)
	if d := check(); d.Outcome != decision.Allowed {
		t.Errorf("the half-open probe: %v (err %v), want allowed", d.Outcome, d.Err)
	}
	if d := check(); d.Outcome != decision.Allowed || state() != 0 {
		t.Errorf("after the probe: %v, breaker %v; want allowed, 0 (closed)", d.Outcome, state())
	}
}

// TestLocalFallbackBuckets: while Redis is unavailable a fail-open rule is
// enforced by an in-process bucket of burst × Headroom ÷ Instances, per
// entity; open_unlimited allows everything, closed denies; a local deny
// charges no other rule's bucket and says when to retry.
func TestLocalFallbackBuckets(t *testing.T) {
	dead := deadRedis(t)
	l, err := enforcer.New(dead, mustSet(t, `
domain: f
rules:
  - {id: user, match: [{key: user}], limit: 10, period: 1s}
  - {id: ip, match: [{key: client_ip}], limit: 100, period: 1s}
  - {id: any, failure_mode: open_unlimited, match: [{key: tenant}], limit: 1, period: 1h}`),
		enforcer.Options{Budget: time.Second, Breaker: enforcer.BreakerOptions{Failures: 1, Cooldown: time.Hour}, Fallback: enforcer.FallbackOptions{Instances: 2, Headroom: 1.2}})
	if err != nil {
		t.Fatal(err)
	}
	check := func(ms int64, user string) enforcer.Decision {
		t.Helper()
		return decideAny(t, l, req(ms, 1, rules.KeyUser, user, rules.KeyClientIP, "192.0.2.1", rules.KeyTenant, "t"))
	}
	// Local capacity: floor(10 × 1.2 ÷ 2) = 6, refilled at 6 per second.
	for i := 0; i < 6; i++ {
		if d := check(0, "a"); d.Outcome != decision.DegradedOpen {
			t.Fatalf("request %d: %v (%q), want degraded_open", i, d.Outcome, d.Reason)
		}
	}
	d := check(0, "a")
	if d.Outcome != decision.DegradedClosed || d.Reason != decision.ReasonLocalOverLimit || d.Rule.ID != "user" ||
		d.Remaining != -1 || d.RetryAfter != time.Second || d.Wait <= 0 || d.Wait > 167*time.Millisecond {
		t.Fatalf("7th: %v %q by %v, remaining %d, wait %v, Retry-After %v; want degraded_closed, local_over_limit by user, -1, about 1/6 s, 1 s",
			d.Outcome, d.Reason, d.Rule, d.Remaining, d.Wait, d.RetryAfter)
	}
	// The ip rule's bucket (capacity 60) was charged only for the 6 allowed:
	// 54 more users fit, then it is empty.
	for i := 0; i < 54; i++ {
		if d := check(0, fmt.Sprint("other", i)); d.Outcome != decision.DegradedOpen {
			t.Fatalf("user %d: %v by %v: the denied request charged the ip bucket", i, d.Outcome, d.Rule)
		}
	}
	if d := check(0, "b"); d.Rule == nil || d.Rule.ID != "ip" {
		t.Errorf("the ip bucket should be empty now: %v by %v", d.Outcome, d.Rule)
	}
	if d := check(1000, "a"); d.Outcome != decision.DegradedOpen {
		t.Errorf("a second later: %v (%q), want degraded_open: the bucket refilled", d.Outcome, d.Reason)
	}
}

// decideAny is decide without failing on a degraded decision.
func decideAny(t *testing.T, l *enforcer.Limiter, r *enforcer.Request) enforcer.Decision {
	t.Helper()
	d, err := l.Check(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestLocalBucketsAreBounded: at most Fallback.Buckets entities keep a local
// bucket; an evicted one starts again full.
func TestLocalBucketsAreBounded(t *testing.T) {
	dead := deadRedis(t)
	l, err := enforcer.New(dead, mustSet(t, "domain: f\nrules: [{id: user, match: [{key: user}], limit: 1, period: 1h, burst: 1}]"),
		enforcer.Options{Budget: time.Second, Breaker: enforcer.BreakerOptions{Failures: 1, Cooldown: time.Hour}, Fallback: enforcer.FallbackOptions{Headroom: 1, Buckets: 2}})
	if err != nil {
		t.Fatal(err)
	}
	outcome := func(user string) decision.Outcome { return decideAny(t, l, req(0, 1, rules.KeyUser, user)).Outcome }
	if outcome("a") != decision.DegradedOpen || outcome("a") != decision.DegradedClosed {
		t.Fatal("a local bucket of 1 should allow one request")
	}
	outcome("b")
	outcome("c") // evicts a, the least recently used
	if got := outcome("a"); got != decision.DegradedOpen {
		t.Errorf("a after eviction: %v, want a fresh bucket", got)
	}
}

// TestBreakerIgnoresABurstAmongSuccesses: a few consecutive timeouts from a
// Redis that mostly answers (connections opening under a burst) do not open
// the breaker; consecutive failures that are most of the recent calls do.
func TestBreakerIgnoresABurstAmongSuccesses(t *testing.T) {
	addr := redistest.Addr(t)
	rdb, stallAddr := stallingClient(t, addr)
	l, err := enforcer.New(rdb, mustSet(t, "domain: f\nrules: [{id: r, match: [{key: user}], limit: 1000, period: 1s, failure_mode: open_unlimited}]"),
		enforcer.Options{Budget: 200 * time.Millisecond, Breaker: enforcer.BreakerOptions{Failures: 3, Cooldown: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	check := func() enforcer.Decision { return decideAny(t, l, req(0, 1, rules.KeyUser, "u")) }
	for i := 0; i < 10; i++ {
		if d := check(); d.Outcome != decision.Allowed {
			t.Fatalf("healthy %d: %v", i, d.Outcome)
		}
	}
	stallAddr.Store(addr)
	for i := 0; i < 3; i++ {
		check() // 3 consecutive timeouts, but 3 of 13 calls
	}
	stallAddr.Store("")
	if d := check(); d.Outcome != decision.Allowed {
		t.Fatalf("after a short burst of timeouts: %v (err %v), want Redis still used", d.Outcome, d.Err)
	}
	stallAddr.Store(addr)
	for i := 0; i < 12; i++ {
		check() // now most of the calls fail
	}
	stallAddr.Store("")
	if d := check(); !errors.Is(d.Err, enforcer.ErrBreakerOpen) {
		t.Errorf("after most calls failed: %v (err %v), want the breaker open", d.Outcome, d.Err)
	}
}

// TestShadowRuleNeverFailsClosed: a shadow rule with failure_mode closed
// does not deny while Redis is unavailable; only enforced rules fail closed.
func TestShadowRuleNeverFailsClosed(t *testing.T) {
	dead := deadRedis(t)
	l, err := enforcer.New(dead, mustSet(t, "domain: f\nrules: [{id: login, mode: shadow, failure_mode: closed, match: [{key: user}], limit: 5, period: 15m}]"),
		enforcer.Options{Budget: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if d := decideAny(t, l, req(0, 1, rules.KeyUser, "u")); d.Outcome != decision.DegradedOpen {
		t.Errorf("shadow rule failing closed: %v (%q), want degraded_open", d.Outcome, d.Reason)
	}
}

// deadRedis is a client of a Redis that refuses connections.
func deadRedis(t *testing.T) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, ContextTimeoutEnabled: true, DialTimeout: 50 * time.Millisecond})
	t.Cleanup(func() { c.Close() })
	return c
}

// stallingClient is a client of the redis-server at addr whose script
// replies are lost while the returned value holds addr.
func stallingClient(t *testing.T, addr string) (*redis.Client, *atomic.Value) {
	stall := new(atomic.Value)
	stall.Store("")
	dial := func(ctx context.Context, network, a string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, a)
		if err != nil {
			return nil, err
		}
		return &stallConn{lossyConn: &lossyConn{Conn: c, arm: new(atomic.Bool)}, addr: a, stall: stall}, nil
	}
	c := redis.NewClient(&redis.Options{Addr: addr, Dialer: dial, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	return c, stall
}

// TestUnavailableReplies: a node that takes no writes (READONLY from a
// replica, MASTERDOWN from a replica cut off from its master, LOADING from a
// node loading its dataset) ran nothing of the script: the rules' failure
// modes decide, nothing is written, and the replies count as failures for
// the circuit breaker, which opens as it would on timeouts.
func TestUnavailableReplies(t *testing.T) {
	master := redistest.Addr(t)
	cases := []struct {
		name string
		addr string
		is   func(error) bool
	}{
		// A script without flags runs on a replica until its first write,
		// which fails and aborts it: decide.lua writes only after every
		// check, and every write fails there, so nothing can be committed.
		{"READONLY", redistest.ReplicaOf(t, master), redis.IsReadOnlyError},
		{"MASTERDOWN", redistest.ReplicaOf(t, "127.0.0.1:1", "--replica-serve-stale-data", "no"), redis.IsMasterDownError},
		{"LOADING", replyingRedis(t, "-LOADING Redis is loading the dataset in memory"), redis.IsLoadingError},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rdb := redis.NewClient(&redis.Options{Addr: c.addr, MaxRetries: -1, ContextTimeoutEnabled: true})
			t.Cleanup(func() { rdb.Close() })
			l, err := enforcer.New(rdb, mustSet(t, `
domain: f
rules:
  - {id: login, failure_mode: closed, match: [{key: route, value: /login}, {key: user}], limit: 5, period: 15m}
  - {id: user, match: [{key: user}], limit: 100, period: 1s}`),
				enforcer.Options{Budget: time.Second, Breaker: enforcer.BreakerOptions{Failures: 3, Cooldown: time.Hour}})
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 3; i++ {
				if d := decideAny(t, l, req(0, 1, rules.KeyUser, "u")); d.Outcome != decision.DegradedOpen || !c.is(d.Err) {
					t.Fatalf("fail-open rule, call %d: %v (err %v), want degraded_open with %s", i, d.Outcome, d.Err, c.name)
				}
			}
			if c.name == "READONLY" {
				if n := redis.NewClient(&redis.Options{Addr: c.addr}).DBSize(context.Background()).Val(); n != 0 {
					t.Errorf("the replica holds %d keys", n)
				}
			}
			// Three failures, all of the calls: the breaker is open.
			d := decideAny(t, l, req(0, 1, rules.KeyUser, "u", rules.KeyRoute, "/login"))
			if !errors.Is(d.Err, enforcer.ErrBreakerOpen) || d.Outcome != decision.DegradedClosed || d.Reason != decision.ReasonLimiterUnavailable {
				t.Errorf("after 3 %s replies: %v %q (err %v), want degraded_closed, limiter_unavailable, breaker open", c.name, d.Outcome, d.Reason, d.Err)
			}
		})
	}
}

// replyingRedis is a server that speaks just enough RESP for go-redis to
// connect (HELLO refused, so RESP2; other commands OK) and answers every
// script call with the error reply given.
func replyingRedis(t *testing.T, reply string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	serve := func(c net.Conn) {
		defer wg.Done()
		defer c.Close()
		r := bufio.NewReader(c)
		for {
			// *<n>\r\n then n of $<len>\r\n<arg>\r\n
			line, err := r.ReadString('\n')
			if err != nil || !strings.HasPrefix(line, "*") {
				return
			}
			n, _ := strconv.Atoi(strings.TrimSpace(line[1:]))
			var args []string
			for i := 0; i < n; i++ {
				if _, err := r.ReadString('\n'); err != nil {
					return
				}
				arg, err := r.ReadString('\n')
				if err != nil {
					return
				}
				args = append(args, strings.TrimSpace(arg))
			}
			out := "+OK\r\n"
			switch strings.ToLower(args[0]) {
			case "hello":
				out = "-ERR unknown command 'HELLO'\r\n"
			case "evalsha", "eval":
				out = reply + "\r\n"
			}
			if _, err := c.Write([]byte(out)); err != nil {
				return
			}
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go serve(c)
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return ln.Addr().String()
}

// TestClusterFailoverFromSilentMaster: a master stops answering and its
// replica takes over (CLUSTER FAILOVER TAKEOVER, as after a crash): the
// limiter's calls to the silent master time out, which makes it reload the
// slot map, and decisions reach the new master long before the old one
// answers again (go-redis alone would reload the map only every 60 s).
func TestClusterFailoverFromSilentMaster(t *testing.T) {
	ctx := context.Background()
	masters, replicaOf := redistest.ClusterWithReplicas(t)
	// ReadTimeout bounds what has no deadline of its own: the slot map's
	// reload, which may ask the silent master first.
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: masters, ContextTimeoutEnabled: true, DialerRetries: 1,
		ReadTimeout: 250 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	set := mustSet(t, "domain: f\nrules: [{id: r, match: [{key: user}], limit: 1000, period: 1s}]")
	l, err := enforcer.New(rdb, set, enforcer.Options{Budget: 50 * time.Millisecond, Breaker: enforcer.BreakerOptions{Cooldown: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	victim := masters[0]
	user := ""
	for i := 0; user == ""; i++ {
		u := fmt.Sprint("u", i)
		if n, _ := rdb.MasterForKey(ctx, "{"+rules.EntityTag(set.Rules[0], &rules.Descriptors{rules.KeyUser: u})+"}"); n.Options().Addr == victim {
			user = u
		}
	}
	if d := decideAny(t, l, req(0, 1, rules.KeyUser, user)); d.Outcome != decision.Allowed {
		t.Fatalf("warm: %v %v", d.Outcome, d.Err)
	}
	const silent = 8 * time.Second
	old := redis.NewClient(&redis.Options{Addr: victim})
	defer old.Close()
	if err := old.Do(ctx, "client", "pause", silent.Milliseconds(), "all").Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	rep := redis.NewClient(&redis.Options{Addr: replicaOf[victim]})
	defer rep.Close()
	// TAKEOVER: without the silent master's agreement, and without an
	// election (whose retry, if the first round fails, waits twice the
	// cluster-node-timeout).
	if err := rep.Do(ctx, "cluster", "failover", "takeover").Err(); err != nil {
		t.Fatal(err)
	}
	for !strings.Contains(rep.Info(ctx, "replication").Val(), "role:master") {
		if time.Since(start) > silent*3/4 {
			t.Fatalf("the replica did not take over within %v", silent*3/4)
		}
		time.Sleep(5 * time.Millisecond)
	}
	promoted := time.Now()
	for {
		d := decideAny(t, l, req(0, 1, rules.KeyUser, user))
		if d.Outcome == decision.Allowed {
			break
		}
		if time.Since(promoted) > 2*time.Second || time.Since(start) > silent {
			t.Fatalf("no decision by the new master %v after it took over (last: %v, err %v)", time.Since(promoted), d.Outcome, d.Err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("the replica took over %v after the failover began; decisions reached it %v later",
		promoted.Sub(start).Round(time.Millisecond), time.Since(promoted).Round(time.Millisecond))
}

// On a Cluster each master has its own circuit breaker: a silent master
// opens its own, and requests whose keys live on the other masters are
// still decided by Redis, within their budget.
func TestClusterBreakerPerMaster(t *testing.T) {
	ctx := context.Background()
	addrs := redistest.ClusterAddrs(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true, DialerRetries: 1,
		ReadTimeout: 250 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	set := mustSet(t, "domain: f\nrules: [{id: r, match: [{key: user}], limit: 1000000, period: 1s}]")
	reg := prometheus.NewRegistry()
	l, err := enforcer.New(rdb, set, enforcer.Options{Budget: 20 * time.Millisecond, Breaker: enforcer.BreakerOptions{Cooldown: time.Minute}, HotKeys: enforcer.HotKeyOptions{Table: -1}, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	// A user on the victim master, and one on another.
	victim := addrs[0]
	var onVictim, elsewhere string
	for i := 0; onVictim == "" || elsewhere == ""; i++ {
		u := fmt.Sprint("u", i)
		n, err := rdb.MasterForKey(ctx, "{"+rules.EntityTag(set.Rules[0], &rules.Descriptors{rules.KeyUser: u})+"}")
		if err != nil {
			t.Fatal(err)
		}
		if n.Options().Addr == victim {
			onVictim = u
		} else {
			elsewhere = u
		}
	}
	for _, u := range []string{onVictim, elsewhere} {
		if d := decideAny(t, l, req(0, 1, rules.KeyUser, u)); d.Outcome != decision.Allowed || d.Path != decision.PathRedis {
			t.Fatalf("warm %s: %v on %v (%v)", u, d.Outcome, d.Path, d.Err)
		}
	}
	pause := redis.NewClient(&redis.Options{Addr: victim})
	defer pause.Close()
	if err := pause.Do(ctx, "client", "pause", 3000, "all").Err(); err != nil {
		t.Fatal(err)
	}
	defer pause.Do(ctx, "client", "unpause")
	open := false
	for i := 0; i < 20; i++ {
		d := decideAny(t, l, req(0, 1, rules.KeyUser, onVictim))
		if d.Path != decision.PathFallback {
			t.Fatalf("victim's user, master paused: %v on %v, want the fallback", d.Outcome, d.Path)
		}
		if errors.Is(d.Err, enforcer.ErrBreakerOpen) {
			open = true
			break
		}
	}
	if !open {
		t.Fatal("the victim master's breaker did not open after 20 timeouts")
	}
	// The others' slots: decided by Redis, not by an open breaker.
	for i := 0; i < 20; i++ {
		if d := decideAny(t, l, req(0, 1, rules.KeyUser, elsewhere)); d.Path != decision.PathRedis || d.Outcome != decision.Allowed {
			t.Fatalf("user on a healthy master: %v on %v (%v), want allowed by Redis", d.Outcome, d.Path, d.Err)
		}
	}
	if got := testutil.ToFloat64(metricWith(t, reg, "sluice_enforcer_breaker_state")); got != 2 {
		t.Errorf("breaker_state %v, want 2 (a master's breaker is open)", got)
	}
}

// A stopped redis-server (SIGSTOP: its socket accepts connections, nothing
// answers) holds no decision past its budget: not the calls on pooled
// connections, and not the waits inside go-redis (for a connection, for one
// being set up, between dials), which end at the budget's Done. Before Done
// closed at the deadline, checks here took 4 s (go-redis's own timeouts).
func TestStoppedRedisHoldsNothingPastTheBudget(t *testing.T) {
	addr := redistest.Addr(t)
	probe := redis.NewClient(&redis.Options{Addr: addr})
	defer probe.Close()
	var pid int
	for _, line := range strings.Split(probe.Info(context.Background(), "server").Val(), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			pid, _ = strconv.Atoi(v)
		}
	}
	if pid == 0 {
		t.Fatal("no process_id in INFO server")
	}
	// The client settings the docs ask for, nothing tuned for the test.
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true, DialerRetries: 1})
	t.Cleanup(func() { rdb.Close() })
	l, err := enforcer.New(rdb, mustSet(t, "domain: f\nrules: [{id: r, match: [{key: user}], limit: 1000000, period: 1s}]"),
		enforcer.Options{Budget: 5 * time.Millisecond, HotKeys: enforcer.HotKeyOptions{Table: -1}})
	if err != nil {
		t.Fatal(err)
	}
	var worst atomic.Int64
	var n atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(4 * time.Second)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(stop); i++ {
				r := &enforcer.Request{}
				r.Descriptors[rules.KeyUser] = fmt.Sprint(g, "-", i)
				t0 := time.Now()
				if _, err := l.Check(context.Background(), r); err != nil {
					t.Error(err)
					return
				}
				took := int64(time.Since(t0))
				for w := worst.Load(); took > w && !worst.CompareAndSwap(w, took); w = worst.Load() {
				}
				n.Add(1)
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	_ = syscall.Kill(pid, syscall.SIGCONT)
	wg.Wait()
	t.Logf("%d checks, the slowest %v", n.Load(), time.Duration(worst.Load()))
	// A ceiling far above the 5 ms budget (a loaded machine's scheduling),
	// far below the seconds of go-redis's own timeouts.
	if w := time.Duration(worst.Load()); w > 250*time.Millisecond {
		t.Errorf("a check took %v while Redis was stopped; the budget is 5 ms", w)
	}
}
