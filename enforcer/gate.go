package enforcer

import (
	"context"
	"runtime"
	"slices"
	"sync"
	"time"
)

// gate admits decisions under a concurrency limit that follows the
// latency of the decisions it admitted: an AIMD limit, as Netflix's
// concurrency-limits AIMDLimit (and TCP congestion avoidance, Jacobson
// 1988; Chiu and Jain 1989) apply it. A decision that took longer than the
// target (half the Budget) from its admission to its end cuts the limit by
// a tenth, at most once per target interval (a burst of slow decisions is
// one congestion event); decisions under the target while at least half
// the places are taken raise it by one per limit's worth of them. The
// limit stays between minimum and maximum.
//
// Only decisions that Redis answered (or that needed no Redis call) are
// samples: a decision cut off by its budget says that Redis was slow, not
// that the sidecar queued it, and the circuit breaker deals with that. Such
// a decision raises the limit by one if others wait: it held its place
// without using a core.
//
// Why: when the sidecar's own CPU is the bottleneck, every decision in
// progress waits for a core, and with all of them admitted the wait for a
// core after Redis answers exceeds the budget: healthy Redis calls time out,
// the breaker opens, and local fallback buckets take over from global
// limits. Held at the gate instead, a request waits before its budget
// starts, at most QueueWait, and is then shed: decided by the rules'
// failure modes without Redis (Decision.Err ErrOverloaded, counted), an
// answer rather than an error.
type gate struct {
	mu       sync.Mutex
	inFlight int
	limit    float64
	min, max float64
	target   time.Duration
	lastCut  time.Time
	waiters  []*call // FIFO
}

// newGate returns a gate of at most n places (n > 0), starting at
// 2 × GOMAXPROCS (or n), which is also its floor: it grows as decisions
// show the room.
func newGate(n int, target time.Duration) *gate {
	floor := float64(min(n, 2*runtime.GOMAXPROCS(0)))
	return &gate{limit: floor, min: floor, max: float64(n), target: target}
}

// admit takes a place for c, waiting at most queueWait (plus the recent
// stalls of this process, sw, and once more a stall clk saw during the
// wait) or until ctx ends (counted in m; a nil gate admits everything);
// false: none came free, the request is shed. The fast path takes a mutex;
// a wait reuses c's timer and channel.
func (g *gate) admit(ctx context.Context, c *call, queueWait time.Duration, clk *stallClock, sw *stallWait, m *metrics) bool {
	if g == nil {
		return true
	}
	g.mu.Lock()
	if float64(g.inFlight) < g.limit && len(g.waiters) == 0 {
		g.inFlight++
		g.mu.Unlock()
		c.admitted = time.Now()
		return true
	}
	// A sidecar that stalls (a CPU quota) waits its recent stalls out
	// here too (stallWait): places held by decisions frozen with the
	// process are no sign of a saturated sidecar.
	wait := queueWait + sw.get(time.Now())
	if c.wake == nil {
		c.wake = make(chan struct{}, 1)
		c.queueTimer = time.NewTimer(wait)
	} else {
		c.queueTimer.Reset(wait)
	}
	g.waiters = append(g.waiters, c)
	g.mu.Unlock()
	m.queued.Add(1)
	start := time.Now()
	ok, extended := false, false
wait:
	select {
	case <-c.wake:
		ok = true
		// Yield: the waker readied this goroutine to run next on its core,
		// inheriting the waker's time slice, and a chain of such hand-offs
		// (each decision wakes the next waiter, then queues again) keeps a
		// core for a whole slice (10 ms) while the goroutines that read
		// Redis's answers wait. At GOMAXPROCS=1 it made one decision in a
		// thousand miss its budget with a healthy Redis.
		runtime.Gosched()
	case <-c.queueTimer.C:
		// A wait that this process spent stalled (a CPU quota) is no sign
		// of a saturated sidecar: the stall is waited out, once.
		if s := clk.stalledDuring(start, time.Now()); s > 0 && !extended {
			extended = true
			c.queueTimer.Reset(s)
			goto wait
		}
	case <-ctx.Done():
	}
	c.queueTimer.Stop() // Go 1.23 timers: no stale tick after Stop or Reset
	if !ok {
		g.mu.Lock()
		if i := slices.Index(g.waiters, c); i >= 0 {
			g.waiters = slices.Delete(g.waiters, i, i+1)
		} else {
			ok = true // handed a place as the wait ended
			<-c.wake
		}
		g.mu.Unlock()
	}
	c.admitted = time.Now()
	m.queueTime.Observe(c.admitted.Sub(start).Seconds())
	if !ok {
		m.shed.Add(1)
	}
	return ok
}

// leave gives back c's place, adjusting the limit by the decision's
// latency if it is a sample.
func (g *gate) leave(c *call, sample bool) {
	if g != nil {
		now := time.Now()
		took := now.Sub(c.admitted)
		g.mu.Lock()
		g.inFlight--
		switch {
		case !sample:
			// It waited on a failing Redis, using no CPU: if others wait,
			// the limit is what holds them, so raise it (during an outage,
			// until the breaker opens, places are held for 2 × Budget).
			if len(g.waiters) > 0 {
				g.limit = min(g.max, g.limit+1)
			}
		case took > g.target:
			if now.Sub(g.lastCut) > g.target {
				g.limit = max(g.min, g.limit*0.9)
				g.lastCut = now
			}
		case float64(g.inFlight+1)*2 >= g.limit:
			g.limit = min(g.max, g.limit+1/g.limit)
		}
		for len(g.waiters) > 0 && float64(g.inFlight) < g.limit {
			w := g.waiters[0]
			g.waiters = slices.Delete(g.waiters, 0, 1)
			g.inFlight++
			w.wake <- struct{}{}
		}
		g.mu.Unlock()
	}
}

// state returns the decisions in progress and the limit, for the metrics.
func (g *gate) state() (inFlight int, limit float64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.inFlight, g.limit
}
