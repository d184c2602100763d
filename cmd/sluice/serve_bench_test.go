package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/benchrls"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestMain runs this test binary as a sidecar process when the latency
// benchmark starts it so (see startSidecar). go-redis logs through slog's
// debug level, as in the binary (main), not to stderr: the tests' expected
// dial failures would otherwise bury a real failure's output.
//
// SLUICE_TEST_AS_MAIN=1 makes it the sluice binary (main), as
// TestDocsBlocks runs the docs' commands.
func TestMain(m *testing.M) {
	if os.Getenv("SLUICE_TEST_AS_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	redis.SetLogger(redisLog{})
	if addr := os.Getenv("SLUICE_BENCH_SIDECAR_REDIS"); addr != "" {
		os.Exit(runSidecarChild(addr))
	}
	os.Exit(m.Run())
}

func runSidecarChild(redisAddr string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	// SLUICE_BENCH_SIDECAR_CPUPROFILE=file profiles the sidecar process.
	if path := os.Getenv("SLUICE_BENCH_SIDECAR_CPUPROFILE"); path != "" {
		if pf, err := os.Create(path); err == nil {
			if err := pprof.StartCPUProfile(pf); err == nil {
				defer pprof.StopCPUProfile()
			}
		}
	}
	f, err := os.CreateTemp("", "bench-rules-*.yaml")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.Remove(f.Name())
	_, _ = f.WriteString(benchrls.Rules)
	f.Close()
	err = runServe(ctx, serveConfig{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", RulesFile: f.Name(), Redis: []string{redisAddr},
		Limiter: enforcer.Options{Budget: 50 * time.Millisecond},
		Listening: func(g, h net.Addr) {
			fmt.Printf("listening grpc=%s http=%s\n", g, h)
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

var childAddrs = regexp.MustCompile(`grpc=(\S+) http=(\S+)`)

// startSidecar runs the sidecar in a process of its own, as it is deployed,
// and returns its pid and addresses; it is stopped with SIGTERM at the
// benchmark's end.
func startSidecar(b *testing.B, redisAddr string) (pid int, grpcAddr, httpAddr string) {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SLUICE_BENCH_SIDECAR_REDIS="+redisAddr)
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if m := childAddrs.FindStringSubmatch(sc.Text()); m != nil {
			go func() { _, _ = io.Copy(io.Discard, out) }()
			return cmd.Process.Pid, m[1], m[2]
		}
	}
	b.Fatalf("the sidecar process did not start: %s", stderr.String())
	return 0, "", ""
}

// processCPU returns the CPU time (user + system) of process pid so far;
// pid 0 is this process.
func processCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	if pid == 0 {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command name (which may hold spaces) in parentheses;
	// utime and stime are fields 14 and 15, in clock ticks of 1/100 s.
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// redisPID returns the pid of the redis-server listening on addr's port.
func redisPID(b *testing.B, addr string) int {
	b.Helper()
	_, port, _ := net.SplitHostPort(addr)
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		cmd, _ := os.ReadFile("/proc/" + d.Name() + "/cmdline")
		f := strings.Fields(strings.ReplaceAll(string(cmd), "\x00", " "))
		if len(f) > 1 && strings.HasSuffix(f[0], "redis-server") && slices.ContainsFunc(f[1:], func(s string) bool { return strings.HasSuffix(s, ":"+port) }) {
			return pid
		}
	}
	b.Fatalf("no redis-server process for %s", addr)
	return 0
}

// BenchmarkLatency offers checks of 4 descriptors (4 rules) at fixed rates,
// open loop, and reports the latency the check adds to a request, as the
// gateway sees it: over gRPC and HTTP to the sidecar running in a process
// of its own, and a direct library call (Limiter.Decide) in this process,
// all against a redis-server on loopback, everything on this machine. As in
// enforcer's BenchmarkLatencyAt10k, 64 workers each own every 64th slot of
// the schedule and sleep until it, so a slow check does not slow the offered
// rate; "sched" latencies count from the scheduled start (no coordinated
// omission). "cpu-µs/check" is the CPU time of the process that decides
// (the sidecar's own process for grpc and http; this process, load
// generator included, for direct) per check, "client-cpu-µs/check" the load
// generator's (gRPC or HTTP client) and "redis-cpu-µs/check" redis-server's:
// together they show how much of the 2 cores the load takes. Run with
// -benchtime=1x.
func BenchmarkLatency(b *testing.B) {
	const workers, dur = 64, 3 * time.Second
	redisAddr := redistest.Addr(b)
	rpid := redisPID(b, redisAddr)
	for _, api := range []string{"direct", "grpc", "http"} {
		for _, rate := range []int{2000, 5000, 10000} {
			b.Run(fmt.Sprintf("%s/rate=%d", api, rate), func(b *testing.B) {
				var check func(ctx context.Context) error
				var degraded atomic.Int64
				var next atomic.Uint64 // the entity of the next check
				pid := 0
				switch api {
				case "direct":
					set, err := rules.Parse("bench.yaml", []byte(benchrls.Rules))
					if err != nil {
						b.Fatal(err)
					}
					rdb := redis.NewClient(&redis.Options{Addr: redisAddr, MaxRetries: -1, ContextTimeoutEnabled: true, DialerRetries: 1})
					defer rdb.Close()
					lim, err := enforcer.New(rdb, set, enforcer.Options{Budget: 50 * time.Millisecond})
					if err != nil {
						b.Fatal(err)
					}
					pool := sync.Pool{New: func() any { return new(enforcer.Decision) }}
					reqs := make([]enforcer.Request, benchrls.Entities)
					for i := range reqs {
						u, ip, t, k := benchrls.Entity(i)
						reqs[i] = enforcer.Request{Domain: "b", Parts: []enforcer.Part{
							{Descriptors: rules.Descriptors{rules.KeyUser: u}}, {Descriptors: rules.Descriptors{rules.KeyClientIP: ip}},
							{Descriptors: rules.Descriptors{rules.KeyTenant: t}}, {Descriptors: rules.Descriptors{rules.KeyAPIKey: k}},
						}}
					}
					check = func(ctx context.Context) error {
						d := pool.Get().(*enforcer.Decision)
						defer pool.Put(d)
						r := reqs[next.Add(1)%benchrls.Entities]
						if err := lim.Decide(ctx, &r, d); err != nil {
							return err
						}
						if d.Err != nil {
							degraded.Add(1)
						}
						return nil
					}
				case "grpc":
					var grpcAddr string
					pid, grpcAddr, _ = startSidecar(b, redisAddr)
					conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
					if err != nil {
						b.Fatal(err)
					}
					defer conn.Close()
					cl := rlsv3.NewRateLimitServiceClient(conn)
					reqs := make([]*rlsv3.RateLimitRequest, benchrls.Entities)
					for i := range reqs {
						u, ip, t, k := benchrls.Entity(i)
						reqs[i] = benchrls.Request(u, ip, t, k)
					}
					check = func(ctx context.Context) error {
						resp, err := cl.ShouldRateLimit(ctx, reqs[next.Add(1)%benchrls.Entities])
						if err == nil && resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
							err = fmt.Errorf("code %v", resp.GetOverallCode())
						}
						if err == nil && resp.GetStatuses()[0].GetCurrentLimit() == nil {
							degraded.Add(1) // no counts: Redis did not answer within the budget
						}
						return err
					}
				case "http":
					var httpAddr string
					pid, _, httpAddr = startSidecar(b, redisAddr)
					cl := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers, MaxIdleConns: workers}}
					defer cl.CloseIdleConnections()
					url := "http://" + httpAddr + "/v1/check"
					bodies := make([]string, benchrls.Entities)
					for i := range bodies {
						u, ip, t, k := benchrls.Entity(i)
						bodies[i] = fmt.Sprintf(`{"domain":"b","descriptors":[{"entries":[{"key":"user_id","value":%q}]},{"entries":[{"key":"remote_address","value":%q}]},{"entries":[{"key":"tenant_id","value":%q}]},{"entries":[{"key":"x-api-key","value":%q}]}]}`, u, ip, t, k)
					}
					check = func(context.Context) error {
						deg, err := benchrls.HTTPCheck(cl, url, bodies[next.Add(1)%benchrls.Entities])
						if deg {
							degraded.Add(1)
						}
						return err
					}
				}
				ctx := context.Background()
				for range 200 { // warm: connections, scripts
					if err := check(ctx); err != nil {
						b.Fatal(err)
					}
				}
				var lat, sched []time.Duration
				var cpu, selfCPU, redisCPU time.Duration
				var elapsed time.Duration
				total := 0
				for range b.N {
					n := rate * int(dur/time.Second)
					outL := make([][]time.Duration, workers)
					outS := make([][]time.Duration, workers)
					var wg sync.WaitGroup
					cpu0, self0, redis0 := processCPU(b, pid), processCPU(b, 0), processCPU(b, rpid)
					start := time.Now().Add(10 * time.Millisecond)
					for w := range workers {
						wg.Add(1)
						go func() {
							defer wg.Done()
							for i := w; i < n; i += workers {
								at := start.Add(time.Duration(i) * time.Second / time.Duration(rate))
								if s := time.Until(at); s > 0 {
									time.Sleep(s)
								}
								t0 := time.Now()
								if err := check(ctx); err != nil {
									b.Error(err)
									return
								}
								t1 := time.Now()
								outL[w] = append(outL[w], t1.Sub(t0))
								outS[w] = append(outS[w], t1.Sub(at))
							}
						}()
					}
					wg.Wait()
					elapsed += time.Since(start)
					cpu += processCPU(b, pid) - cpu0
					selfCPU += processCPU(b, 0) - self0
					redisCPU += processCPU(b, rpid) - redis0
					total += n
					for w := range outL {
						lat = append(lat, outL[w]...)
						sched = append(sched, outS[w]...)
					}
				}
				q := func(xs []time.Duration, p float64) float64 {
					slices.Sort(xs)
					return float64(xs[int(p*float64(len(xs)-1))].Nanoseconds()) / 1e3
				}
				b.ReportMetric(float64(total)/elapsed.Seconds(), "checks/s")
				b.ReportMetric(q(lat, 0.50), "p50-µs")
				b.ReportMetric(q(lat, 0.99), "p99-µs")
				b.ReportMetric(q(lat, 0.999), "p99.9-µs")
				b.ReportMetric(q(sched, 0.99), "p99-sched-µs")
				b.ReportMetric(q(sched, 0.999), "p99.9-sched-µs")
				b.ReportMetric(float64(cpu.Microseconds())/float64(total), "cpu-µs/check")
				if pid != 0 {
					b.ReportMetric(float64(selfCPU.Microseconds())/float64(total), "client-cpu-µs/check")
				}
				b.ReportMetric(float64(redisCPU.Microseconds())/float64(total), "redis-cpu-µs/check")
				b.ReportMetric(100*float64(degraded.Load())/float64(total), "degraded-%")
			})
		}
	}
}
