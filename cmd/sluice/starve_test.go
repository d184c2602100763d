package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/syncbuf"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Degraded, for real: sluice serve processes (this test binary as main)
// starved of CPU by a cgroup quota, or against a redis-server that is killed
// under load and restarted empty, driven over Envoy's RLS v3 gRPC API by a
// load generator in the test. Each case takes its -starve.duration (20 s)
// of real time: they run in make's fault target, alone on the machine, in
// parallel with one another (each has its own sidecars, cgroup and Redis).
// docs/enforcement.md, "Budget and circuit breaker" and "Storage errors",
// quotes them.

var (
	starveDuration = flag.Duration("starve.duration", 20*time.Second, "how long each starvation and outage case offers load (TestStarvedSidecar, TestRedisOutageThreeSidecars)")
	starveRuns     = flag.Int("starve.runs", 20, "runs of the Kong scenario (TestStarvedSidecar/kong)")
)

// starveRules are the cases' rules: a 40-per-hour bucket per user (the
// 1 000-key case), a 10/s bucket per tenant (the 10-key case), a
// 50-per-hour bucket per API key (the Kong scenario), and a 100-per-hour
// bucket per user in domain "o" (the outage).
const starveRules = `
domain: s
rules:
  - {id: hour, match: [{key: user}], limit: 40, period: 1h}
  - {id: second, match: [{key: tenant}], limit: 10, period: 1s}
  - {id: kong, match: [{key: api_key}], limit: 50, period: 1h}
`

const outageRules = `
domain: o
rules:
  - {id: outage, match: [{key: user}], limit: 100, period: 1h}
`

// cpuQuota is a cgroup with a CPU quota that the test made and removes at
// its end: cgroup v1's cpu controller (cpu.cfs_quota_us over
// cpu.cfs_period_us), or v2's cpu.max.
type cpuQuota struct {
	dir string
	v2  bool
}

// newCPUQuota makes a cgroup that holds its processes to cores (0.25: a
// quarter of one), or skips the test, saying why, where neither cgroup
// version's cpu controller is writable (not root, no controller).
func newCPUQuota(t *testing.T, cores float64) *cpuQuota {
	t.Helper()
	name := fmt.Sprintf("sluice-test-%d-%s", os.Getpid(), strings.NewReplacer("/", "-", " ", "-").Replace(t.Name()))
	const period = 100_000 // µs, the kernel's default
	quota := int(cores * period)
	v1 := "/sys/fs/cgroup/cpu"
	if _, err := os.Stat(filepath.Join(v1, "cpu.cfs_quota_us")); err == nil {
		q := &cpuQuota{dir: filepath.Join(v1, name)}
		if err := os.Mkdir(q.dir, 0o755); err != nil {
			t.Skipf("cgroup v1's cpu controller is not writable (%v): cannot starve the sidecar", err)
		}
		t.Cleanup(q.remove)
		q.write(t, "cpu.cfs_period_us", strconv.Itoa(period))
		q.write(t, "cpu.cfs_quota_us", strconv.Itoa(quota))
		return q
	}
	v2 := "/sys/fs/cgroup"
	if b, err := os.ReadFile(filepath.Join(v2, "cgroup.subtree_control")); err == nil && strings.Contains(string(b), "cpu") {
		q := &cpuQuota{dir: filepath.Join(v2, name), v2: true}
		if err := os.Mkdir(q.dir, 0o755); err != nil {
			t.Skipf("cgroup v2 is not writable (%v): cannot starve the sidecar", err)
		}
		t.Cleanup(q.remove)
		q.write(t, "cpu.max", fmt.Sprintf("%d %d", quota, period))
		return q
	}
	t.Skip("neither cgroup v1's cpu controller (/sys/fs/cgroup/cpu) nor cgroup v2's cpu.max is available: cannot starve the sidecar")
	return nil
}

func (q *cpuQuota) write(t *testing.T, file, v string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(q.dir, file), []byte(v), 0o644); err != nil {
		t.Fatalf("cgroup %s: %v", file, err)
	}
}

// add moves process pid (all its threads) into the cgroup.
func (q *cpuQuota) add(t *testing.T, pid int) {
	t.Helper()
	q.write(t, "cgroup.procs", strconv.Itoa(pid))
}

// throttled returns how long the cgroup's processes were held back by the
// quota so far.
func (q *cpuQuota) throttled() time.Duration {
	b, _ := os.ReadFile(filepath.Join(q.dir, "cpu.stat"))
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "throttled_time "); ok { // v1, ns
			n, _ := strconv.ParseInt(v, 10, 64)
			return time.Duration(n)
		}
		if v, ok := strings.CutPrefix(l, "throttled_usec "); ok { // v2
			n, _ := strconv.ParseInt(v, 10, 64)
			return time.Duration(n) * time.Microsecond
		}
	}
	return 0
}

// remove deletes the cgroup, once its processes have ended (the sidecars'
// cleanups, registered after it, run first).
func (q *cpuQuota) remove() {
	for i := 0; i < 50; i++ {
		if err := os.Remove(q.dir); err == nil || errors.Is(err, os.ErrNotExist) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// redisProc is a redis-server process of the test's own, which it can kill
// and restart empty on the same port.
type redisProc struct {
	port int
	cmd  *exec.Cmd
}

func startRedis(t *testing.T) *redisProc {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &redisProc{port: ln.Addr().(*net.TCPAddr).Port}
	ln.Close()
	r.start(t)
	t.Cleanup(r.kill)
	return r
}

func (r *redisProc) addr() string { return fmt.Sprintf("127.0.0.1:%d", r.port) }

func (r *redisProc) start(t *testing.T) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not installed (deploy/ci/deps.sh installs it)")
	}
	r.cmd = exec.Command(bin, "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if c, err := net.Dial("tcp", r.addr()); err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("redis-server did not listen within 10 s")
		}
	}
}

// kill ends the server with SIGKILL: its data is gone.
func (r *redisProc) kill() {
	if r.cmd != nil && r.cmd.ProcessState == nil {
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
	}
}

// sidecarProc is a `sluice serve` process: this test binary as main.
type sidecarProc struct {
	cmd        *exec.Cmd
	log        *syncbuf.Buffer
	grpc, http string
}

// serveProc starts `sluice serve` with the rules and args and waits until
// it listens; the test's cleanup stops it (SIGTERM, no drain delay).
func serveProc(t *testing.T, rulesYAML string, args ...string) *sidecarProc {
	t.Helper()
	f := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(f, []byte(rulesYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], append([]string{"serve", "--rules", f, "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--admin-http", "127.0.0.1:0", "--drain-delay", "0s"}, args...)...)
	cmd.Env = append(os.Environ(), "SLUICE_TEST_AS_MAIN=1", "OTEL_SDK_DISABLED=true")
	s := &sidecarProc{cmd: cmd, log: new(syncbuf.Buffer)}
	cmd.Stderr, cmd.Stdout = s.log, io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		}
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if m := listening.FindStringSubmatch(s.log.String()); m != nil {
			s.grpc, s.http = m[1], m[2]
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("sluice serve did not listen within 30 s:\n%s", s.log)
		}
	}
}

// metric returns the sum of the series of name (with every label set) on
// the sidecar's /metrics; NaN when there is none.
func (s *sidecarProc) metric(t *testing.T, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + s.http + "/metrics")
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	sum, found := 0.0, false
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(l, name+" ") && !strings.HasPrefix(l, name+"{") {
			continue
		}
		f, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
		if err == nil {
			sum, found = sum+f, true
		}
	}
	if !found {
		return math.NaN()
	}
	return sum
}

// diagnostics logs what the sidecar's metrics say of its degraded
// decisions.
func (s *sidecarProc) diagnostics(t *testing.T, label string) {
	t.Helper()
	var b strings.Builder
	for _, m := range []string{
		"sluice_enforcer_decisions_total", "sluice_enforcer_degraded_decisions_total", "sluice_enforcer_shed_total",
		"sluice_enforcer_breaker_trips_total", "sluice_enforcer_redis_errors_total", "sluice_enforcer_fallback_rules_total",
		"sluice_enforcer_debt_units_charged_total", "sluice_enforcer_debt_units_lost_total", "sluice_enforcer_fallback_instances",
		"sluice_enforcer_remembered_keys", "sluice_enforcer_deny_cache_hits_total", "sluice_enforcer_lease_hits_total",
		"sluice_enforcer_late_retries_total", "sluice_enforcer_stalls_total", "sluice_enforcer_stalled_seconds_total", "sluice_enforcer_stall_wait_seconds",
	} {
		fmt.Fprintf(&b, " %s=%g", strings.TrimPrefix(m, "sluice_enforcer_"), s.metric(t, m))
	}
	t.Logf("%s:%s", label, b.String())
	if l := s.series(t, "sluice_enforcer_redis_errors_total{"); l != "" {
		t.Logf("%s: %s", label, l)
	}
}

// series returns the sidecar's /metrics lines that start with prefix, on
// one line.
func (s *sidecarProc) series(t *testing.T, prefix string) string {
	t.Helper()
	resp, err := http.Get("http://" + s.http + "/metrics")
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, prefix) && !strings.HasSuffix(l, " 0") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "; ")
}

// keyTally is one key's answers under load.
type keyTally struct {
	allowed, denied atomic.Int64
	first, last     atomic.Int64    // Unix ns: the first request sent, the last answer received
	byPhase         [3]atomic.Int64 // allowed, by the load's phase when the check was sent
}

// load is a load generator over Envoy's RLS v3 gRPC API: workers send the
// checks of a schedule, each at its due time or as soon as a worker is
// free, and tally the answers by key.
type load struct {
	conns  []*grpc.ClientConn
	domain string
	entry  string // the descriptor entry's key, e.g. user_id
	keys   []string
	tally  []keyTally
	errs   atomic.Int64
	first  atomic.Pointer[error]
	phase  atomic.Int32 // set by the test: 0, 1, 2
}

func newLoad(t *testing.T, addrs []string, domain, entry string, keys []string) *load {
	t.Helper()
	l := &load{domain: domain, entry: entry, keys: keys, tally: make([]keyTally, len(keys))}
	for i := range 4 * len(addrs) { // 4 connections per sidecar, as rlsload's default
		cc, err := grpc.NewClient(addrs[i%len(addrs)], grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		l.conns = append(l.conns, cc)
	}
	for i := range l.tally {
		l.tally[i].first.Store(math.MaxInt64)
	}
	return l
}

// check sends one check for key k on connection conn.
func (l *load) check(ctx context.Context, conn, k int) {
	req := &rlsv3.RateLimitRequest{Domain: l.domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: l.entry, Value: l.keys[k]}}},
	}}
	kt := &l.tally[k]
	phase := l.phase.Load()
	sent := time.Now().UnixNano()
	for f := kt.first.Load(); sent < f && !kt.first.CompareAndSwap(f, sent); f = kt.first.Load() {
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	resp, err := rlsv3.NewRateLimitServiceClient(l.conns[conn%len(l.conns)]).ShouldRateLimit(cctx, req)
	cancel()
	got := time.Now().UnixNano()
	for v := kt.last.Load(); got > v && !kt.last.CompareAndSwap(v, got); v = kt.last.Load() {
	}
	switch {
	case err != nil:
		l.errs.Add(1)
		l.first.CompareAndSwap(nil, &err)
	case resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
		kt.allowed.Add(1)
		kt.byPhase[phase].Add(1)
	default:
		kt.denied.Add(1)
	}
}

// run sends n checks spread evenly over d by workers workers, check i for
// key key(i), and returns when all are answered. With n 0 it is a closed
// loop: each worker sends its next check as soon as it has an answer, until
// d has passed (or stop closes).
func (l *load) run(workers, n int, d time.Duration, key func(i int) int, stop <-chan struct{}) time.Duration {
	var next atomic.Int64
	start := time.Now()
	end := start.Add(d)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				switch {
				case n > 0 && i >= n, n == 0 && time.Now().After(end):
					return
				case n > 0:
					if wait := time.Until(start.Add(time.Duration(int64(d) * int64(i) / int64(n)))); wait > 0 {
						time.Sleep(wait)
					}
				}
				select {
				case <-stop:
					return
				default:
				}
				l.check(context.Background(), w, key(i))
			}
		}()
	}
	wg.Wait()
	return time.Since(start)
}

// exact is what an exact token bucket of limit per period and burst allows a
// key at most between its first request and its last answer.
func (kt *keyTally) exact(limit, burst int64, period time.Duration) int64 {
	span := time.Duration(max(0, kt.last.Load()-kt.first.Load()))
	return burst + int64(float64(limit)*span.Seconds()/period.Seconds())
}

// checkExact fails unless the keys' allowed total is within total × the
// exact total and every key's within perKey × its own exact count, and no
// check was answered with an error.
func (l *load) checkExact(t *testing.T, limit, burst int64, period time.Duration, total, perKey float64) {
	t.Helper()
	var allowed, exact, offered int64
	worst, worstKey := 0.0, ""
	for i := range l.tally {
		kt := &l.tally[i]
		a, e := kt.allowed.Load(), kt.exact(limit, burst, period)
		allowed, exact, offered = allowed+a, exact+e, offered+a+kt.denied.Load()
		if r := float64(a) / float64(e); r > worst {
			worst, worstKey = r, l.keys[i]
		}
		if float64(a) > perKey*float64(e) {
			t.Errorf("key %s: %d allowed, exact %d: %.3f×, want at most %.2f×", l.keys[i], a, e, float64(a)/float64(e), perKey)
		}
	}
	t.Logf("%d keys: %d checks answered, %d allowed, exact %d: %.4f× (worst key %s %.3f×), %d errors",
		len(l.keys), offered, allowed, exact, float64(allowed)/float64(exact), worstKey, worst, l.errs.Load())
	if float64(allowed) > total*float64(exact) {
		t.Errorf("%d allowed of an exact %d: %.4f×, want at most %.2f×", allowed, exact, float64(allowed)/float64(exact), total)
	}
	if n := l.errs.Load(); n > 0 {
		t.Errorf("%d checks answered with an error (the first: %v), want none", n, *l.first.Load())
	}
}

func keyNames(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s%04d", prefix, i)
	}
	return keys
}

// starvedSidecar starts a redis-server and a sidecar with the default
// budget held to a quarter of a core.
func starvedSidecar(t *testing.T, args ...string) (*sidecarProc, *cpuQuota) {
	t.Helper()
	q := newCPUQuota(t, 0.25)
	r := startRedis(t)
	s := serveProc(t, starveRules, append([]string{"--redis", r.addr()}, args...)...)
	q.add(t, s.cmd.Process.Pid)
	return s, q
}

// TestStarvedSidecar: a sidecar held to a quarter of a core by a cgroup
// quota, with a healthy redis-server and the default budget, still keeps
// its limits and answers every check.
func TestStarvedSidecar(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: real-time load for -starve.duration")
	}
	t.Parallel() // beside TestRedisOutageThreeSidecars (make fault: -parallel 4)
	// 256 workers, 1 000 keys each offered twice its limit of 40 an hour
	// over the duration: about 4 000 checks a second (one unit over the limit is 2.5% of it).
	t.Run("1000-keys", func(t *testing.T) {
		t.Parallel()
		s, q := starvedSidecar(t)
		keys := keyNames("u", 1000)
		l := newLoad(t, []string{s.grpc}, "s", "user_id", keys)
		took := l.run(256, 2*40*len(keys), *starveDuration, func(i int) int { return i % len(keys) }, nil)
		t.Logf("offered in %v; throttled %v", took.Round(time.Millisecond), q.throttled().Round(time.Millisecond))
		s.diagnostics(t, "sidecar")
		l.checkExact(t, 40, 40, time.Hour, 1.02, 1.05)
	})
	// 256 workers in a closed loop (each sends its next check as soon as it
	// has an answer, as rlsload does) on 10 keys of a 10/s limit: each
	// offered many times its limit, and the sidecar at its quota.
	t.Run("10-keys", func(t *testing.T) {
		t.Parallel()
		s, q := starvedSidecar(t)
		keys := keyNames("t", 10)
		l := newLoad(t, []string{s.grpc}, "s", "tenant_id", keys)
		took := l.run(256, 0, *starveDuration, func(i int) int { return i % len(keys) }, nil)
		t.Logf("offered in %v; throttled %v", took.Round(time.Millisecond), q.throttled().Round(time.Millisecond))
		s.diagnostics(t, "sidecar")
		l.checkExact(t, 10, 10, time.Second, 1.02, 1.05)
	})
	// Kong's report: 50 concurrent requests against a limit of 50, each
	// worker sending 3 back to back, a fresh key each run, while 206 other
	// workers keep the sidecar at its quota (a closed loop on the 1 000
	// users): never more than 50 allowed.
	t.Run("kong", func(t *testing.T) {
		t.Parallel()
		s, q := starvedSidecar(t)
		bg := newLoad(t, []string{s.grpc}, "s", "user_id", keyNames("u", 1000))
		stop := make(chan struct{})
		bgDone := make(chan struct{})
		go func() {
			defer close(bgDone)
			bg.run(206, 0, time.Hour, func(i int) int { return i % 1000 }, stop)
		}()
		time.Sleep(2 * time.Second) // at its quota
		over := 0
		for run := range *starveRuns {
			keys := []string{fmt.Sprintf("kong-%d", run)}
			l := newLoad(t, []string{s.grpc}, "s", "x-api-key", keys)
			l.run(50, 150, 0, func(int) int { return 0 }, nil)
			a := l.tally[0].allowed.Load()
			if a > 50 {
				over++
				t.Errorf("run %d: %d allowed of a limit of 50", run, a)
			}
			if n := l.errs.Load(); n > 0 {
				t.Errorf("run %d: %d errors (the first: %v)", run, n, *l.first.Load())
			}
		}
		close(stop)
		<-bgDone
		s.diagnostics(t, "sidecar")
		t.Logf("%d of %d runs over the limit; throttled %v", over, *starveRuns, q.throttled().Round(time.Millisecond))
		if n := bg.errs.Load(); n > 0 {
			t.Errorf("%d background checks answered with an error (the first: %v)", n, *bg.first.Load())
		}
	})
}

// TestRedisOutageThreeSidecars: three sidecars (not starved) share one
// redis-server that is killed under load for -starve.duration and restarted
// empty. Each has learned through Redis that there are three of them, and
// keeps that count while Redis is away; each continues every key from what
// Redis last said, with a third of it; and what they granted is charged to
// the restarted Redis. Per key, the three fallbacks together allow at most
// the limit × 1.1 over the outage, and the run at most its exact count ×
// 1.1. A sidecar started while Redis is down has no remembered state, says
// so, and divides by its --instances or by the default, 1.
func TestRedisOutageThreeSidecars(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: real-time load for -starve.duration")
	}
	t.Parallel()
	r := startRedis(t)
	var sc []*sidecarProc
	var addrs []string
	for range 3 {
		s := serveProc(t, outageRules, "--redis", r.addr())
		sc, addrs = append(sc, s), append(addrs, s.grpc)
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		n := 0
		for _, s := range sc {
			if s.metric(t, "sluice_enforcer_fallback_instances") == 3 && s.metric(t, "sluice_enforcer_fallback_instances_learned") == 1 {
				n++
			}
		}
		if n == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sidecars did not learn within 15 s that there are 3 of them")
		}
	}
	// 100 keys, key i offered 1 + i%8 checks a second, through the three
	// sidecars in turn: 6 s with Redis, the outage, 6 s with the restarted
	// Redis.
	keys := keyNames("o", 100)
	before, outage, after := 6*time.Second, *starveDuration, 6*time.Second
	total := before + outage + after
	type event struct {
		at  time.Duration
		key int
	}
	var events []event
	for k := range keys {
		rate := 1 + k%8
		for at := time.Duration(0); at < total; at += time.Second / time.Duration(rate) {
			events = append(events, event{at + time.Duration(k)*time.Millisecond, k})
		}
	}
	slices.SortFunc(events, func(a, b event) int { return cmp.Compare(a.at, b.at) })
	l := newLoad(t, addrs, "o", "user_id", keys)
	done := make(chan time.Duration)
	go func() { done <- l.run(64, len(events), total, func(i int) int { return events[i].key }, nil) }()

	time.Sleep(before)
	r.kill()
	l.phase.Store(1)
	killed := time.Now()
	// A sidecar started now has no remembered state: it says so, and
	// divides by the default (1) or its --instances.
	for _, c := range []struct {
		args      []string
		instances float64
		from      string
	}{{nil, 1, "default"}, {[]string{"--instances", "3"}, 3, "override"}} {
		s := serveProc(t, outageRules, append([]string{"--redis", r.addr()}, c.args...)...)
		pl := newLoad(t, []string{s.grpc}, "o", "user_id", []string{"restarted-" + c.from})
		pl.run(1, 1, 0, func(int) int { return 0 }, nil)
		if got := s.metric(t, "sluice_enforcer_fallback_instances"); got != c.instances || s.metric(t, "sluice_enforcer_remembered_keys") != 0 ||
			s.metric(t, "sluice_enforcer_fallback_instances_learned") != 0 {
			t.Errorf("a sidecar started with Redis down (%s): %v instances, %v keys remembered; want %v, none", c.from, got, s.metric(t, "sluice_enforcer_remembered_keys"), c.instances)
		}
		if !strings.Contains(s.log.String(), "no remembered Redis state") || !strings.Contains(s.log.String(), "instances_from="+c.from) {
			t.Errorf("a sidecar started with Redis down (%s) does not say it has no remembered state:\n%s", c.from, s.log)
		}
		if pl.tally[0].allowed.Load() != 1 || pl.errs.Load() != 0 {
			t.Errorf("a sidecar started with Redis down (%s): its check was not allowed by the fallback", c.from)
		}
	}
	time.Sleep(outage - time.Since(killed))
	for i, s := range sc {
		if got := s.metric(t, "sluice_enforcer_fallback_instances"); got != 3 {
			t.Errorf("sidecar %d during the outage: its fallback divides by %v, want the 3 it learned", i, got)
		}
	}
	r.start(t) // empty
	l.phase.Store(2)
	took := <-done
	t.Logf("offered in %v", took.Round(time.Millisecond))
	time.Sleep(2 * time.Second) // a refresh: the last debts charged
	for i, s := range sc {
		s.diagnostics(t, fmt.Sprintf("sidecar %d", i))
		if s.metric(t, "sluice_enforcer_debt_units_charged_total") == 0 {
			t.Errorf("sidecar %d charged nothing to the restarted Redis", i)
		}
	}
	// Over the outage, the three fallbacks together: at most the limit ×
	// 1.1. From the kill to the end: the restarted Redis lost what it had
	// counted before, so it starts every key full, less the outage's debts
	// charged to it: at most an exact bucket's count from full × 1.1.
	var during, since, exact, worst int64
	for i := range l.tally {
		kt := &l.tally[i]
		o, a := kt.byPhase[1].Load(), kt.byPhase[2].Load()
		worst = max(worst, o)
		e := 100 + int64(100*time.Since(killed).Seconds()/3600)
		during, since, exact = during+o, since+o+a, exact+e
		if float64(o) > 1.1*100 {
			t.Errorf("key %s: %d allowed over the outage by the three fallbacks, want at most 110 (its limit × 1.1)", keys[i], o)
		}
		if float64(o+a) > 1.1*float64(e) {
			t.Errorf("key %s: %d allowed from the kill to the end (%d over the outage, %d after it), want at most 1.1 × %d: the outage's grants charged to the restarted Redis",
				keys[i], o+a, o, a, e)
		}
	}
	t.Logf("%d keys: %d allowed over the outage (at most %d a key); %d from the kill to the end, exact from full %d (%.3f×); %d errors",
		len(keys), during, worst, since, exact, float64(since)/float64(exact), l.errs.Load())
	if n := l.errs.Load(); n > 0 {
		t.Errorf("%d checks answered with an error (the first: %v), want none", n, *l.first.Load())
	}
}
