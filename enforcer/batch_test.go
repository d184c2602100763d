package enforcer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// A batch of checks decides exactly as the same checks one by one, in the
// batch's order: every check's outcome (allowed, the denying and shadow
// rules, waits, the time, each rule's remaining, reset, took and window)
// and the state left in Redis are the same. Random rules of every algorithm
// over a few shared keys (so that checks in a batch meet on a key), random
// costs, limits and caller times (some moving backwards), random arrival
// orders and random batch boundaries; on redis-server and on the in-process
// Redis (gopher-lua).
func TestBatchDecidesAsOneByOne(t *testing.T) {
	for _, backend := range []string{"redis-server", "in-process"} {
		t.Run(backend, func(t *testing.T) {
			var rdb *redis.Client
			if backend == "redis-server" {
				rdb = redistest.Server(t)
			} else {
				m := miniredis.RunT(t)
				rdb = redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
				t.Cleanup(func() { rdb.Close() })
			}
			l, err := New(rdb, rules.NewSet("p", 0, nil), Options{})
			if err != nil {
				t.Fatal(err)
			}
			trials := 150
			if testing.Short() || backend == "in-process" {
				trials = 60
			}
			for seed := range uint64(trials) {
				rng := rand.New(rand.NewPCG(seed, 33))
				checks := randomChecks(rng)
				// Arrival order, and batch boundaries.
				rng.Shuffle(len(checks), func(i, j int) { checks[i], checks[j] = checks[j], checks[i] })
				var cuts []int
				for i := 1; i < len(checks); i++ {
					if rng.IntN(3) == 0 {
						cuts = append(cuts, i)
					}
				}
				one, oneState := decideChecks(t, l, rdb, checks, nil)
				batched, batchedState := decideChecks(t, l, rdb, checks, append(cuts, len(checks)))
				for i := range checks {
					if !reflect.DeepEqual(one[i], batched[i]) {
						t.Fatalf("seed %d: check %d of %d (%s), batches cut at %v:\none by one: %+v\nbatched:    %+v",
							seed, i, len(checks), checks[i], cuts, one[i], batched[i])
					}
				}
				if !reflect.DeepEqual(oneState, batchedState) {
					t.Fatalf("seed %d: state after one by one:\n%v\nafter batches cut at %v:\n%v", seed, oneState, cuts, batchedState)
				}
			}
		})
	}
}

// pcheck is a check of the property test: its rules and its time.
type pcheck struct {
	now   int64
	rules []prule
}

type prule struct {
	alg, limit, period, burst, cost, x int64
	shadow                             bool
	key, lease                         string
}

func (c pcheck) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "now %d:", c.now)
	for _, r := range c.rules {
		fmt.Fprintf(&b, " {alg %d limit %d period %d burst %d cost %d x %d shadow %v key %s}", r.alg, r.limit, r.period, r.burst, r.cost, r.x, r.shadow, r.key)
	}
	return b.String()
}

// randomChecks returns 2 to 24 checks of 1 to 4 rules each, over 2 keys per
// algorithm; rules of one key share their constants but for the cost, x
// and shadow mode, as one rule's requests do (a period or capacity change
// is also drawn now and then).
func randomChecks(rng *rand.Rand) []pcheck {
	type spec struct{ limit, period, burst int64 }
	specs := map[string]spec{}
	now := int64(1_700_000_000_000) + rng.Int64N(1000)
	n := 2 + rng.IntN(23)
	checks := make([]pcheck, n)
	for ci := range checks {
		now += rng.Int64N(400) - 100 // mostly forward, sometimes back
		k := 1 + rng.IntN(4)
		var used []string
		for range k {
			alg := []int64{int64(rules.TokenBucket), int64(rules.SlidingWindow), int64(rules.FixedWindow), int64(rules.Concurrency), algGCounter}[rng.IntN(5)]
			key := fmt.Sprintf("p:{k%d}:%d", rng.IntN(2), alg)
			if slices.Contains(used, key) {
				continue
			}
			used = append(used, key)
			s, ok := specs[key]
			if !ok || rng.IntN(20) == 0 {
				s = spec{limit: 1 + rng.Int64N(8), period: 1000 * (1 + rng.Int64N(3))}
				s.burst = s.limit + rng.Int64N(4)
				specs[key] = s
			}
			r := prule{alg: alg, limit: s.limit, period: s.period, burst: s.burst, cost: rng.Int64N(4), key: key, shadow: rng.IntN(6) == 0}
			switch alg {
			case int64(rules.TokenBucket):
				r.x = []int64{0, 0, 0, 2, -1}[rng.IntN(5)]
			case int64(rules.SlidingWindow):
				r.burst = r.limit
			case int64(rules.FixedWindow), algGCounter:
				r.burst = r.limit
				r.x = 1 + rng.Int64N(r.period)
			case int64(rules.Concurrency):
				r.burst, r.cost = r.limit, 1
				r.lease = fmt.Sprintf("lease-%d", ci)
			}
			checks[ci].rules = append(checks[ci].rules, r)
		}
		checks[ci].now = now
	}
	return checks
}

// poutcome is what one check's decision says.
type poutcome struct {
	Err   string
	Out   groupResult
	Rules []ruleResult
}

// decideChecks runs checks on an empty Redis, in batches that end at the
// indexes in cuts (nil: one check per call), and returns each check's
// outcome and the state left in Redis.
func decideChecks(t *testing.T, l *Limiter, rdb *redis.Client, checks []pcheck, cuts []int) ([]poutcome, map[string]string) {
	t.Helper()
	ctx := context.Background()
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	calls := make([]*call, len(checks))
	for ci, ch := range checks {
		c := &call{now: ch.now}
		for i, r := range ch.rules {
			rc := &c.rc[i]
			rc.alg, rc.limit, rc.period, rc.burst, rc.charge, rc.x, rc.shadow = r.alg, r.limit, r.period, r.burst, r.cost, r.x, r.shadow
			rc.key.b, rc.leaseID.b = []byte(r.key), []byte(r.lease)
			c.order[i] = i
		}
		c.groups = []group{{c: c, to: len(ch.rules), n: int64(len(ch.rules)), deadline: &c.deadline}}
		calls[ci] = c
	}
	if cuts == nil {
		for i := range checks {
			cuts = append(cuts, i+1)
		}
	}
	from := 0
	for _, to := range cuts {
		var sc scriptCall
		for _, c := range calls[from:to] {
			sc.add(&c.groups[0])
		}
		sc.build(l)
		cmd := redis.NewIntSliceCmd(ctx, sc.args...)
		_ = rdb.Process(ctx, cmd)
		if isNoScript(cmd.Err()) {
			sc.args[0], sc.args[1] = "eval", l.decide.src
			cmd = redis.NewIntSliceCmd(ctx, sc.args...)
			_ = rdb.Process(ctx, cmd)
		}
		if cmd.Err() != nil {
			t.Fatalf("batch %d-%d: %v", from, to, cmd.Err())
		}
		sc.result(cmd)
		from = to
	}
	out := make([]poutcome, len(calls))
	for ci, c := range calls {
		g := &c.groups[0]
		if g.err != nil {
			out[ci].Err = g.err.Error()
		}
		out[ci].Out = g.out
		for i := range checks[ci].rules {
			out[ci].Rules = append(out[ci].Rules, c.rc[i].res)
		}
	}
	state := map[string]string{}
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		switch typ := rdb.Type(ctx, k).Val(); typ {
		case "string":
			state[k] = rdb.Get(ctx, k).Val()
		case "hash":
			state[k] = fmt.Sprint(rdb.HGetAll(ctx, k).Val())
		case "zset":
			state[k] = fmt.Sprint(rdb.ZRangeWithScores(ctx, k, 0, -1).Val())
		default:
			state[k] = typ
		}
	}
	return out, state
}

// pausedBatch starts decisions on l while Redis is paused (CLIENT PAUSE):
// first alone, on l's only connection (conns is set to 1), then each of
// rest after its delay, queued behind it, and returns a wait for all of
// them. It returns once the rest are all queued.
func pausedBatch(t *testing.T, l *Limiter, rdb *redis.Client, pause string, first *Request, rest []*Request, delays []time.Duration) func() ([]Decision, []time.Duration) {
	t.Helper()
	ctx := context.Background()
	l.batch.conns = 1
	if err := rdb.Do(ctx, "client", "pause", pause, "all").Err(); err != nil {
		t.Fatal(err)
	}
	all := append([]*Request{first}, rest...)
	ds := make([]Decision, len(all))
	took := make([]time.Duration, len(all))
	var wg sync.WaitGroup
	start := time.Now()
	for i, r := range all {
		if i > 0 {
			time.Sleep(time.Until(start.Add(delays[i-1])))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			if err := l.Decide(ctx, r, &ds[i]); err != nil {
				t.Error(err)
			}
			took[i] = time.Since(t0)
		}()
		// Wait until it is in flight (the first) or queued.
		for deadline := time.Now().Add(5 * time.Second); ; {
			l.batch.mu.Lock()
			flying, queued := l.batch.flying, len(l.batch.queue)
			l.batch.mu.Unlock()
			if flying == 1 && queued == i {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("decision %d: %d calls in flight, %d queued", i, flying, queued)
			}
			time.Sleep(time.Millisecond)
		}
	}
	return func() ([]Decision, []time.Duration) { wg.Wait(); return ds, took }
}

// A batch whose script fails (here: one check's key holds a hash, so its
// GET fails with WRONGTYPE and the whole call with it) degrades each of its
// checks by its own rule's failure mode: a fail-open rule's check is
// decided by its local bucket, a fail-closed rule's is refused.
func TestBatchFailureDegradesEachByItsFailureMode(t *testing.T) {
	rdb := redistest.Server(t)
	set, err := rules.Parse("f.yaml", []byte(`domain: f
rules:
  - {id: open, match: [{key: user}], limit: 100, period: 1s}
  - {id: closed, failure_mode: closed, match: [{key: tenant}], limit: 100, period: 1s}
`))
	if err != nil {
		t.Fatal(err)
	}
	// Fallback.RememberedKeys -1: what the fail-open checks' local buckets grant is
	// not owed to Redis, so no debt is charged (charge.lua, in a goroutine
	// that a late answer to the first decision starts) among the round
	// trips counted: make test's race run once counted 4, the charge's
	// EVALSHA and EVAL among them.
	l, err := New(rdb, set, Options{Budget: 5 * time.Second, HotKeys: HotKeyOptions{Table: -1}, Breaker: BreakerOptions{Failures: 100}, Fallback: FallbackOptions{RememberedKeys: -1}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	mk := func(k rules.Key, v string) *Request {
		r := &Request{Now: time.UnixMilli(1_700_000_000_000)}
		r.Descriptors[k] = v
		return r
	}
	var d Decision
	if err := l.Decide(ctx, mk(rules.KeyUser, "warm"), &d); err != nil || d.Err != nil { // the script cached
		t.Fatal(err, d.Err)
	}
	// Poison user "bad"'s key: a hash where the script reads a string.
	var c call
	c.buf, _ = rules.AppendEntityTagScratch(append([]byte(nil), "sl:{"...), nil, set.Rules[0], &rules.Descriptors{rules.KeyUser: "bad"})
	key := string(c.buf) + "}:open:0"
	if err := rdb.HSet(ctx, key, "x", 1).Err(); err != nil {
		t.Fatal(err)
	}
	trips := l.RoundTrips()
	rest := []*Request{mk(rules.KeyUser, "bad"), mk(rules.KeyTenant, "t1"), mk(rules.KeyUser, "u2")}
	wait := pausedBatch(t, l, rdb, "300", mk(rules.KeyUser, "first"), rest, []time.Duration{0, 0, 0})
	ds, _ := wait()
	if n := l.RoundTrips() - trips; n != 2 {
		t.Errorf("%d round trips, want 2: the first decision's, then one batch of 3", n)
	}
	if ds[0].Outcome != decision.Allowed || ds[0].Err != nil {
		t.Errorf("first (alone, healthy): %v %v", ds[0].Outcome, ds[0].Err)
	}
	want := []decision.Outcome{decision.DegradedOpen, decision.DegradedClosed, decision.DegradedOpen}
	for i, w := range want {
		d := ds[i+1]
		if d.Outcome != w || d.Err == nil || !strings.Contains(d.Err.Error(), "WRONGTYPE") {
			t.Errorf("batched check %d: %v (err %v), want %s after WRONGTYPE", i, d.Outcome, d.Err, w)
		}
	}
}

// A batch waits for Redis no longer than its oldest check's deadline: with
// Redis paused, a check queued 500 ms after another returns when the
// older's wait ends, before its own; and no check waits past its own.
func TestBatchDeadlineIsItsOldestChecks(t *testing.T) {
	rdb := redistest.Server(t)
	set, err := rules.Parse("f.yaml", []byte("domain: f\nrules: [{id: r, match: [{key: user}], limit: 100, period: 1s}]"))
	if err != nil {
		t.Fatal(err)
	}
	const budget = 300 * time.Millisecond // a wait of 600 ms
	l, err := New(rdb, set, Options{Budget: budget, HotKeys: HotKeyOptions{Table: -1}, Breaker: BreakerOptions{Failures: 100}})
	if err != nil {
		t.Fatal(err)
	}
	mk := func(v string) *Request {
		r := &Request{}
		r.Descriptors[rules.KeyUser] = v
		return r
	}
	var d Decision
	if err := l.Decide(context.Background(), mk("warm"), &d); err != nil || d.Err != nil {
		t.Fatal(err, d.Err)
	}
	// The first check is sent at 0 and waits until 600 ms; the second
	// queues at 100 ms (its wait ends at 700), the third at 500 (1 100).
	// The first's call times out at 600, and the second and third go in one
	// batch, whose deadline is the second's: 700.
	wait := pausedBatch(t, l, rdb, "3000", mk("a"), []*Request{mk("b"), mk("c")}, []time.Duration{100 * time.Millisecond, 500 * time.Millisecond})
	ds, took := wait()
	// A wait is 2 × Budget plus the allowance for this process's recent CPU
	// stalls (stallWait, at most 100 ms), which a loaded machine's test
	// process earns as a starved sidecar does; then 100 ms of scheduling.
	stall := l.stall.get(time.Now())
	for i := range ds {
		if ds[i].Err == nil {
			t.Errorf("check %d decided by a paused Redis: %v", i, ds[i].Outcome)
		}
		if took[i] > 2*budget+stall+100*time.Millisecond {
			t.Errorf("check %d took %v, past its own wait (%v, and %v for stalls)", i, took[i], 2*budget, stall)
		}
	}
	// The third started at 500 ms and was cut with the second at 700: about
	// 200 ms, well before its own 600.
	if took[2] > 2*budget-200*time.Millisecond+stall {
		t.Errorf("the third check took %v: its batch was not cut at the second's deadline (about 200 ms after it started)", took[2])
	}
}
