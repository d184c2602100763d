package enforcer_test

import (
	"strconv"
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

// How long TestNoCheckThenSetRace hammers one bucket; -short uses the short one.
const (
	raceDuration      = 10 * time.Second
	raceDurationShort = 2 * time.Second
)

// The bucket under test: 100 tokens a second, capacity 100.
const (
	raceLimit  = 100
	raceBurst  = 100
	racePeriod = time.Second
)

const (
	raceLimiters   = 3
	raceGoroutines = 64
)

// TestNoCheckThenSetRace runs three limiters (three enforcer instances, each
// with its own Redis client) against one bucket from 64 goroutines in tight
// loops, on Redis's clock, and checks that they allow exactly what the bucket
// holds: never more (no check-then-set race between instances) and, within
// 1%, no less.
func TestNoCheckThenSetRace(t *testing.T) {
	t.Run("redis-server", func(t *testing.T) {
		addr := redistest.Addr(t)
		raceBody(t, func() redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: addr, PoolSize: raceGoroutines, MaxRetries: -1, ContextTimeoutEnabled: true})
		})
	})
	t.Run("cluster", func(t *testing.T) {
		addrs := redistest.ClusterAddrs(t)
		raceBody(t, func() redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: raceGoroutines, ContextTimeoutEnabled: true})
		})
	})
}

// raceStats is one goroutine's tally.
type raceStats struct {
	allowed, denied int64
	// first and last are its first request's start and its last request's
	// end, on the test's monotonic clock.
	first, last time.Time
	// minNow and maxNow bound the Redis TIME its decisions were taken at.
	minNow, maxNow time.Time
}

func raceBody(t *testing.T, newClient func() redis.UniversalClient) {
	dur := raceDuration
	if testing.Short() {
		dur = raceDurationShort
	}
	r := &rules.Rule{
		ID:    "api-key",
		Match: []rules.Match{{Key: rules.KeyAPIKey}},
		Limit: raceLimit, Period: racePeriod, Burst: raceBurst,
	}
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	set := rules.NewSet("race", 1, []*rules.Rule{r})
	lims := make([]*enforcer.Limiter, raceLimiters)
	for i := range lims {
		c := newClient()
		t.Cleanup(func() { c.Close() })
		// HotKeys.Table -1: every decision goes to Redis, whose atomicity is under
		// test (leases would serve most of them locally). A budget of 10 s:
		// every decision must be Redis's, and on a loaded machine a script
		// queued behind 64 others on a Cluster node ran past 1 s.
		l, err := enforcer.New(c, set, enforcer.Options{Budget: 10 * time.Second, Instance: strconv.Itoa(i), HotKeys: enforcer.HotKeyOptions{Table: -1}})
		if err != nil {
			t.Fatal(err)
		}
		lims[i] = l
	}
	var desc rules.Descriptors
	desc[rules.KeyAPIKey] = "race-test-key"

	ctx := t.Context()
	var stop atomic.Bool // set on the first failure
	stats := make([]raceStats, raceGoroutines)
	begin := make(chan struct{})
	var wg, ready sync.WaitGroup
	ready.Add(raceGoroutines)
	var t0 time.Time
	for g := range raceGoroutines {
		l := lims[g%raceLimiters]
		s := &stats[g]
		wg.Go(func() {
			// Warm up on a key of its own, outside the measured run, so that
			// the run does not start with dials, the cluster's slot map and
			// the script's NOSCRIPT round trip: refill during those is lost
			// to the lower bound. 64 keys reach every cluster node.
			warm := rules.Descriptors{rules.KeyAPIKey: "warm-up-" + strconv.Itoa(g)}
			if _, err := l.Check(ctx, &enforcer.Request{Descriptors: warm}); err != nil {
				t.Errorf("goroutine %d: warm-up Check: %v", g, err)
			}
			ready.Done()
			<-begin
			for !stop.Load() && time.Since(t0) < dur {
				start := time.Now()
				d, err := l.Check(ctx, &enforcer.Request{Descriptors: desc})
				end := time.Now()
				if s.first.IsZero() {
					s.first = start
				}
				s.last = end
				if err != nil || d.Err != nil {
					if !stop.Swap(true) {
						t.Errorf("goroutine %d: Check: err %v, decision %v, storage error %v", g, err, d.Outcome, d.Err)
					}
					return
				}
				switch {
				case d.Outcome == decision.Allowed && d.Outcome.Allow():
					s.allowed++
				case d.Outcome == decision.Denied && !d.Outcome.Allow():
					s.denied++
				default:
					if !stop.Swap(true) {
						t.Errorf("goroutine %d: outcome %v, want allowed or denied", g, d.Outcome)
					}
					return
				}
				if s.minNow.IsZero() || d.Now.Before(s.minNow) {
					s.minNow = d.Now
				}
				if d.Now.After(s.maxNow) {
					s.maxNow = d.Now
				}
			}
		})
	}
	ready.Wait()
	if t.Failed() {
		close(begin)
		wg.Wait()
		return
	}
	t0 = time.Now()
	close(begin)
	wg.Wait()
	if t.Failed() {
		return
	}

	var allowed, denied int64
	var perLimiter [raceLimiters]int64
	first, last := stats[0].first, stats[0].last
	minNow, maxNow := stats[0].minNow, stats[0].maxNow
	for g, s := range stats {
		if s.allowed+s.denied == 0 {
			t.Fatalf("goroutine %d made no request", g)
		}
		allowed += s.allowed
		denied += s.denied
		perLimiter[g%raceLimiters] += s.allowed
		if s.first.Before(first) {
			first = s.first
		}
		if s.last.After(last) {
			last = s.last
		}
		if s.minNow.Before(minNow) {
			minNow = s.minNow
		}
		if s.maxNow.After(maxNow) {
			maxNow = s.maxNow
		}
	}
	elapsed := last.Sub(first)
	redisSpan := maxNow.Sub(minNow)

	// Upper bound. The bucket is created full, with raceBurst = 100 tokens,
	// by the first script call, and from then on gains raceLimit = 100 tokens
	// per second of Redis TIME, continuously (one token per 10 ms; the script
	// counts in units of 1/period_ms token) and never more than it can hold.
	// Each allowed request takes one token and the script decides and commits
	// atomically, so over the calls' Redis times [minNow, maxNow]
	//
	//	allowed <= 100 + 100/s * (maxNow - minNow),
	//
	// exactly, whatever the interleaving of the 3 instances; an instance that
	// checked and then set in two steps would overshoot it. Every call runs
	// between the first request's start and the last one's end, so maxNow -
	// minNow is at most elapsed plus under 1 ms: the script reads TIME in
	// whole milliseconds, and two truncated readings can be up to 1 ms
	// further apart than the instants they came from. Hence the bound on the
	// test's own clock is 100 + 100/s * (elapsed + 1 ms); the 1 ms is a tenth
	// of a token.
	exact := raceBurst + raceLimit*redisSpan.Milliseconds()/racePeriod.Milliseconds()
	upper := raceBurst + raceLimit*(elapsed+time.Millisecond).Seconds()/racePeriod.Seconds()
	// Lower bound. The bucket can only waste refill by being full, which
	// takes 1 s without an allowed request; with 64 requests in flight on
	// loopback (tens of thousands a second) each new token is taken within a
	// request's time in Redis, so the bucket stays drained over the calls'
	// Redis TIME [minNow, maxNow]. What it does not hand out there: the
	// part-token left at the end (under 1) and the 1 ms truncation of TIME
	// (a tenth). That is under the 1% the issue allows (3 tokens after 2 s,
	// 11 after 10 s), so no margin is added to it. The bound is on Redis's
	// clock, not the test's: on a loaded machine the time from the first
	// request's start to its script call, and from the last call to the last
	// end, can be a scheduler stall of hundreds of ms, whose refill no call
	// was there to take.
	ideal := raceBurst + raceLimit*redisSpan.Seconds()/racePeriod.Seconds()
	lower := 0.99 * ideal

	t.Logf("%d goroutines on %d limiters for %v: elapsed %v (Redis TIME span %v), %d requests (%.0f/s): allowed %d (per limiter %v), denied %d",
		raceGoroutines, raceLimiters, dur, elapsed, redisSpan, allowed+denied, float64(allowed+denied)/elapsed.Seconds(), allowed, perLimiter, denied)
	t.Logf("allowed %d: ideal 100 + 100/s*(Redis TIME span) = %.2f (short by %.2f, %.3f%%); bounds [%.2f, %.2f]; on Redis's clock at most %d",
		allowed, ideal, ideal-float64(allowed), 100*(ideal-float64(allowed))/ideal, lower, upper, exact)

	if allowed > exact {
		t.Errorf("allowed %d > %d = 100 + 100/s * %v, all that the bucket held over the calls' Redis TIME: a check-then-set race", allowed, exact, redisSpan)
	}
	if float64(allowed) > upper {
		t.Errorf("allowed %d > %.2f = 100 + 100/s * (%v + 1ms): more than the bucket held over the run", allowed, upper, elapsed)
	}
	if float64(allowed) < lower {
		t.Errorf("allowed %d < %.2f = 99%% of 100 + 100/s * %v of Redis TIME: the bucket was not drained", allowed, lower, redisSpan)
	}
	if redisSpan > elapsed+time.Millisecond {
		t.Errorf("Redis TIME moved %v while the run took %v: its clock stepped, the bounds do not apply", redisSpan, elapsed)
	}
}
