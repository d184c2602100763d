package enforcer_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// BenchmarkPinnedWAN measures what pinning costs a check: region a's
// limiter decides a pinned rule (plus a per-IP rule of its own) for keys
// whose home is a, and for keys whose home is b, whose redis-server is
// behind a proxy that delays each direction by RTT/2 (redistest.Latency:
// a simulated WAN link). Each iteration times one check of each kind, and
// one check of a b-homed key that a's per-IP rule denies while b allowed
// (b's take is then refunded: a second WAN round trip). It reports the
// medians: "local-ms" (home a), "remote-ms" (home b), "added-ms" (their
// difference) and "refund-ms" (a deny in a after b allowed). Run it with
// -benchtime=Nx: at 150 ms an iteration takes about half a second.
func BenchmarkPinnedWAN(b *testing.B) {
	for _, rtt := range []time.Duration{0, 80 * time.Millisecond, 150 * time.Millisecond} {
		b.Run(fmt.Sprintf("rtt=%dms", rtt.Milliseconds()), func(b *testing.B) {
			ra := redistest.Server(b)
			wan := redistest.NewProxy(b, redistest.Addr(b))
			wan.Inject(redistest.Latency, rtt)
			rb := redis.NewClient(&redis.Options{Addr: wan.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true, DialerRetries: 1})
			b.Cleanup(func() { rb.Close() })
			set, err := rules.Parse("b.yaml", []byte(`
domain: b
rules:
  - {id: paid, match: [{key: api_key}], limit: 1000000000, period: 1s, global: true, pinned: true}
  - {id: per-ip, match: [{key: client_ip}], limit: 1000000000, period: 1s}
  - {id: spent, match: [{key: client_ip, value: 192.0.2.99}], limit: 1, period: 1h}
`))
			if err != nil {
				b.Fatal(err)
			}
			l, err := enforcer.New(ra, set, enforcer.Options{Region: "a", Homes: map[string]redis.UniversalClient{"b": rb},
				Budget: time.Second, HomeBudget: 2 * time.Second, HotKeys: enforcer.HotKeyOptions{Table: -1}})
			if err != nil {
				b.Fatal(err)
			}
			paid := set.Rule("paid")
			local := keysHomedIn(b, paid, "a", []string{"a", "b"}, 1)[0]
			remote := keysHomedIn(b, paid, "b", []string{"a", "b"}, 1)[0]
			ctx := context.Background()
			var d enforcer.Decision
			check := func(key, ip string, want decision.Outcome) time.Duration {
				var req enforcer.Request
				req.Descriptors[rules.KeyAPIKey], req.Descriptors[rules.KeyClientIP] = key, ip
				t0 := time.Now()
				if err := l.Decide(ctx, &req, &d); err != nil || d.Err != nil || d.Outcome != want {
					b.Fatal(err, d.Err, d.Outcome)
				}
				return time.Since(t0)
			}
			check(local, "192.0.2.1", decision.Allowed) // warm: scripts loaded, connections open
			check(remote, "192.0.2.1", decision.Allowed)
			check(local, "192.0.2.99", decision.Allowed) // spends the "spent" rule
			var loc, rem, ref, added []time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				tl := check(local, "192.0.2.1", decision.Allowed)
				tr := check(remote, "192.0.2.1", decision.Allowed)
				ref = append(ref, check(remote, "192.0.2.99", decision.Denied))
				loc, rem, added = append(loc, tl), append(rem, tr), append(added, tr-tl)
			}
			b.StopTimer()
			med := func(xs []time.Duration) float64 {
				slices.Sort(xs)
				return float64(xs[len(xs)/2].Microseconds()) / 1000
			}
			b.ReportMetric(med(loc), "local-ms")
			b.ReportMetric(med(rem), "remote-ms")
			b.ReportMetric(med(added), "added-ms")
			b.ReportMetric(med(ref), "refund-ms")
		})
	}
}

// BenchmarkPinnedCheck decides a pinned rule (and a per-IP rule of this
// region) back to back, for a key homed in this region and one homed in
// another region whose redis-server is on loopback: time and allocations
// per check, without WAN latency.
func BenchmarkPinnedCheck(b *testing.B) {
	ra, rb := redistest.Server(b), redistest.Server(b)
	set, err := rules.Parse("b.yaml", []byte(`
domain: b
rules:
  - {id: paid, match: [{key: api_key}], limit: 1000000000, period: 1s, global: true, pinned: true}
  - {id: per-ip, match: [{key: client_ip}], limit: 1000000000, period: 1s}
`))
	if err != nil {
		b.Fatal(err)
	}
	l, err := enforcer.New(ra, set, enforcer.Options{Region: "a", Homes: map[string]redis.UniversalClient{"b": rb}, Budget: time.Second, HotKeys: enforcer.HotKeyOptions{Table: -1}})
	if err != nil {
		b.Fatal(err)
	}
	for _, home := range []string{"a", "b"} {
		b.Run("home="+map[string]string{"a": "here", "b": "elsewhere"}[home], func(b *testing.B) {
			var req enforcer.Request
			req.Descriptors[rules.KeyAPIKey] = keysHomedIn(b, set.Rule("paid"), home, []string{"a", "b"}, 1)[0]
			req.Descriptors[rules.KeyClientIP] = "192.0.2.1"
			ctx := context.Background()
			var d enforcer.Decision
			if err := l.Decide(ctx, &req, &d); err != nil || d.Err != nil {
				b.Fatal(err, d.Err)
			}
			trips := l.RoundTrips()
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if err := l.Decide(ctx, &req, &d); err != nil || d.Err != nil || d.Outcome != decision.Allowed {
					b.Fatal(err, d.Err, d.Outcome)
				}
			}
			b.ReportMetric(float64(l.RoundTrips()-trips)/float64(b.N), "round-trips/op")
		})
	}
}
