package enforcer_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/rules"
)

var (
	faultDuration = flag.Duration("fault.duration", 30*time.Second,
		"how long each case of TestFaultLoad offers load (Kafka is kept down for twice this)")
	faultRate = flag.Int("fault.rate", 2000, "requests per second each case of TestFaultLoad offers")
)

// faultCeiling is the longest any request of a fault case may take, from
// when it was sent to its answer: far below envoyproxy/ratelimit's 10 s
// Redis timeout, far above what the limiter should add (its 5 ms budget), so
// that a loaded CI machine never trips it while a request held by a silent
// Redis would. Under the race detector, ten times as long.
var faultCeiling = raceScaled(250 * time.Millisecond)

// faultBudget is the limiter's budget in the fault cases: the default, or
// under the race detector ten times as long (its slowed decisions would
// otherwise miss the budget while Redis is healthy).
var faultBudget = raceScaled(5 * time.Millisecond)

// raceScaled is d, or ten times d under the race detector.
func raceScaled(d time.Duration) time.Duration {
	if raceDetector {
		return 10 * d
	}
	return d
}

// faultRules: a fail-open rule on every request, a fail-closed login rule
// and an open_unlimited search rule, with limits that deny some requests of
// the load's mix while Redis answers.
const faultRules = `
domain: fault
rules:
  - {id: per-ip, match: [{key: client_ip}], limit: 20, period: 1s}
  - {id: login, failure_mode: closed, match: [{key: route, value: /login}, {key: user}], limit: 3, period: 5s}
  - {id: search, failure_mode: open_unlimited, match: [{key: route, value: /search}, {key: tenant}], limit: 1, period: 1s}
`

// loadReq is request i of the load: the same i is always the same request.
// At 2 000/s each client IP sends 2/s (never denied), each login user 1/s
// (about two in five denied), each search tenant 2/s (about one in two
// denied). Requests of one key are 500 ms apart, so that their order does
// not depend on scheduling unless requests are held far longer than
// faultCeiling.
type loadReq struct {
	i     int
	route string
	ip    string
	user  string
	tant  string
	now   time.Time // the caller's clock; zero: Redis TIME
}

func makeLoadReq(i int) loadReq {
	r := loadReq{i: i, route: "/items", ip: fmt.Sprintf("2001:db8:%x::1", i%1000)} // documentation addresses, one /64 each
	switch i % 10 {
	case 0:
		r.route, r.user = "/login", fmt.Sprint("u", (i/10)%100)
	case 1, 2, 3:
		r.route, r.tant = "/search", fmt.Sprint("t", (3*(i/10)+i%10-1)%300) // the search requests, numbered, in turn
	}
	return r
}

// loadResp is what a client of the sidecar sees.
type loadResp struct {
	status     int
	retryAfter string
}

// loadTarget sends one request to the service under test. The HTTP
// middleware stands in for the sidecar; the sidecar's own server can be
// tested by the same cases through another loadTarget.
type loadTarget func(ctx context.Context, r *loadReq) (loadResp, error)

// describeLoad reads the request's descriptors from headers, as the
// sidecar would read them from its gRPC or HTTP request.
func describeLoad(r *http.Request, req *enforcer.Request) {
	h := r.Header
	req.Descriptors[rules.KeyClientIP] = h.Get("X-Client-Ip")
	req.Descriptors[rules.KeyUser] = h.Get("X-User")
	req.Descriptors[rules.KeyTenant] = h.Get("X-Tenant")
	req.Descriptors[rules.KeyRoute] = r.URL.Path
	req.RequestID = h.Get("X-Request-Id")
	if ms, err := strconv.ParseInt(h.Get("X-Now"), 10, 64); err == nil {
		req.Now = time.UnixMilli(ms)
	}
}

// httpSidecar serves l's middleware in front of a handler that answers 200,
// on loopback, and returns a target that calls it.
func httpSidecar(t *testing.T, l *enforcer.Limiter) loadTarget {
	h := l.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), enforcer.MiddlewareOptions{Describe: describeLoad})
	srv := httptest.NewServer(h)
	tr := &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096, IdleConnTimeout: time.Minute}
	t.Cleanup(func() { tr.CloseIdleConnections(); srv.Close() })
	client := &http.Client{Transport: tr}
	return func(ctx context.Context, r *loadReq) (loadResp, error) {
		req, err := http.NewRequestWithContext(ctx, "GET", srv.URL+r.route, nil)
		if err != nil {
			return loadResp{}, err
		}
		req.Header.Set("X-Client-Ip", r.ip)
		req.Header.Set("X-Request-Id", strconv.Itoa(r.i))
		if r.user != "" {
			req.Header.Set("X-User", r.user)
		}
		if r.tant != "" {
			req.Header.Set("X-Tenant", r.tant)
		}
		if !r.now.IsZero() {
			req.Header.Set("X-Now", strconv.FormatInt(r.now.UnixMilli(), 10))
		}
		resp, err := client.Do(req)
		if err != nil {
			return loadResp{}, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return loadResp{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}, nil
	}
}

// shot is one request of a run and what came of it; times are from the
// run's start.
type shot struct {
	at   time.Duration // scheduled
	sent time.Duration
	took time.Duration // from sent to the answer
	resp loadResp
	err  error
	done bool
}

// late is the time from the scheduled start to the answer: open loop, it
// holds any queueing (no coordinated omission).
func (s *shot) late() time.Duration { return s.sent + s.took - s.at }

// offer sends requests 0, 1, ... at rate per second for dur from start,
// each on schedule in its own goroutine whether or not earlier ones have
// answered (open loop: a pile-up shows as late answers and in-flight
// requests, not as a slower offered rate), to every target at once.
// It returns each target's shots, by request index.
func offer(t *testing.T, start time.Time, rate int, dur time.Duration, mkReq func(i int) loadReq, targets ...loadTarget) [][]shot {
	total := int(int64(rate) * int64(dur) / int64(time.Second))
	out := make([][]shot, len(targets))
	for k := range out {
		out[k] = make([]shot, total)
	}
	var wg sync.WaitGroup
	var inFlight atomic.Int64
	maxInFlight := int64(rate) // a second's requests unanswered: stop piling up
	var skipped atomic.Int64
	fire := func(i, k int, r *loadReq) {
		defer wg.Done()
		s := &out[k][i]
		s.at = time.Duration(int64(i) * int64(time.Second) / int64(rate))
		if inFlight.Add(1) > maxInFlight {
			inFlight.Add(-1)
			skipped.Add(1)
			return
		}
		defer inFlight.Add(-1)
		ctx, cancel := context.WithTimeout(context.Background(), 10*faultCeiling)
		defer cancel()
		s.sent = time.Since(start)
		s.resp, s.err = targets[k](ctx, r)
		s.took = time.Since(start) - s.sent
		s.done = true
	}
	next := 0
	for next < total {
		due := min(total, int(int64(time.Since(start))*int64(rate)/int64(time.Second))+1)
		for ; next < due; next++ {
			r := mkReq(next)
			for k := range targets {
				wg.Add(1)
				go fire(next, k, &r)
			}
		}
		time.Sleep(time.Millisecond)
	}
	wg.Wait()
	if n := skipped.Load(); n > 0 {
		t.Errorf("%d requests not sent: more than %d in flight (a pile-up)", n, maxInFlight)
	}
	return out
}

// recorder is a Sink that keeps each decision's outcome, denying rule and
// time by request index (the request id).
type recorder struct {
	start time.Time
	recs  []recorded
	next  decision.Sink // also logs to this, if not nil
}

type recorded struct {
	outcome decision.Outcome
	path    decision.Path
	rule    string
	at      time.Duration // when logged, from the run's start
}

func newRecorder(start time.Time, total int, next decision.Sink) *recorder {
	return &recorder{start: start, recs: make([]recorded, total), next: next}
}

func (r *recorder) Log(rec decision.Record) {
	if i, err := strconv.Atoi(rec.RequestID); err == nil && i >= 0 && i < len(r.recs) {
		r.recs[i] = recorded{outcome: rec.Outcome, path: rec.Path, rule: rec.DenyingRule, at: time.Since(r.start)}
	}
	if r.next != nil {
		r.next.Log(rec)
	}
}

// decided reports a decision the limiter made normally: by Redis, or from
// what Redis told it earlier (the deny cache, a lease); not by the failure
// modes.
func (r recorded) decided() bool { return r.path != decision.PathFallback && r.outcome != 0 }

// phase is a span of a run, by scheduled time.
type phase struct {
	name     string
	from, to time.Duration
}

// latencies logs p50, p99, p99.9 and max latency of the shots in each phase
// (from the scheduled start to the answer) and returns the max per phase.
func latencies(t *testing.T, name string, shots []shot, phases []phase) {
	t.Helper()
	for _, p := range phases {
		var ls []time.Duration
		for i := range shots {
			if s := &shots[i]; s.done && s.at >= p.from && s.at < p.to {
				ls = append(ls, s.late())
			}
		}
		if len(ls) == 0 {
			continue
		}
		slices.Sort(ls)
		q := func(f float64) time.Duration { return ls[int(f*float64(len(ls)-1))].Round(10 * time.Microsecond) }
		t.Logf("%s, %s (%v-%v, %d requests): latency p50 %v p99 %v p99.9 %v max %v",
			name, p.name, p.from.Round(time.Second/10), p.to.Round(time.Second/10), len(ls), q(0.5), q(0.99), q(0.999), ls[len(ls)-1].Round(10*time.Microsecond))
	}
}

// checkAnswers fails on a transport error, a 5xx, or a request slower than
// faultCeiling.
func checkAnswers(t *testing.T, shots []shot) {
	t.Helper()
	var errs, fivexx, slow int
	var worst time.Duration
	for i := range shots {
		s := &shots[i]
		if !s.done {
			continue
		}
		switch {
		case s.err != nil:
			if errs++; errs == 1 {
				t.Errorf("request %d: %v", i, s.err)
			}
		case s.resp.status >= 500:
			fivexx++
		}
		if s.took > faultCeiling {
			slow++
		}
		worst = max(worst, s.took)
	}
	if errs+fivexx+slow > 0 {
		t.Errorf("%d transport errors, %d 5xx answers, %d requests slower than %v (the slowest %v)", errs, fivexx, slow, faultCeiling, worst)
	}
}

// checkFailureModes fails unless the failure modes made every decision of
// the requests scheduled in [from, to), a span in which Redis is
// unavailable (checkDegradedAnswers checks what they answered).
func checkFailureModes(t *testing.T, shots []shot, rec *recorder, from, to time.Duration) {
	t.Helper()
	var n, bad int
	for i := range shots {
		if s := &shots[i]; s.done && s.at >= from && s.at < to {
			n++
			// The deny cache and leases may still answer from what Redis
			// said before the fault; Redis itself must not.
			if r := rec.recs[i]; r.path == decision.PathRedis {
				if bad++; bad <= 3 {
					t.Errorf("request %d at %v, Redis unavailable: decided %v by Redis", i, s.at, r.outcome)
				}
			}
		}
	}
	if bad > 0 || n == 0 {
		t.Errorf("%d of %d requests from %v to %v decided by Redis while it was unavailable", bad, n, from, to)
	}
}

// limiterMetrics reads the limiter's metrics from its registry.
type limiterMetrics struct{ reg *prometheus.Registry }

func (m limiterMetrics) value(name, label string) float64 {
	mfs, _ := m.reg.Gather()
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, mt := range mf.GetMetric() {
			match := label == ""
			for _, lp := range mt.GetLabel() {
				match = match || lp.GetValue() == label
			}
			if !match {
				continue
			}
			if c := mt.GetCounter(); c != nil {
				sum += c.GetValue()
			}
			if g := mt.GetGauge(); g != nil {
				sum += g.GetValue()
			}
		}
	}
	return sum
}

func (m limiterMetrics) degraded() float64 {
	return m.value("sluice_enforcer_decisions_total", "degraded_open") + m.value("sluice_enforcer_decisions_total", "degraded_closed")
}

func (m limiterMetrics) breaker() float64 { return m.value("sluice_enforcer_breaker_state", "") }

// footprint is the process's goroutines and live heap (after a GC).
type footprint struct {
	goroutines int
	heap       uint64
}

// measure takes the fewest goroutines of five looks 20 ms apart, which
// leaves out most of the requests in flight, and the heap after a GC.
func measure() footprint {
	g := runtime.NumGoroutine()
	for range 4 {
		time.Sleep(20 * time.Millisecond)
		g = min(g, runtime.NumGoroutine())
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return footprint{goroutines: g, heap: ms.HeapAlloc}
}

func (f footprint) String() string {
	return fmt.Sprintf("%d goroutines, heap %.1f MiB", f.goroutines, float64(f.heap)/(1<<20))
}

// checkFlat fails if goroutines or the heap grew from a to b by more than
// generous slack: these are the whole process's (requests in flight, HTTP
// connections, the GC's timing), and a leak of one goroutine or a few KiB
// per request (thousands of requests a second) passes it quickly.
func checkFlat(t *testing.T, what string, a, b footprint) {
	t.Helper()
	t.Logf("%s: %v -> %v", what, a, b)
	if b.goroutines > a.goroutines+500 || b.heap > a.heap+64<<20 {
		t.Errorf("%s: %v -> %v: not flat", what, a, b)
	}
}

// runAt runs f at start+d, in its own goroutine; wait for it with the group.
func runAt(wg *sync.WaitGroup, start time.Time, d time.Duration, f func()) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		time.Sleep(time.Until(start.Add(d)))
		f()
	}()
}

// faultClient is a Redis client as production should set it: no retries,
// deadlines applied, a wait for a pooled connection bounded near the budget,
// one dial per connection.
func faultClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true,
		PoolTimeout: 2 * faultBudget, DialTimeout: 50 * time.Millisecond, DialerRetries: 1, MinIdleConns: 4})
}

// faultLimiter is a limiter with the budget given and the default breaker
// over rdb,
// with its metrics on a registry of its own and every decision recorded.
func faultLimiter(t *testing.T, rdb redis.UniversalClient, rec *recorder, budget time.Duration) (*enforcer.Limiter, limiterMetrics) {
	t.Helper()
	reg := prometheus.NewRegistry()
	l, err := enforcer.New(rdb, mustSet(t, faultRules), enforcer.Options{Registerer: reg, Sink: rec, Budget: budget})
	if err != nil {
		t.Fatal(err)
	}
	return l, limiterMetrics{reg: reg}
}

func loadStart() time.Time { return time.Now().Add(50 * time.Millisecond) }

func loadTotal(d time.Duration) int { return int(int64(*faultRate) * int64(d) / int64(time.Second)) }

func faultSkip(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the fault cases offer load for -fault.duration each")
	}
}
