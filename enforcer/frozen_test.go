package enforcer

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// TestFrozenRedisOnAStalledHost: a Redis that answers nothing (frozen, or
// blackholed) while this process keeps stalling (a loaded host: every
// wait overlaps a stall longer than the budget) opens the breaker: a stall
// excuses a timeout only while Redis answers other calls (stallExcuse).
// Before, every timeout was the stall's, the breaker never opened and each
// decision waited its full budget and stall allowance. With Redis answering
// through the same stalls, nothing opens it.
func TestFrozenRedisOnAStalledHost(t *testing.T) {
	set, err := rules.Parse("t.yaml", []byte("domain: d\nrules: [{id: r, match: [{key: user}], limit: 1000, period: 1s}]"))
	if err != nil {
		t.Fatal(err)
	}
	trickle := func(t *testing.T, addr string, dur time.Duration, until func(*Limiter) bool) (*Limiter, []error) {
		rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true, DialTimeout: time.Second})
		t.Cleanup(func() { rdb.Close() })
		l, err := New(rdb, set, Options{Budget: 10 * time.Millisecond, Breaker: BreakerOptions{Failures: 3, Cooldown: time.Hour}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		var errs []error
		for end := time.Now().Add(dur); time.Now().Before(end) && !until(l); time.Sleep(20 * time.Millisecond) {
			// A stall of this process over every wait, as on a loaded host.
			now := time.Now()
			l.clock.record(now.Add(-time.Minute).UnixNano(), now.Add(time.Minute).UnixNano())
			var d rules.Descriptors
			d[rules.KeyUser] = "u"
			dec, err := l.Check(context.Background(), &Request{Domain: "d", Descriptors: d})
			if err == nil {
				err = dec.Err
			}
			errs = append(errs, err)
		}
		return l, errs
	}

	proxy := redistest.NewProxy(t, redistest.Addr(t))
	proxy.Inject(redistest.Blackhole, 0)
	start := time.Now()
	l, errs := trickle(t, proxy.Addr(), 3*stallExcuse, (*Limiter).BreakerOpen)
	if !l.BreakerOpen() {
		t.Fatalf("a Redis answering nothing for %v on a stalled host: the breaker never opened (%d decisions, the last: %v)", time.Since(start).Round(time.Millisecond), len(errs), errs[len(errs)-1])
	}
	if d := time.Since(start); d > stallExcuse+2*time.Second { // a few timeouts, on a loaded machine under -race
		t.Errorf("the breaker opened %v after the first decision, want within stallExcuse (%v) and a few timeouts", d, stallExcuse)
	}
	if !errors.Is(errs[0], ErrStalled) {
		t.Errorf("the first timeout, within stallExcuse of the start: %v, want the stall's", errs[0])
	}

	// Longer than stallExcuse: the excuse holds as long as Redis answers.
	// (A decision may still miss its 10 ms budget on a loaded machine; the
	// breaker must not open for it.)
	l, errs = trickle(t, redistest.Addr(t), stallExcuse+500*time.Millisecond, (*Limiter).BreakerOpen)
	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
		}
	}
	if l.BreakerOpen() || failed > len(errs)/2 {
		t.Errorf("Redis answering through the stalls: breaker open %v, %d of %d decisions failed", l.BreakerOpen(), failed, len(errs))
	}
}
