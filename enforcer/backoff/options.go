package backoff

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"
)

// Clock is the transport's time: Now for reading headers and keeping each
// host's throttle, Sleep for every wait. Tests pass a fake one.
type Clock interface {
	Now() time.Time
	// Sleep waits d, or until ctx is done, whichever is first; it returns
	// context.Cause(ctx) when ctx is done (at once if it already is, even
	// for d ≤ 0), else nil.
	Sleep(ctx context.Context, d time.Duration) error
}

// systemClock is the default Clock: time.Now and a timer.
type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return context.Cause(ctx)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// globalSource draws from math/rand/v2's runtime-seeded generator, which is
// safe for concurrent use.
type globalSource struct{}

func (globalSource) Uint64() uint64 { return rand.Uint64() }

// Opt configures New.
type Opt func(*config)

type config struct {
	base, cap time.Duration
	attempts  int
	statuses  []int
	retryable func(*http.Request) bool
	low       int64
	throttle  bool
	clock     Clock
	rand      rand.Source
}

func defaults() config {
	return config{
		base:      100 * time.Millisecond,
		cap:       20 * time.Second,
		attempts:  4,
		statuses:  []int{http.StatusTooManyRequests, http.StatusServiceUnavailable},
		retryable: Idempotent,
		throttle:  true,
		clock:     systemClock{},
		rand:      globalSource{},
	}
}

// WithBase sets the decorrelated jitter's base: the least wait before a
// retry the server gave no wait for. Default 100 ms.
func WithBase(d time.Duration) Opt { return func(c *config) { c.base = d } }

// WithCap sets the longest wait: no retry sleep and no self-throttling wait
// is longer. A retry the server asks to delay longer (Retry-After or reset
// above the cap) is not made: the response is returned as it is. Default 20 s.
func WithCap(d time.Duration) Opt { return func(c *config) { c.cap = d } }

// WithMaxAttempts sets the attempts per request, the first included: 1
// never retries. Default 4.
func WithMaxAttempts(n int) Opt { return func(c *config) { c.attempts = n } }

// WithStatuses sets the response statuses that are retried (and whose
// Retry-After throttles the host). Default 429 Too Many Requests and 503
// Service Unavailable; none retries nothing.
func WithStatuses(codes ...int) Opt {
	return func(c *config) { c.statuses = append([]int(nil), codes...) }
}

// WithRetryable sets which requests may be sent again. Default Idempotent.
// A request whose body cannot be replayed (a Body without GetBody) is never
// retried, whatever f says.
func WithRetryable(f func(*http.Request) bool) Opt { return func(c *config) { c.retryable = f } }

// WithLowRemaining paces a host's requests when a response says at most n
// (and more than 0) quota units remain, with a reset t: one request every
// t/remaining until the reset. Default 0: no pacing (remaining 0 still waits
// for the reset). A server whose t is the time until its bucket is full
// rather than until the next unit (sluice's token buckets) makes pacing, and
// the wait at 0, slower than the limit needs; the wait is never longer than
// the cap.
func WithLowRemaining(n int64) Opt { return func(c *config) { c.low = n } }

// WithoutSelfThrottle turns self-throttling off: requests are sent at once
// whatever earlier responses said, and only retries wait. Default on.
func WithoutSelfThrottle() Opt { return func(c *config) { c.throttle = false } }

// WithClock sets the clock. Default the system clock (time.Now and timers).
func WithClock(clk Clock) Opt { return func(c *config) { c.clock = clk } }

// WithRand sets the source of the jitter's randomness; the transport
// serializes calls to it. Default math/rand/v2's runtime-seeded generator.
func WithRand(src rand.Source) Opt { return func(c *config) { c.rand = src } }

func (c *config) validate() error {
	switch {
	case c.base <= 0:
		return fmt.Errorf("backoff: base %v: give WithBase a positive duration", c.base)
	case c.cap < c.base:
		return fmt.Errorf("backoff: cap %v is below base %v: raise WithCap or lower WithBase", c.cap, c.base)
	case c.attempts < 1:
		return fmt.Errorf("backoff: %d attempts: WithMaxAttempts needs at least 1 (the first)", c.attempts)
	case c.low < 0:
		return fmt.Errorf("backoff: low remaining %d: WithLowRemaining takes 0 (no pacing) or more", c.low)
	case c.retryable == nil:
		return errors.New("backoff: WithRetryable(nil): pass a function, e.g. backoff.Idempotent")
	case c.clock == nil:
		return errors.New("backoff: WithClock(nil): pass a Clock")
	case c.rand == nil:
		return errors.New("backoff: WithRand(nil): pass a rand.Source")
	}
	for _, s := range c.statuses {
		if s < 100 || s > 599 {
			return fmt.Errorf("backoff: status %d in WithStatuses is not an HTTP status (100-599)", s)
		}
	}
	return nil
}
