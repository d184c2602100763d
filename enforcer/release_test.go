package enforcer_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// TestReleaseRetriedAfterStall: with a concurrency limit of 3 (30 s
// leases), the releases of three slots fail while Redis stalls (bytes
// held, then the client gives up) or refuses connections; once Redis
// answers again, the background retries free the slots within a few
// seconds, not when the leases run out.
func TestReleaseRetriedAfterStall(t *testing.T) {
	addr := redistest.Addr(t)
	direct := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { direct.Close() })
	set := mustSet(t, `
domain: c
rules:
  - {id: cc, algorithm: concurrency, match: [{key: user}], limit: 3, lease: 30s}`)
	for _, fault := range []redistest.Fault{redistest.Blackhole, redistest.Refuse} {
		t.Run(map[redistest.Fault]string{redistest.Blackhole: "stall", redistest.Refuse: "refused"}[fault], func(t *testing.T) {
			ctx := context.Background()
			if err := direct.FlushDB(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			p := redistest.NewProxy(t, addr)
			rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true, DialerRetries: 1})
			t.Cleanup(func() { rdb.Close() })
			reg := prometheus.NewRegistry()
			l, err := enforcer.New(rdb, set, enforcer.Options{Budget: 200 * time.Millisecond, Registerer: reg})
			if err != nil {
				t.Fatal(err)
			}
			check := func() enforcer.Decision {
				r := &enforcer.Request{}
				r.Descriptors[rules.KeyUser] = "u"
				d, err := l.Check(ctx, r)
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
			var held []enforcer.Decision
			for range 3 {
				d := check()
				if d.Outcome != decision.Allowed || len(d.Leases) != 1 {
					t.Fatalf("taking a slot: %v, %d leases (%v)", d.Outcome, len(d.Leases), d.Err)
				}
				held = append(held, d)
			}
			key := held[0].Leases[0].Key

			p.Inject(fault, 0)
			for i := range held {
				if err := l.Release(ctx, &held[i]); err == nil {
					t.Fatalf("release %d during the fault: no error", i)
				}
			}
			time.Sleep(300 * time.Millisecond) // a few retries fail too
			p.Inject(redistest.Pass, 0)
			healed := time.Now()

			deadline := healed.Add(10 * time.Second) // a third of the lease
			for direct.ZCard(ctx, key).Val() != 0 {
				if time.Now().After(deadline) {
					t.Fatalf("%d slots still held 10 s after Redis came back (30 s leases): failed releases were not retried",
						direct.ZCard(ctx, key).Val())
				}
				time.Sleep(20 * time.Millisecond)
			}
			t.Logf("slots free %v after Redis came back", time.Since(healed).Round(time.Millisecond))
			if d := check(); d.Outcome != decision.Allowed {
				t.Errorf("after the retries: %v (%v), want allowed", d.Outcome, d.Err)
			}
			metric := func(result string) float64 {
				return testutil.ToFloat64(metricWith(t, reg, "sluice_enforcer_slot_releases_total", "result", result))
			}
			if metric("failed") != 3 || metric("retried") != 3 || metric("ok") != 0 {
				t.Errorf("slot releases: failed %v retried %v ok %v; want 3 3 0", metric("failed"), metric("retried"), metric("ok"))
			}
		})
	}
}
