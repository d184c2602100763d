package enforcer_test

import (
	"context"
	"runtime"
	"testing"
	"time"
	"weak"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/rules"
)

// A closed Limiter is let go at the next GC, though it has just decided
// (its stall clock's timer was running: it kept the Limiter, with its
// 64K-entry hot-key and remembered-answers tables and its Sink, reachable
// for a second after the last decision, which a replay's memory test saw
// as 90 MiB still in use after Run returned) and a slot release is being
// retried in the background (Redis gone); and its metrics are unregistered,
// so that a new Limiter registers on the same registry.
func TestCloseLetsTheLimiterGo(t *testing.T) {
	set := mustSet(t, `
domain: c
rules:
  - {id: per-user, match: [{key: user}], limit: 100, period: 1m}
  - {id: slots, algorithm: concurrency, match: [{key: user}], limit: 3, lease: 30s}`)
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true, DialerRetries: 1})
	t.Cleanup(func() { rdb.Close() })
	reg := prometheus.NewRegistry()
	opts := enforcer.Options{Budget: 200 * time.Millisecond, Registerer: reg}

	gone := func() weak.Pointer[enforcer.Limiter] {
		l, err := enforcer.New(rdb, set, opts)
		if err != nil {
			t.Fatal(err)
		}
		req := &enforcer.Request{}
		req.Descriptors[rules.KeyUser] = "u"
		d, err := l.Check(context.Background(), req)
		if err != nil || len(d.Leases) != 1 {
			t.Fatalf("check: %v, %d leases (%v)", err, len(d.Leases), d.Err)
		}
		if _, err := enforcer.New(rdb, set, opts); err == nil {
			t.Fatal("a second Limiter registered its metrics on the registry the first holds")
		}
		m.Close() // the release fails, and is retried in the background
		if err := l.Release(context.Background(), &d); err == nil {
			t.Fatal("release with Redis gone: no error")
		}
		l.Close()
		l.Close() // twice is safe
		return weak.Make(l)
	}()
	runtime.GC()
	if gone.Value() != nil {
		t.Error("the Limiter is still reachable after Close and a GC")
	}
	l, err := enforcer.New(rdb, set, opts)
	if err != nil {
		t.Fatalf("a new Limiter on the closed one's registry: %v", err)
	}
	l.Close()
}
