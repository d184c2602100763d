package enforcer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"
)

// ErrBreakerRamp is a degraded decision's Err in the ramp after the circuit
// breaker closed: this decision was among those still kept off Redis (see
// Options.Breaker.Ramp). It wraps ErrBreakerOpen: Redis was not called.
var ErrBreakerRamp = fmt.Errorf("%w (ramping traffic back after it closed)", ErrBreakerOpen)

// rampFloor is the share of decisions sent to Redis at the start of a ramp;
// it grows linearly to all of them over Options.Breaker.Ramp.
const rampFloor = 0.1

// breaker is the circuit breaker of one Redis node (the single node, the
// Sentinel group's master, a Cluster master or another region's Redis):
// gobreaker's two-step breaker over a rolling window, with a ramp after it
// closes.
//
//   - Closed: it trips when the last Breaker.Failures round trips failed and
//     so did more than half of those in the last Breaker.Window (a rolling
//     window of ten buckets, so that the counts age out one bucket at a time
//     instead of being cleared at once).
//   - Open: no call for Breaker.Cooldown; then half-open.
//   - Half-open: Breaker.Probes calls go to Redis at once, the rest are
//     refused; if every probe succeeds it closes, if one fails it opens again.
//   - Ramp: for Breaker.Ramp after it closed, a growing share of decisions
//     goes to Redis (10% at first, all at the end), the others are refused
//     with ErrBreakerRamp, so that the traffic held back while it was open
//     returns gradually rather than in one burst onto a Redis that has just
//     recovered. A decision is placed by its keys (rampSends): a key moves
//     to Redis once, at a point of the ramp set by its hash, and is never
//     decided by the fallback again in that ramp. Netflix's Hystrix and Envoy's outlier detection close at
//     once; this follows the slow start of Envoy's load balancers
//     (slow_start_config) instead.
//
// What counts as a failure is breakerSuccess's concern. The sidecar's own
// CPU queue is kept out of it in two ways: the limiter admits only so many
// decisions at a time (see gate), so a round trip is not held up by the
// sidecar's other requests, and Redis's clock judges the budget (the script
// refuses to run past it, ErrLate) while the sidecar waits up to twice the
// budget for the answer.
type breaker struct {
	cb       *gobreaker.TwoStepCircuitBreaker[struct{}]
	ramp     time.Duration
	rampFrom atomic.Int64 // Unix ns when it closed from half-open; 0: not ramping
	picks    atomic.Uint64
	trips    *atomic.Uint64 // the limiter's count of openings
	// The cool-downs of an outage (open, half-open, open again) are logged
	// at most once per logEvery: the Unix ns of the last such line, and the
	// failed probes since.
	lastCycleLog atomic.Int64
	failedProbes atomic.Int64
}

// logChange logs a change of state: an opening from closed and a close at
// once, with the probes that failed in between; an outage's cool-downs
// (half-open, and open again after a failed probe), twice a second with the
// default cool-down, at most once per logEvery (found by a fresh user: the
// only Redis failure not held to a line per 10 s).
func (b *breaker) logChange(log *slog.Logger, name string, from, to gobreaker.State) {
	switch {
	case from == gobreaker.StateClosed:
		b.failedProbes.Store(0)
		log.Warn("redis circuit breaker", "node", name, "from", from.String(), "to", to.String())
	case to == gobreaker.StateClosed:
		log.Warn("redis circuit breaker", "node", name, "from", from.String(), "to", to.String(), "failed_probes", b.failedProbes.Swap(0))
	default:
		if to == gobreaker.StateOpen {
			b.failedProbes.Add(1)
		}
		now, last := time.Now().UnixNano(), b.lastCycleLog.Load()
		if now-last <= int64(logEvery) || !b.lastCycleLog.CompareAndSwap(last, now) {
			return
		}
		log.Warn("redis circuit breaker still open: probing Redis each cool-down (logged once per 10 s)", "node", name,
			"from", from.String(), "to", to.String(), "failed_probes", b.failedProbes.Load())
	}
}

// newBreaker returns the circuit breaker of the Redis node name.
func newBreaker(name string, opts *Options, trips *atomic.Uint64) *breaker {
	b := &breaker{ramp: opts.Breaker.Ramp, trips: trips}
	b.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        name,
		MaxRequests: uint32(opts.Breaker.Probes),
		Timeout:     opts.Breaker.Cooldown,
		// A rolling window: consecutive failures alone would trip on a
		// burst of concurrent timeouts from a healthy Redis (connections
		// opening at a cold start); an outage also fails most of the
		// recent calls.
		Interval:     opts.Breaker.Window,
		BucketPeriod: opts.Breaker.Window / 10,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return c.ConsecutiveFailures >= uint32(opts.Breaker.Failures) && 2*c.TotalFailures > c.Requests
		},
		// A Redis error reply (NOSCRIPT, MOVED, a script error) shows Redis
		// answering, unless it says Redis takes no writes (READONLY, LOADING,
		// MASTERDOWN, CLUSTERDOWN; see unavailable); a caller's cancellation
		// says nothing about Redis, and nor does a decision that waited in
		// the batcher's queue past its deadline without being sent (errQueued:
		// the calls in flight ahead of it report on Redis; when they failed,
		// batcher.queuedOut reports it as a failure of its own).
		IsSuccessful: breakerSuccess,
		IsExcluded: func(err error) bool {
			return errors.Is(err, context.Canceled) || errors.Is(err, errQueued) || errors.Is(err, ErrStalled)
		},
		OnStateChange: func(name string, from, to gobreaker.State) {
			switch {
			case to == gobreaker.StateOpen:
				b.rampFrom.Store(0)
				if b.trips != nil {
					b.trips.Add(1)
				}
			case from == gobreaker.StateHalfOpen && to == gobreaker.StateClosed && b.ramp > 0:
				b.rampFrom.Store(time.Now().UnixNano())
			}
			b.logChange(opts.Logger, name, from, to)
		},
	})
	return b
}

// Allow asks the breaker for one round trip (a refund's): done reports its
// result. It returns ErrBreakerOpen while the breaker is open or half-open
// with its probes out, and ErrBreakerRamp for a call the ramp keeps off
// Redis (spread: a refund has no key of its own to place it by).
func (b *breaker) Allow() (done func(error), err error) {
	if err := b.ramped(); err != nil {
		return nil, err
	}
	return b.call()
}

// ramped is ramping, with the ramp's choice spread over the decisions (see
// spread): for callers with no keys to place a decision by.
func (b *breaker) ramped() error {
	if share, err := b.ramping(); err != nil && !(err == ErrBreakerRamp && b.spread(share)) {
		return err
	}
	return nil
}

// ramping reports, before a decision queues for a batched call (the
// batch's call asks the breaker itself, call), whether the breaker is open
// (ErrBreakerOpen) or in the ramp after a close (ErrBreakerRamp), with the
// share of decisions the ramp sends to Redis now, from rampFloor to 1: the
// caller chooses which (rampSends places a decision by its keys, spread
// by its arrival).
func (b *breaker) ramping() (share float64, err error) {
	if from := b.rampFrom.Load(); from != 0 {
		el := time.Duration(time.Now().UnixNano() - from)
		if el >= b.ramp {
			b.rampFrom.CompareAndSwap(from, 0)
		} else {
			return rampFloor + (1-rampFloor)*float64(el)/float64(b.ramp), ErrBreakerRamp
		}
	}
	if b.cb.State() == gobreaker.StateOpen {
		return 0, ErrBreakerOpen
	}
	return 1, nil
}

// spread reports whether the ramp sends this decision to Redis, at share:
// spread over each 64 decisions, not random, share × 64 of them go.
func (b *breaker) spread(share float64) bool {
	return float64(b.picks.Add(1)%64) < share*64
}

// call asks the breaker for one round trip of a batch: done reports its
// result. It returns ErrBreakerOpen while the breaker is open or half-open
// with its probes out.
func (b *breaker) call() (done func(error), err error) {
	done, err = b.cb.Allow()
	if err != nil {
		return nil, ErrBreakerOpen
	}
	return done, nil
}

// State is the breaker's state; a ramp counts as closed.
func (b *breaker) State() gobreaker.State { return b.cb.State() }

// nodeBreakers are a Cluster's circuit breakers, one per master address, in
// a copy-on-write map: one silent master opens its own breaker, and the
// other masters' slots are still decided by Redis.
type nodeBreakers struct {
	m   atomic.Pointer[map[string]*breaker]
	mu  sync.Mutex
	new func(name string) *breaker
}

func (nb *nodeBreakers) get(addr string) *breaker {
	if m := nb.m.Load(); m != nil {
		if b, ok := (*m)[addr]; ok {
			return b
		}
	}
	nb.mu.Lock()
	defer nb.mu.Unlock()
	old := map[string]*breaker{}
	if m := nb.m.Load(); m != nil {
		if b, ok := (*m)[addr]; ok {
			return b
		}
		old = *m
	}
	m := make(map[string]*breaker, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	b := nb.new(addr)
	m[addr] = b
	nb.m.Store(&m)
	return b
}

// worst is the most open state of the nodes' breakers.
func (nb *nodeBreakers) worst() gobreaker.State {
	s := gobreaker.StateClosed
	if m := nb.m.Load(); m != nil {
		for _, b := range *m {
			if st := b.State(); st > s {
				s = st
			}
		}
	}
	return s
}
