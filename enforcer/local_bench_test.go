package enforcer_test

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// BenchmarkLocalRule decides a request back to back: "local" matches one
// local-scope rule (no Redis call), "mixed" one local and one regional rule
// (one script call). Allocations and Redis round trips per decision.
func BenchmarkLocalRule(b *testing.B) {
	for _, mixed := range []bool{false, true} {
		name := "local"
		if mixed {
			name = "mixed"
		}
		b.Run(name, func(b *testing.B) {
			l, err := enforcer.New(redistest.Server(b), mustSetB(b, `
domain: b
rules:
  - {id: ip, match: [{key: client_ip}], limit: 1000000000, period: 1s, scope: local}
  - {id: key, match: [{key: api_key}], limit: 1000000000, period: 1s}
`), enforcer.Options{Budget: time.Second, HotKeys: enforcer.HotKeyOptions{Table: -1}})
			if err != nil {
				b.Fatal(err)
			}
			req := &enforcer.Request{}
			req.Descriptors[rules.KeyClientIP] = "192.0.2.1"
			if mixed {
				req.Descriptors[rules.KeyAPIKey] = "k"
			}
			ctx := context.Background()
			var d enforcer.Decision
			if err := l.Decide(ctx, req, &d); err != nil || d.Err != nil || d.Outcome != decision.Allowed {
				b.Fatal(err, d.Err, d.Outcome)
			}
			trips := l.RoundTrips()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := l.Decide(ctx, req, &d); err != nil || d.Err != nil {
					b.Fatal(err, d.Err)
				}
			}
			b.ReportMetric(float64(l.RoundTrips()-trips)/float64(b.N), "round-trips/op")
		})
	}
}

// BenchmarkLocalDistinctIPs decides one request from each of n distinct
// client IPs (a botnet's key explosion) against a local-scope per-IP rule
// with the default LocalEntities (100 000), and reports the peak heap in use
// (sampled every 10 000 decisions) and the live heap after a GC at the end,
// in MiB: bounded, they are about the same for 100 000 and 1 000 000 IPs.
// Run it with -benchtime=1x.
func BenchmarkLocalDistinctIPs(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("ips=%d", n), func(b *testing.B) {
			l, err := enforcer.New(redistest.Server(b), mustSetB(b, `
domain: b
rules: [{id: ip, match: [{key: client_ip}], limit: 100, period: 1s, scope: local}]
`), enforcer.Options{Budget: time.Second, HotKeys: enforcer.HotKeyOptions{Table: -1}})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			var d enforcer.Decision
			var ms runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&ms)
			base := ms.HeapInuse
			var peak uint64
			trips := l.RoundTrips()
			b.ResetTimer()
			for range b.N {
				for i := range n {
					req := enforcer.Request{}
					req.Descriptors[rules.KeyClientIP] = netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}).String()
					if err := l.Decide(ctx, &req, &d); err != nil || d.Outcome != decision.Allowed || d.Path != decision.PathLocal {
						b.Fatal(err, d.Outcome, d.Path)
					}
					if i%10_000 == 0 {
						runtime.ReadMemStats(&ms)
						peak = max(peak, ms.HeapInuse)
					}
				}
			}
			b.StopTimer()
			runtime.GC()
			runtime.ReadMemStats(&ms)
			if l.RoundTrips() != trips {
				b.Fatalf("%d Redis round trips for local rules", l.RoundTrips()-trips)
			}
			b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
			b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "live-heap-MiB")
			b.ReportMetric(float64(base)/(1<<20), "base-heap-MiB")
			runtime.KeepAlive(l)
		})
	}
}

func mustSetB(b *testing.B, y string) *rules.Set {
	b.Helper()
	s, err := rules.Parse("b.yaml", []byte(y))
	if err != nil {
		b.Fatal(err)
	}
	return s
}
