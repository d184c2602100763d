package redistest_test

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/internal/redistest"
)

// TestProxy: traffic passes; Refuse refuses connections; Blackhole holds
// replies until a client's deadline; Delay makes each reply late by the
// delay; Latency makes each round trip late by the delay; Pass again restores service on the same address.
func TestProxy(t *testing.T) {
	p := redistest.NewProxy(t, redistest.Addr(t))
	// One dial per connection: go-redis's default of 5 dials 100 ms apart
	// made a refused ping take 400-550 ms at load 13 under -race, and more
	// than the second it is given now and then (the refusal under test is
	// the first dial's).
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true, DialTimeout: time.Second, DialerRetries: 1})
	t.Cleanup(func() { c.Close() })
	// The clock starts before the deadline is set, as the deadline is
	// counted from then: started after it, a test preempted between the
	// two measured a blackholed ping's timeout short of the timeout
	// (99.77 ms of 100 ms, at load 11).
	ping := func(timeout time.Duration) (time.Duration, error) {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		err := c.Ping(ctx).Err()
		return time.Since(start), err
	}
	if _, err := ping(time.Second); err != nil {
		t.Fatalf("pass: %v", err)
	}
	p.Inject(redistest.Refuse, 0)
	if _, err := ping(time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("refuse: %v, want connection refused", err)
	}
	p.Inject(redistest.Blackhole, 0)
	if took, err := ping(100 * time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, context.DeadlineExceeded) || took < 100*time.Millisecond {
		t.Errorf("blackhole: %v after %v, want a timeout at 100ms", err, took)
	}
	p.Inject(redistest.Delay, 50*time.Millisecond)
	if took, err := ping(time.Second); err != nil || took < 50*time.Millisecond {
		t.Errorf("delay: %v after %v, want an answer after 50ms", err, took)
	}
	// Half the round trip each way: a reply cannot come before the whole
	// round trip (a lower bound, which no slow machine breaks).
	p.Inject(redistest.Latency, 60*time.Millisecond)
	if took, err := ping(time.Second); err != nil || took < 60*time.Millisecond {
		t.Errorf("latency: %v after %v, want an answer after the 60ms round trip", err, took)
	}
	p.Inject(redistest.Pass, 0)
	if _, err := ping(time.Second); err != nil {
		t.Errorf("pass again: %v", err)
	}
}
