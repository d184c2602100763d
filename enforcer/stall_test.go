package enforcer

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"

	"github.com/sluice-rl/sluice/rules"
)

func TestStallWait(t *testing.T) {
	var s stallWait
	t0 := time.Unix(1000, 0)
	if got := s.get(t0); got != 0 {
		t.Fatalf("no stall seen: %v", got)
	}
	s.observe(t0, 60*time.Millisecond)
	s.observe(t0, 20*time.Millisecond) // shorter: the longest stays
	for _, c := range []struct {
		after time.Duration
		want  time.Duration
	}{{0, 60 * time.Millisecond}, {stallHold, 60 * time.Millisecond}, {stallHold * 3 / 2, 30 * time.Millisecond}, {2 * stallHold, 0}} {
		if got := s.get(t0.Add(c.after)); got != c.want {
			t.Errorf("%v after a stall of 60 ms: %v, want %v", c.after, got, c.want)
		}
	}
	s.observe(t0.Add(time.Minute), time.Second)
	if got := s.get(t0.Add(time.Minute)); got != maxStallWait {
		t.Errorf("a stall of 1 s: %v, want the cap %v", got, maxStallWait)
	}
	// A shorter stall after the allowance decayed raises it again, and holds it.
	s.observe(t0.Add(time.Minute+stallHold*3/2), 80*time.Millisecond)
	if got := s.get(t0.Add(time.Minute + 2*stallHold)); got != 80*time.Millisecond {
		t.Errorf("a stall after the decay: %v held, want 80ms", got)
	}
}

// TestStalledTimeout: a timeout whose wait this process spent stalled for
// more than the budget is the stall's: ErrStalled, cause stalled, not a
// breaker failure; another timeout is Redis's.
func TestStalledTimeout(t *testing.T) {
	set, err := rules.Parse("t.yaml", []byte("domain: d\nrules: [{id: r, match: [{key: user}], limit: 1, period: 1s}]"))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, ContextTimeoutEnabled: true})
	defer rdb.Close()
	l, err := New(rdb, set, Options{Budget: 10 * time.Millisecond, Breaker: BreakerOptions{Failures: 1}})
	if err != nil {
		t.Fatal(err)
	}
	timeout := fmt.Errorf("read: %w", context.DeadlineExceeded)
	start := time.Now().Add(-100 * time.Millisecond)
	l.clock.record(start.Add(10*time.Millisecond).UnixNano(), start.Add(15*time.Millisecond).UnixNano()) // 5 ms: no matter
	if err := l.stalled(timeout, start); errors.Is(err, ErrStalled) || ClassifyRedisError(err) != CauseTimeout {
		t.Errorf("a timeout with a stall of 5 ms in its wait: %v, want Redis's timeout", err)
	}
	l.clock.record(start.Add(-time.Second).UnixNano(), start.Add(-500*time.Millisecond).UnixNano()) // before the wait
	if err := l.stalled(timeout, start); errors.Is(err, ErrStalled) {
		t.Errorf("a stall before the wait began counted: %v", err)
	}
	l.clock.record(start.Add(20*time.Millisecond).UnixNano(), start.Add(80*time.Millisecond).UnixNano())
	err = l.stalled(timeout, start)
	if !errors.Is(err, ErrStalled) || ClassifyRedisError(err) != CauseStalled || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a timeout with a stall of 60 ms in its wait: %v (%v), want ErrStalled wrapping the timeout", err, ClassifyRedisError(err))
	}
	var trips atomic.Uint64
	b := newBreaker("redis", &l.opts, &trips)
	for range 20 {
		done, err := b.Allow()
		if err != nil {
			t.Fatal(err)
		}
		done(err)
	}
	for range 20 {
		done, err := b.Allow()
		if err != nil {
			t.Fatalf("the breaker opened on stalls: %v", err)
		}
		done(fmt.Errorf("x: %w", ErrStalled))
	}
	if b.State() != gobreaker.StateClosed || trips.Load() != 0 {
		t.Errorf("stalls opened the breaker")
	}
}

// TestStallClock: the clock sees this process not running its goroutines
// (here, a timer callback held up by a busy loop on the only P until Go
// preempts it).
func TestStallClock(t *testing.T) {
	var c stallClock
	var seen atomic.Int64
	c.start(func(_ time.Time, d time.Duration) { seen.Add(int64(d)) })
	prev := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(prev)
	start := time.Now()
	c.touch(start)
	for time.Since(start) < 60*time.Millisecond {
		c.active.Store(time.Now().UnixNano())
	}
	time.Sleep(20 * time.Millisecond)
	if c.stalls.Load() == 0 {
		t.Skip("the busy loop was preempted within 5 ms every time: no stall to see")
	}
	if d := c.stalledDuring(start, time.Now()); d < stallTick || time.Duration(c.stalled.Load()) < stallTick || seen.Load() != c.stalled.Load() {
		t.Errorf("%d stalls seen, %v in all, %v in the loop: want one of more than %v", c.stalls.Load(), time.Duration(c.stalled.Load()), d, stallTick)
	}
	time.Sleep(1100 * time.Millisecond)
	if c.running.Load() {
		t.Error("the clock still runs a second after the last decision")
	}
}

// TestLateBatchOutcome: a batch whose every decision Redis ran past its
// deadline is a failure of Redis for the breaker (ErrLate), unless each
// was late because this process stalled (markStalled wrapped it in
// ErrStalled, which the breaker excludes): found by a fresh user, whose
// sidecar at a quarter core opened its breaker on 219 late answers from an
// idle Redis.
func TestLateBatchOutcome(t *testing.T) {
	stalledLate := fmt.Errorf("%w: it did not run for 40ms while it waited: %w", ErrStalled, ErrLate)
	for _, c := range []struct {
		errs []error
		want func(error) bool
		what string
	}{
		{[]error{ErrLate, ErrLate}, func(e error) bool { return e == ErrLate }, "all late: ErrLate"},
		{[]error{stalledLate, stalledLate}, func(e error) bool { return errors.Is(e, ErrStalled) }, "all late for a stall: excused"},
		{[]error{stalledLate, ErrLate}, func(e error) bool { return e == ErrLate }, "one late for no stall: ErrLate"},
		{[]error{ErrLate, stalledLate}, func(e error) bool { return e == ErrLate }, "one late for no stall, first: ErrLate"},
		{[]error{stalledLate, nil}, func(e error) bool { return e == nil }, "one answered in time: success"},
	} {
		var gs []*group
		for _, e := range c.errs {
			gs = append(gs, &group{err: e})
		}
		bc := &batchCall{calls: []scriptCall{{groups: gs}}}
		if got := bc.outcome(); !c.want(got) {
			t.Errorf("%s: outcome %v", c.what, got)
		}
	}
}
