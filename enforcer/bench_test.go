package enforcer_test

import (
	"context"
	"fmt"
	"math/rand"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// benchLimiter returns a limiter with n rules (up to 4: user, client_ip,
// tenant, api_key) of the given algorithm, none of which denies, and a request
// that matches them all. Leases and the deny cache are off (every decision
// goes to Redis) unless hot is set.
func benchLimiter(b *testing.B, n int, alg string, hot ...bool) (*enforcer.Limiter, *enforcer.Request) {
	return benchLimiterOn(b, redistest.Server(b), n, alg, hot...)
}

// benchLimiterOn is benchLimiter on the Redis of rdb.
func benchLimiterOn(b *testing.B, rdb *redis.Client, n int, alg string, hot ...bool) (*enforcer.Limiter, *enforcer.Request) {
	y := "domain: b\nrules:\n"
	keys := []string{"user", "client_ip", "tenant", "api_key"}
	for i := 0; i < n; i++ {
		y += fmt.Sprintf("  - {id: r%d, algorithm: %s, match: [{key: %s}], limit: 1000000000, period: 1s}\n", i, alg, keys[i])
	}
	set, err := rules.Parse("b.yaml", []byte(y))
	if err != nil {
		b.Fatal(err)
	}
	o := enforcer.Options{Budget: time.Second, HotKeys: enforcer.HotKeyOptions{Table: -1}}
	if len(hot) > 0 && hot[0] {
		o.HotKeys.Table = 0
	}
	l, err := enforcer.New(rdb, set, o)
	if err != nil {
		b.Fatal(err)
	}
	req := &enforcer.Request{}
	req.Descriptors = rules.Descriptors{rules.KeyUser: "u", rules.KeyClientIP: "192.0.2.1", rules.KeyTenant: "t", rules.KeyAPIKey: "k"}
	return l, req
}

// BenchmarkCheck measures one decision, back to back, against a local
// redis-server: allocations and Redis round trips per decision. It reuses one
// Decision (Limiter.Decide), as a server's request loop does.
func BenchmarkCheck(b *testing.B) {
	for _, alg := range []string{"token_bucket", "sliding_window", "fixed_window"} {
		for _, n := range []int{1, 4} {
			b.Run(fmt.Sprintf("%s/rules=%d", alg, n), func(b *testing.B) {
				l, req := benchLimiter(b, n, alg)
				ctx := context.Background()
				var d enforcer.Decision
				if err := l.Decide(ctx, req, &d); err != nil || d.Err != nil { // warm: script loaded, pool filled
					b.Fatal(err, d.Err)
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
}

// BenchmarkHotKey decides one hot key back to back (4 rules, every one of
// them on the request's key), with and without leases: time, allocations
// and Redis round trips per decision.
func BenchmarkHotKey(b *testing.B) {
	for _, lease := range []bool{false, true} {
		b.Run(fmt.Sprintf("lease=%v", lease), func(b *testing.B) {
			l, req := benchLimiter(b, 4, "token_bucket", lease)
			ctx := context.Background()
			var d enforcer.Decision
			for i := 0; i < 1000; i++ { // warm: the key is hot, blocks fetched
				if err := l.Decide(ctx, req, &d); err != nil || d.Err != nil {
					b.Fatal(err, d.Err)
				}
			}
			trips := l.RoundTrips()
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				var d enforcer.Decision
				r := *req
				for pb.Next() {
					if err := l.Decide(ctx, &r, &d); err != nil || d.Err != nil || d.Outcome != decision.Allowed {
						b.Error(err, d.Err, d.Outcome)
						return
					}
				}
			})
			b.ReportMetric(float64(l.RoundTrips()-trips)/float64(b.N), "round-trips/op")
		})
	}
}

// BenchmarkLatencyAt10k offers decisions at a fixed 10 000 per second for
// 3 s per iteration and reports latency quantiles. It is open loop: 32
// workers each own every 32nd slot of a 100 µs schedule and sleep until their
// slot, so a slow decision does not slow the offered rate. "p99-µs" is from
// the call's start to its end; "p99-sched-µs" counts from the scheduled
// start, so it also holds timer lateness and queueing behind a slow call
// (no coordinated omission). Run it with -benchtime=1x.
func BenchmarkLatencyAt10k(b *testing.B) {
	const rate, dur, workers = 10_000, 3 * time.Second, 32
	for _, n := range []int{1, 4} {
		b.Run(fmt.Sprintf("rules=%d", n), func(b *testing.B) {
			l, req := benchLimiter(b, n, "token_bucket")
			ctx := context.Background()
			var lat, sched []time.Duration
			for it := 0; it < b.N; it++ {
				total := int(rate * dur / time.Second)
				outL := make([][]time.Duration, workers)
				outS := make([][]time.Duration, workers)
				var wg sync.WaitGroup
				start := time.Now().Add(10 * time.Millisecond)
				for w := 0; w < workers; w++ {
					wg.Add(1)
					go func(w int) {
						defer wg.Done()
						var d enforcer.Decision
						r := *req
						for i := w; i < total; i += workers {
							at := start.Add(time.Duration(i) * time.Second / rate)
							if s := time.Until(at); s > 0 {
								time.Sleep(s)
							}
							t0 := time.Now()
							if err := l.Decide(ctx, &r, &d); err != nil || d.Err != nil {
								b.Error(err, d.Err)
								return
							}
							t1 := time.Now()
							outL[w] = append(outL[w], t1.Sub(t0))
							outS[w] = append(outS[w], t1.Sub(at))
						}
					}(w)
				}
				wg.Wait()
				for w := range outL {
					lat = append(lat, outL[w]...)
					sched = append(sched, outS[w]...)
				}
			}
			q := func(xs []time.Duration, p float64) float64 {
				slices.Sort(xs)
				return float64(xs[int(p*float64(len(xs)-1))].Microseconds())
			}
			b.ReportMetric(q(lat, 0.50), "p50-µs")
			b.ReportMetric(q(lat, 0.99), "p99-µs")
			b.ReportMetric(q(lat, 0.999), "p99.9-µs")
			b.ReportMetric(q(sched, 0.99), "p99-sched-µs")
		})
	}
}

// BenchmarkCheckParallel measures decisions made concurrently (RunParallel,
// each goroutine its own user, so no key is hot), which the batcher puts
// in batched script calls: allocations per decision, the decisions per
// Redis round trip.
func BenchmarkCheckParallel(b *testing.B) {
	for _, n := range []int{1, 4} {
		b.Run(fmt.Sprintf("rules=%d", n), func(b *testing.B) {
			l, _ := benchLimiter(b, n, "token_bucket")
			ctx := context.Background()
			var id atomic.Int64
			trips := l.RoundTrips()
			b.ReportAllocs()
			b.SetParallelism(16)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				req := &enforcer.Request{}
				u := fmt.Sprint("u", id.Add(1))
				req.Descriptors = rules.Descriptors{rules.KeyUser: u, rules.KeyClientIP: "192.0.2.1", rules.KeyTenant: u, rules.KeyAPIKey: u}
				var d enforcer.Decision
				for pb.Next() {
					if err := l.Decide(ctx, req, &d); err != nil || d.Err != nil {
						b.Error(err, d.Err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/float64(l.RoundTrips()-trips), "decisions/round-trip")
		})
	}
}

// BenchmarkScriptCost measures what a decision costs Redis, as
// deploy/bench/rls.sh's load offers it: 64 goroutines, each request drawing
// every descriptor's value from a Zipf distribution (s = 1.1) over 10 000
// keys, token-bucket rules of a limit that never denies, every decision on
// Redis. It reports Redis's own CPU (INFO cpu, user + sys) and the script's
// time (INFO commandstats, usec) per decision, in µs, and the decisions per
// script call.
func BenchmarkScriptCost(b *testing.B) {
	for _, n := range []int{1, 4} {
		b.Run(fmt.Sprintf("rules=%d", n), func(b *testing.B) {
			rc := redistest.Server(b)
			l, _ := benchLimiterOn(b, rc, n, "token_bucket")
			ctx := context.Background()
			keys := make([]string, 10000)
			for i := range keys {
				keys[i] = fmt.Sprintf("key%05d", i)
			}
			var seed atomic.Int64
			cpu0, usec0 := redisCost(b, rc)
			trips := l.RoundTrips()
			b.ReportAllocs()
			b.SetParallelism(32)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				rng := rand.New(rand.NewSource(seed.Add(1)))
				z := rand.NewZipf(rng, 1.1, 1, uint64(len(keys)-1))
				req := &enforcer.Request{Descriptors: rules.Descriptors{}}
				var d enforcer.Decision
				for pb.Next() {
					req.Descriptors[rules.KeyUser] = keys[z.Uint64()]
					req.Descriptors[rules.KeyClientIP] = keys[z.Uint64()]
					req.Descriptors[rules.KeyTenant] = keys[z.Uint64()]
					req.Descriptors[rules.KeyAPIKey] = keys[z.Uint64()]
					if err := l.Decide(ctx, req, &d); err != nil || d.Err != nil {
						b.Error(err, d.Err)
						return
					}
				}
			})
			b.StopTimer()
			cpu1, usec1 := redisCost(b, rc)
			b.ReportMetric((cpu1-cpu0)/float64(b.N), "redis-cpu-µs/op")
			b.ReportMetric((usec1-usec0)/float64(b.N), "redis-cmd-µs/op")
			b.ReportMetric(float64(b.N)/float64(l.RoundTrips()-trips), "decisions/round-trip")
		})
	}
}

// redisCost reads Redis's CPU (INFO cpu: used_cpu_user + used_cpu_sys) and
// the time spent in commands (INFO commandstats: the sum of usec), both in µs.
func redisCost(b *testing.B, rc *redis.Client) (cpu, usec float64) {
	info, err := rc.Info(context.Background(), "cpu", "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_cpu_user:"); ok {
			f, _ := strconv.ParseFloat(v, 64)
			cpu += f * 1e6
		} else if v, ok := strings.CutPrefix(line, "used_cpu_sys:"); ok {
			f, _ := strconv.ParseFloat(v, 64)
			cpu += f * 1e6
		} else if strings.HasPrefix(line, "cmdstat_") {
			_, rest, _ := strings.Cut(line, "usec=")
			v, _, _ := strings.Cut(rest, ",")
			f, _ := strconv.ParseFloat(v, 64)
			usec += f
		}
	}
	return cpu, usec
}
