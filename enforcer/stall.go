package enforcer

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// ErrStalled is wrapped in a degraded decision's Err when its wait for
// Redis's answer timed out while this process stalled for more than the
// budget of it: its threads did not run (a CPU quota's throttling, a
// starved host), and an answer that came meanwhile went unread. Such a
// timeout is no evidence against Redis: the circuit breaker does not count
// it. (Waits grow by this process's recent stalls: stallWait.)
var ErrStalled = errors.New("enforcer: this process stalled past the wait for Redis's answer (CPU throttled or starved), not Redis")

// stallWait is how much longer than twice the budget the limiter waits for
// Redis's answers, and than QueueWait for a place: the longest recent stall
// of this process longer than the budget (stallClock). A sidecar held to a
// CPU quota is stopped for up to a quota period (100 ms in Kubernetes) at a
// time, and runs behind its work for a while after: every answer due
// meanwhile is read late. Waiting that long decides them by Redis, where a
// wait cut at 2 × Budget would hand them to the failure modes (and the
// breaker's count) while Redis is healthy. A sidecar that does not stall
// keeps the short wait, so that a silent Redis holds its checks 2 × Budget
// at most. The allowance holds for stallHold after the last such stall,
// then falls to 0 over as long again; it is at most maxStallWait. Safe for
// concurrent use.
type stallWait struct {
	d  atomic.Int64 // ns
	at atomic.Int64 // Unix ns of the last stall seen
}

const (
	stallHold    = 10 * time.Second
	maxStallWait = 100 * time.Millisecond
)

// observe records a stall of d at now. (Concurrent observations may keep
// the shorter of two: the allowance is approximate.)
func (s *stallWait) observe(now time.Time, d time.Duration) {
	d = max(min(d, maxStallWait), s.get(now)) // this stall, or the allowance as it has decayed
	s.d.Store(int64(d))
	s.at.Store(now.UnixNano())
}

// get returns the allowance at now.
func (s *stallWait) get(now time.Time) time.Duration {
	d := time.Duration(s.d.Load())
	if d == 0 {
		return 0
	}
	since := time.Duration(now.UnixNano() - s.at.Load())
	switch {
	case since <= stallHold:
		return d
	case since >= 2*stallHold:
		s.d.CompareAndSwap(int64(d), 0)
		return 0
	}
	return d * (2*stallHold - since) / stallHold
}

// stallClock measures this process's stalls: while decisions are being
// made it keeps a timer that fires every stallTick and records, when one
// fires late, the interval during which this process did not run its
// goroutines (a CPU quota's throttling, a starved host, a long pause). No
// goroutine waits between firings (time.AfterFunc); it stops a second after
// the last decision. A failed call whose wait overlapped a stall of more
// than the budget failed for that stall, not for Redis. Safe for
// concurrent use.
type stallClock struct {
	active   atomic.Int64 // Unix ns of the last decision
	running  atomic.Bool
	expected atomic.Int64 // Unix ns the timer is due
	timer    *time.Timer
	stalls   atomic.Uint64 // stalls seen
	stalled  atomic.Int64  // their total, ns
	onStall  func(now time.Time, d time.Duration)
	next     atomic.Uint64
	ring     [32]struct{ from, to atomic.Int64 } // the last stalls, Unix ns
	link     *clockLink                          // what the timer's function holds
}

// clockLink is all the clock's timer holds: the clock until stop cuts the
// link. The clock is a field of its Limiter, so a pending timer that held
// it kept the whole Limiter reachable, its hot-key and remembered-answers
// tables and its Sink (a replay's producer and its buffer) among them, for
// a second after the last decision; and a firing under way when stop is
// called re-arms the timer, which, cut off, then does nothing.
type clockLink struct{ c atomic.Pointer[stallClock] }

func (k *clockLink) fire() {
	if c := k.c.Load(); c != nil {
		c.fire()
	}
}

// stallTick is how often the clock looks; a stall shorter than about this
// much is not seen.
const stallTick = 5 * time.Millisecond

// touch records a decision at now, starting the clock if it is not running.
func (s *stallClock) touch(now time.Time) {
	s.active.Store(now.UnixNano())
	if s.running.Load() || !s.running.CompareAndSwap(false, true) {
		return
	}
	s.expected.Store(now.Add(stallTick).UnixNano())
	s.timer.Reset(stallTick)
}

// start makes the clock's timer, stopped; onStall is told each stall.
func (s *stallClock) start(onStall func(now time.Time, d time.Duration)) {
	s.onStall = onStall
	s.link = &clockLink{}
	s.link.c.Store(s)
	s.timer = time.AfterFunc(time.Hour, s.link.fire)
	s.timer.Stop()
}

// stop stops the clock for good: its timer no longer reaches it, and a
// decision made after it starts it no more (no stall is measured then).
func (s *stallClock) stop() {
	s.running.Store(true) // touch starts no timer
	s.link.c.Store(nil)
	s.timer.Stop()
}

// record notes a stall from..to (Unix ns).
func (s *stallClock) record(from, to int64) {
	i := s.next.Add(1) % uint64(len(s.ring))
	s.ring[i].from.Store(from)
	s.ring[i].to.Store(to)
}

func (s *stallClock) fire() {
	now := time.Now()
	due := s.expected.Load()
	if late := now.UnixNano() - due; late > int64(stallTick) {
		s.record(due, now.UnixNano())
		s.stalls.Add(1)
		s.stalled.Add(late)
		s.onStall(now, time.Duration(late))
	}
	if now.UnixNano()-s.active.Load() > int64(time.Second) {
		s.running.Store(false)
		return
	}
	s.expected.Store(now.Add(stallTick).UnixNano())
	s.timer.Reset(stallTick)
}

// stalledDuring returns the longest overlap of a recorded stall with
// [from, to].
func (s *stallClock) stalledDuring(from, to time.Time) time.Duration {
	var most int64
	f, t := from.UnixNano(), to.UnixNano()
	for i := range s.ring {
		a, b := max(f, s.ring[i].from.Load()), min(t, s.ring[i].to.Load())
		most = max(most, b-a)
	}
	return time.Duration(most)
}

// stalled wraps err (a timeout of this region's call, whose wait began at
// start, or its script run past the deadline: ErrLate) in ErrStalled when
// this process stalled for more than the budget while it waited: the
// answer may have come and gone unread, or the call reached Redis late
// because this process did not run to send it. A wait that Redis, or a
// library, held past its deadline is no stall: the clock ran on time.
func (l *Limiter) stalled(err error, start time.Time) error {
	if c := ClassifyRedisError(err); start.IsZero() || errors.Is(err, ErrStalled) || c != CauseTimeout && c != CauseLate {
		return err
	}
	d := l.clock.stalledDuring(start, time.Now())
	if d <= l.opts.Budget {
		return err
	}
	return fmt.Errorf("%w: it did not run for %v while it waited: %w", ErrStalled, d.Round(time.Millisecond), err)
}
