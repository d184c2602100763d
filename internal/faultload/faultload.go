package faultload

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

// The flags' values; the defaults outside a test binary.
var (
	duration = 30 * time.Second
	rate     = 2000
)

// init registers the flags in test binaries only (testing.Testing), and so
// once per binary: a second registration of the same name, by a test
// package of its own, would panic at start rather than split the value.
func init() {
	if !testing.Testing() {
		return
	}
	flag.DurationVar(&duration, "fault.duration", duration,
		"how long each fault case (TestFaultLoad, TestFaultLoadKafka) offers load (Kafka is kept down for twice this)")
	flag.IntVar(&rate, "fault.rate", rate, "requests per second each fault case (TestFaultLoad, TestFaultLoadKafka) offers")
}

// Duration is -fault.duration: how long each case offers load (30 s).
func Duration() time.Duration { return duration }

// Rate is -fault.rate: the requests per second each case offers (2 000).
func Rate() int { return rate }

// Total is the number of requests offered at Rate over d.
func Total(d time.Duration) int { return int(int64(rate) * int64(d) / int64(time.Second)) }

// Start is when a load begins: 50 ms from now, time to start the
// goroutines that act at fixed instants of the run (RunAt) first.
func Start() time.Time { return time.Now().Add(50 * time.Millisecond) }

// SkipShort skips t under -short: the fault cases offer load for
// -fault.duration each.
func SkipShort(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the fault cases offer load for -fault.duration each")
	}
}

// Ceiling is the longest any request of a fault case may take, from when
// it was sent to its answer: far below envoyproxy/ratelimit's 10 s Redis
// timeout, far above what the limiter should add (twice its 10 ms budget), so that
// a loaded CI machine never trips it while a request held by a silent Redis
// would. Under the race detector, ten times as long.
var Ceiling = RaceScaled(250 * time.Millisecond)

// Budget is the limiter's budget in the fault cases: the default, or under
// the race detector ten times as long (its slowed decisions would otherwise
// miss the budget while Redis is healthy).
var Budget = RaceScaled(10 * time.Millisecond)

// RaceScaled is d, or ten times d under the race detector.
func RaceScaled(d time.Duration) time.Duration {
	if RaceDetector {
		return 10 * d
	}
	return d
}

// Rules: a fail-open rule on every request, a fail-closed login rule and
// an open_unlimited search rule, with limits that deny some requests of
// the load's mix (MakeRequest) while Redis answers. Domain "fault".
const Rules = `
domain: fault
rules:
  - {id: per-ip, match: [{key: client_ip}], limit: 20, period: 1s}
  - {id: login, failure_mode: closed, match: [{key: route, value: /login}, {key: user}], limit: 3, period: 5s}
  - {id: search, failure_mode: open_unlimited, match: [{key: route, value: /search}, {key: tenant}], limit: 1, period: 1s}
`

// Request is request I of the load; MakeRequest(i) is always the same
// request.
type Request struct {
	I      int
	Route  string    // URL path: /items, /login or /search
	IP     string    // client IP
	User   string    // login requests only
	Tenant string    // search requests only
	Now    time.Time // the caller's clock; zero: Redis TIME
}

// MakeRequest returns request i of the load. At 2 000/s each client IP
// sends 2/s (never denied), each login user 1/s (about two in five
// denied), each search tenant 2/s (about one in two denied). Requests of
// one key are 500 ms apart, so that their order does not depend on
// scheduling unless requests are held far longer than Ceiling.
func MakeRequest(i int) Request {
	r := Request{I: i, Route: "/items", IP: fmt.Sprintf("2001:db8:%x::1", i%1000)} // documentation addresses, one /64 each
	switch i % 10 {
	case 0:
		r.Route, r.User = "/login", fmt.Sprint("u", (i/10)%100)
	case 1, 2, 3:
		r.Route, r.Tenant = "/search", fmt.Sprint("t", (3*(i/10)+i%10-1)%300) // the search requests, numbered, in turn
	}
	return r
}

// Response is what a client of the sidecar sees.
type Response struct {
	Status     int
	RetryAfter string // the Retry-After header
}

// Target sends one request to the service under test. The HTTP middleware
// (HTTPSidecar) stands in for the sidecar; the sidecar's own server can be
// tested by the same cases through another Target.
type Target func(ctx context.Context, r *Request) (Response, error)

// Describe reads the request's descriptors from the headers HTTPSidecar's
// client sets, as the sidecar would read them from its gRPC or HTTP
// request: the middleware's MiddlewareOptions.Describe.
func Describe(r *http.Request, req *enforcer.Request) {
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

// HTTPSidecar serves l's middleware in front of a handler that answers
// 200, on loopback, and returns a Target that calls it. The request id is
// the request's index I. The server closes when t ends.
func HTTPSidecar(t *testing.T, l *enforcer.Limiter) Target {
	h := l.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), enforcer.MiddlewareOptions{Describe: Describe})
	srv := httptest.NewServer(h)
	tr := &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096, IdleConnTimeout: time.Minute}
	t.Cleanup(func() { tr.CloseIdleConnections(); srv.Close() })
	client := &http.Client{Transport: tr}
	return func(ctx context.Context, r *Request) (Response, error) {
		req, err := http.NewRequestWithContext(ctx, "GET", srv.URL+r.Route, nil)
		if err != nil {
			return Response{}, err
		}
		req.Header.Set("X-Client-Ip", r.IP)
		req.Header.Set("X-Request-Id", strconv.Itoa(r.I))
		if r.User != "" {
			req.Header.Set("X-User", r.User)
		}
		if r.Tenant != "" {
			req.Header.Set("X-Tenant", r.Tenant)
		}
		if !r.Now.IsZero() {
			req.Header.Set("X-Now", strconv.FormatInt(r.Now.UnixMilli(), 10))
		}
		resp, err := client.Do(req)
		if err != nil {
			return Response{}, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return Response{Status: resp.StatusCode, RetryAfter: resp.Header.Get("Retry-After")}, nil
	}
}

// Warm sends ten requests of the load's mix (every route) from another
// IP, so that the script is cached and connections are open before the
// load starts. Their indices (1 000 000 on) are outside any run's.
func Warm(t *testing.T, target Target) {
	t.Helper()
	for i := 0; i < 10; i++ {
		r := MakeRequest(1_000_000 + i)
		r.IP = "203.0.113.1"
		if _, err := target(context.Background(), &r); err != nil {
			t.Fatal(err)
		}
	}
	// Then as many at once as a run's first instant fires, so that the run
	// starts on an open connection pool and a grown in-flight limit rather
	// than dialling and ramping under its first burst.
	var wg sync.WaitGroup
	errs := make(chan error, warmBurst)
	for i := range warmBurst {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := MakeRequest(1_000_010 + i)
			r.IP = "203.0.113.2"
			if _, err := target(context.Background(), &r); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// warmBurst is Warm's concurrent burst.
const warmBurst = 256

// Shot is one request of a run and what came of it; times are from the
// run's start.
type Shot struct {
	At   time.Duration // scheduled
	Sent time.Duration
	Took time.Duration // from Sent to the answer
	Resp Response
	Err  error
	Done bool // sent and answered (or failed); false: not sent (a pile-up)
}

// Late is the time from the scheduled start to the answer: open loop, it
// holds any queueing (no coordinated omission).
func (s *Shot) Late() time.Duration { return s.Sent + s.Took - s.At }

// Offer sends requests mkReq(0), mkReq(1), ... at rate per second for dur
// from start, each on schedule in its own goroutine whether or not earlier
// ones have answered (open loop: a pile-up shows as late answers and
// in-flight requests, not as a slower offered rate), to every target at
// once, each request with a deadline of ten times Ceiling. It returns each
// target's shots, by request index: out[k][i] is request i to targets[k].
// More than a second's requests in flight at once to a target and it sends
// no more (to any target: they all see the same requests) until some
// answer, and fails t.
func Offer(t *testing.T, start time.Time, rate int, dur time.Duration, mkReq func(i int) Request, targets ...Target) [][]Shot {
	t.Helper()
	out := OfferUnchecked(start, rate, dur, mkReq, targets...)
	for k := range out {
		if n := NotSent(out[k]); n > 0 {
			t.Errorf("target %d: %d requests not sent: more than %d in flight (a pile-up)", k, n, rate)
		}
	}
	return out
}

// OfferUnchecked is Offer without the check: a request not sent for a
// pile-up has Done false (NotSent counts them), for the caller to judge.
func OfferUnchecked(start time.Time, rate int, dur time.Duration, mkReq func(i int) Request, targets ...Target) [][]Shot {
	total := int(int64(rate) * int64(dur) / int64(time.Second))
	out := make([][]Shot, len(targets))
	for k := range out {
		out[k] = make([]Shot, total)
	}
	var wg sync.WaitGroup
	inFlight := make([]atomic.Int64, len(targets))
	maxInFlight := int64(rate) // a second's requests unanswered: stop piling up
	fire := func(i, k int, r *Request) {
		defer wg.Done()
		defer inFlight[k].Add(-1)
		s := &out[k][i]
		ctx, cancel := context.WithTimeout(context.Background(), 10*Ceiling)
		defer cancel()
		s.Sent = time.Since(start)
		s.Resp, s.Err = targets[k](ctx, r)
		s.Took = time.Since(start) - s.Sent
		s.Done = true
	}
	next := 0
	for next < total {
		due := min(total, int(int64(time.Since(start))*int64(rate)/int64(time.Second))+1)
		for ; next < due; next++ {
			at := time.Duration(int64(next) * int64(time.Second) / int64(rate))
			// A request goes to every target or, past a pile-up at any
			// one, to none: the targets' limiters see the same requests.
			piled := false
			for k := range targets {
				out[k][next].At = at
				piled = piled || inFlight[k].Load() >= maxInFlight
			}
			if piled {
				continue
			}
			r := mkReq(next)
			for k := range targets {
				inFlight[k].Add(1)
				wg.Add(1)
				go fire(next, k, &r)
			}
		}
		time.Sleep(time.Millisecond)
	}
	wg.Wait()
	return out
}

// Sustained returns the highest of rate, rate/2, rate/4, ... (not below
// minRate, or rate if less) that the machine carries: an open-loop offer of it to every one
// of targets at once for a second, after which no request piled up or
// failed and the 99th percentile from the schedule (Shot.Late) stayed
// under Ceiling/2. The targets should be throwaway sidecars like the run's:
// the calibration spends their limiters' state. It logs the rate chosen.
func Sustained(t *testing.T, rate, minRate int, targets ...Target) int {
	t.Helper()
	minRate = min(minRate, rate)
	for ; ; rate /= 2 {
		if rate <= minRate {
			t.Logf("calibration: offering %d requests/s (the floor) to each of %d sidecars", minRate, len(targets))
			return minRate
		}
		mk := func(i int) Request { return MakeRequest(2_000_000 + i) }
		out := OfferUnchecked(Start(), rate, time.Second, mk, targets...)
		var late []time.Duration
		ok := true
		for k := range out {
			a := Tally(out[k])
			ok = ok && NotSent(out[k]) == 0 && a.Errors+a.FiveXX == 0
			for i := range out[k] {
				if out[k][i].Done {
					late = append(late, out[k][i].Late())
				}
			}
		}
		var p99 time.Duration
		if slices.Sort(late); len(late) > 0 {
			p99 = late[len(late)*99/100]
		}
		ok = ok && len(late) > 0
		if ok && p99 < Ceiling/2 {
			t.Logf("calibration: offering %d requests/s to each of %d sidecars (p99 %v from the schedule)", rate, len(targets), p99.Round(time.Millisecond))
			return rate
		}
		t.Logf("calibration: %d requests/s to each of %d sidecars is more than this machine carries now (p99 %v from the schedule, pile-up or errors: %v); halving", rate, len(targets), p99.Round(time.Millisecond), !ok)
	}
}

// NotSent counts the shots not sent for a pile-up.
func NotSent(shots []Shot) int {
	n := 0
	for i := range shots {
		if !shots[i].Done {
			n++
		}
	}
	return n
}

// Recorder is a decision.Sink that keeps each decision's outcome, denying
// rule and time by request index (the request id, as HTTPSidecar sets
// it). Set Start to the run's start before the load begins; records of ids
// outside [0, len(Recs)) are passed on only.
type Recorder struct {
	Start time.Time
	Recs  []Recorded    // by request index
	next  decision.Sink // also logs to this, if not nil
}

// Recorded is what Recorder kept of one decision; the zero value: none
// logged.
type Recorded struct {
	Outcome decision.Outcome
	Path    decision.Path
	Rule    string        // the denying rule's id
	At      time.Duration // when logged, from Recorder.Start
}

// NewRecorder returns a Recorder of total requests that also logs every
// record to next, if next is not nil.
func NewRecorder(start time.Time, total int, next decision.Sink) *Recorder {
	return &Recorder{Start: start, Recs: make([]Recorded, total), next: next}
}

// Log implements decision.Sink. Calls for distinct requests may run at
// once; each writes only its own request's slot.
func (r *Recorder) Log(rec decision.Record) {
	if i, err := strconv.Atoi(rec.RequestID); err == nil && i >= 0 && i < len(r.Recs) {
		r.Recs[i] = Recorded{Outcome: rec.Outcome, Path: rec.Path, Rule: rec.DenyingRule, At: time.Since(r.Start)}
	}
	if r.next != nil {
		r.next.Log(rec)
	}
}

// Decided reports a decision the limiter made normally: by Redis, or from
// what Redis told it earlier (the deny cache, a lease); not by the failure
// modes.
func (r Recorded) Decided() bool { return r.Path != decision.PathFallback && r.Outcome != 0 }

// Phase is a span of a run, by scheduled time: [From, To).
type Phase struct {
	Name     string
	From, To time.Duration
}

// Latencies logs p50, p99, p99.9 and max latency (Shot.Late) of the
// answered shots in each phase, each line headed by name.
func Latencies(t *testing.T, name string, shots []Shot, phases []Phase) {
	t.Helper()
	for _, p := range phases {
		var ls []time.Duration
		for i := range shots {
			if s := &shots[i]; s.Done && s.At >= p.From && s.At < p.To {
				ls = append(ls, s.Late())
			}
		}
		if len(ls) == 0 {
			continue
		}
		slices.Sort(ls)
		q := func(f float64) time.Duration { return ls[int(f*float64(len(ls)-1))].Round(10 * time.Microsecond) }
		t.Logf("%s, %s (%v-%v, %d requests): latency p50 %v p99 %v p99.9 %v max %v",
			name, p.Name, p.From.Round(time.Second/10), p.To.Round(time.Second/10), len(ls), q(0.5), q(0.99), q(0.999), ls[len(ls)-1].Round(10*time.Microsecond))
	}
}

// CheckAnswers fails on a transport error, a 5xx, or a request slower than
// Ceiling (from sent to answered).
func CheckAnswers(t *testing.T, shots []Shot) {
	t.Helper()
	if a := Tally(shots); a.Errors+a.FiveXX+a.Slow > 0 {
		if a.FirstErr != nil {
			t.Errorf("request %d: %v", a.FirstErrAt, a.FirstErr)
		}
		t.Errorf("%d transport errors, %d 5xx answers, %d requests slower than %v (the slowest %v)", a.Errors, a.FiveXX, a.Slow, Ceiling, a.Worst)
	}
}

// Answers tallies how a run's sent requests were answered.
type Answers struct {
	Errors, FiveXX, Slow int           // transport errors, 5xx answers, answers later than Ceiling
	Worst                time.Duration // the slowest, from sent to answered
	FirstErr             error         // the first transport error, request FirstErrAt
	FirstErrAt           int
}

// Tally counts the answers of shots' sent requests.
func Tally(shots []Shot) Answers {
	var a Answers
	for i := range shots {
		s := &shots[i]
		if !s.Done {
			continue
		}
		switch {
		case s.Err != nil:
			if a.Errors++; a.Errors == 1 {
				a.FirstErr, a.FirstErrAt = s.Err, i
			}
		case s.Resp.Status >= 500:
			a.FiveXX++
		}
		if s.Took > Ceiling {
			a.Slow++
		}
		a.Worst = max(a.Worst, s.Took)
	}
	return a
}

// CheckFailureModes fails unless the failure modes made every decision of
// the requests scheduled in [from, to), a span in which Redis is
// unavailable (CheckDegradedAnswers checks what they answered), or if no
// request was answered in it.
func CheckFailureModes(t *testing.T, shots []Shot, rec *Recorder, from, to time.Duration) {
	t.Helper()
	var n, bad int
	for i := range shots {
		if s := &shots[i]; s.Done && s.At >= from && s.At < to {
			n++
			// The deny cache and leases may still answer from what Redis
			// said before the fault; Redis itself must not.
			if r := rec.Recs[i]; r.Path == decision.PathRedis {
				if bad++; bad <= 3 {
					t.Errorf("request %d at %v, Redis unavailable: decided %v by Redis", i, s.At, r.Outcome)
				}
			}
		}
	}
	if bad > 0 || n == 0 {
		t.Errorf("%d of %d requests from %v to %v decided by Redis while it was unavailable", bad, n, from, to)
	}
}

// CheckDegradedAnswers checks every decision the failure modes made, for
// shots of MakeRequest's load under Rules: a login is denied 429 with
// Retry-After: 1 by the login rule (limiter_unavailable, the only reason a
// degraded decision names a fail-closed rule), any other request is
// allowed.
func CheckDegradedAnswers(t *testing.T, shots []Shot, rec *Recorder) {
	t.Helper()
	bad := 0
	for i := range shots {
		s, r := &shots[i], rec.Recs[i]
		if !s.Done || s.Err != nil || r.Decided() {
			continue
		}
		var ok bool
		if MakeRequest(i).Route == "/login" {
			ok = s.Resp.Status == http.StatusTooManyRequests && s.Resp.RetryAfter == "1" && r.Outcome == decision.DegradedClosed && r.Rule == "login"
		} else {
			ok = s.Resp.Status == http.StatusOK && r.Outcome == decision.DegradedOpen
		}
		if !ok {
			if bad++; bad <= 3 {
				t.Errorf("request %d (%s), degraded: %d Retry-After %q, decision %v by %q", i, MakeRequest(i).Route, s.Resp.Status, s.Resp.RetryAfter, r.Outcome, r.Rule)
			}
		}
	}
	if bad > 3 {
		t.Errorf("... %d degraded decisions in all not as their failure modes say", bad)
	}
}

// CheckRedisDecides fails unless Redis decided (Recorded.Decided) at least
// share (0 to 1) of the answered requests scheduled in [from, to), or if
// none was answered in it.
func CheckRedisDecides(t *testing.T, shots []Shot, rec *Recorder, from, to time.Duration, share float64) {
	t.Helper()
	f, n := RedisShare(shots, rec, from, to)
	redis := int(f*float64(n) + 0.5)
	t.Logf("Redis decided %d of %d requests from %v to %v", redis, n, from, to)
	if n == 0 || f < share {
		t.Errorf("Redis decided %d of %d requests from %v to %v, want at least %.0f%%", redis, n, from, to, 100*share)
	}
}

// Metrics reads a limiter's metrics from its registry.
type Metrics struct{ Reg *prometheus.Registry }

// Value is the sum of the counters and gauges named name with a label of
// value label ("": all of them).
func (m Metrics) Value(name, label string) float64 {
	mfs, _ := m.Reg.Gather()
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

// Degraded is the number of decisions the failure modes made so far (open
// and closed).
func (m Metrics) Degraded() float64 {
	return m.Value("sluice_enforcer_decisions_total", "degraded_open") + m.Value("sluice_enforcer_decisions_total", "degraded_closed")
}

// Breaker is the breaker's state gauge: 0 closed, 2 open (1 half-open).
func (m Metrics) Breaker() float64 { return m.Value("sluice_enforcer_breaker_state", "") }

// Footprint is the process's goroutines and live heap (after a GC).
type Footprint struct {
	Goroutines int
	Heap       uint64 // bytes
}

// Measure takes the fewest goroutines of five looks 20 ms apart, which
// leaves out most of the requests in flight, and the heap after a GC. It
// takes some 80 ms.
func Measure() Footprint {
	g := runtime.NumGoroutine()
	for range 4 {
		time.Sleep(20 * time.Millisecond)
		g = min(g, runtime.NumGoroutine())
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return Footprint{Goroutines: g, Heap: ms.HeapAlloc}
}

func (f Footprint) String() string {
	return fmt.Sprintf("%d goroutines, heap %.1f MiB", f.Goroutines, float64(f.Heap)/(1<<20))
}

// CheckFlat fails if goroutines or the heap grew from a to b by more than
// generous slack (500 goroutines, 64 MiB): these are the whole process's
// (requests in flight, HTTP connections, the GC's timing), and a leak of
// one goroutine or a few KiB per request (thousands of requests a second)
// passes it quickly.
func CheckFlat(t *testing.T, what string, a, b Footprint) {
	t.Helper()
	t.Logf("%s: %v -> %v", what, a, b)
	if b.Goroutines > a.Goroutines+500 || b.Heap > a.Heap+64<<20 {
		t.Errorf("%s: %v -> %v: not flat", what, a, b)
	}
}

// RunAt runs f at start+d, in its own goroutine; wait for it with wg.
func RunAt(wg *sync.WaitGroup, start time.Time, d time.Duration, f func()) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		time.Sleep(time.Until(start.Add(d)))
		f()
	}()
}

// RedisClient is a Redis client of addr as production should set it: no
// retries, deadlines applied, a wait for a pooled connection bounded near
// the budget (twice Budget), one dial per connection.
func RedisClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true,
		PoolTimeout: 2 * Budget, DialTimeout: 50 * time.Millisecond, DialerRetries: 1, MinIdleConns: 4})
}

// NewLimiter is a limiter of Rules over rdb with the budget given and the
// default breaker, with its metrics on a registry of its own and every
// decision logged to rec.
func NewLimiter(t *testing.T, rdb redis.UniversalClient, rec *Recorder, budget time.Duration) (*enforcer.Limiter, Metrics) {
	t.Helper()
	reg := prometheus.NewRegistry()
	// The queue wait scaled as the budget is: under the race detector a
	// decision takes ten times as long, and so does the growth of the
	// in-flight limit while Redis fails. The breaker's window stays the
	// default budget's (500 ms), not the 2 s that a tenfold budget makes
	// (4 × Breaker.Failures × Budget), in which the breaker opened 1.4 s
	// into a blackhole.
	l, err := enforcer.New(rdb, RuleSet(t), enforcer.Options{Registerer: reg, Sink: rec, Budget: budget,
		QueueWait: RaceScaled(100 * time.Millisecond), Breaker: enforcer.BreakerOptions{Window: 500 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	return l, Metrics{Reg: reg}
}

// RuleSet is Rules, parsed.
func RuleSet(t *testing.T) *rules.Set {
	t.Helper()
	s, err := rules.Parse("fault.yaml", []byte(Rules))
	if err != nil {
		t.Fatal(err)
	}
	return s
}
