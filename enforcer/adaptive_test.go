package enforcer_test

import (
	"bytes"
	"context"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

const adaptiveRules = `
domain: api
rules:
  - {id: search, match: [{key: route, value: /v1/search}], limit: 100, period: 1s, adaptive: {floor: 0.2}}
  - {id: edge, match: [{key: client_ip}], limit: 100, period: 1s, scope: local, adaptive: {floor: 0.5}}
  - {id: fixed, match: [{key: user}], limit: 100, period: 1s}
`

// respond reports n responses in the second starting at sec (event time),
// errs of them 5xx.
func respond(l *enforcer.Limiter, sec int64, n, errs int) {
	for i := range n {
		status := 200
		if i < errs {
			status = 503
		}
		l.ObserveResponse(at(sec*1000+int64(i*1000/n)), status, 20*time.Millisecond)
	}
}

// TestAdaptiveAIMD: adaptive rules follow the backend's error rate: at 1%
// they stay whole; at 40% the factor is cut by 0.7 each second, each rule
// never below its floor; healed, it climbs by 0.05 a second back to 1.
// Decisions, their records and the metrics carry the factor; every change is
// logged with its evidence. A rule that is not adaptive never moves.
func TestAdaptiveAIMD(t *testing.T) {
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	var recs []decision.Record
	l, err := enforcer.New(redistest.Server(t), mustSet(t, adaptiveRules), enforcer.Options{Budget: time.Second, HotKeys: enforcer.HotKeyOptions{Table: -1}, Registerer: reg,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), Sink: sinkFunc(func(r decision.Record) { recs = append(recs, r) })})
	if err != nil {
		t.Fatal(err)
	}
	limits := func(sec int64) (search, edge, fixed int64, d enforcer.Decision) {
		r := &enforcer.Request{Now: at(sec*1000 + 999)}
		r.Descriptors[rules.KeyRoute], r.Descriptors[rules.KeyClientIP], r.Descriptors[rules.KeyUser] = "/v1/search", "192.0.2.1", "u"
		d = decide(t, l, r)
		return status(t, &d, "search").Limit, status(t, &d, "edge").Limit, status(t, &d, "fixed").Limit, d
	}
	sec := int64(0)
	for ; sec < 5; sec++ { // healthy: 1% errors
		respond(l, sec, 100, 1)
	}
	if s, e, f, d := limits(sec); s != 100 || e != 100 || f != 100 || d.Factor != 1 || l.AdaptiveFactor() != 1 {
		t.Fatalf("healthy: limits %d %d %d, factor %v %v; want 100s and 1", s, e, f, d.Factor, l.AdaptiveFactor())
	}
	want := 1.0
	for i := range 10 { // degraded: 40% errors
		respond(l, sec, 100, 40)
		sec++
		if i > 0 { // the first degraded second is judged when the next begins
			want = max(0.01, want*0.7)
		}
		s, e, f, d := limits(sec)
		if math.Abs(l.AdaptiveFactor()-want) > 1e-9 {
			t.Fatalf("degraded second %d: factor %v, want %v", i+1, l.AdaptiveFactor(), want)
		}
		ws, we := int64(math.Floor(100*max(want, 0.2)+1e-9)), int64(math.Floor(100*max(want, 0.5)+1e-9))
		if s != ws || e != we || f != 100 || math.Abs(d.Factor-max(want, 0.2)) > 1e-9 {
			t.Fatalf("degraded second %d (factor %v): limits search %d edge %d fixed %d, decision factor %v; want %d %d 100, %v",
				i+1, want, s, e, f, d.Factor, ws, we, max(want, 0.2))
		}
		if r := recs[len(recs)-1]; math.Abs(r.AdaptiveFactor-d.Factor) > 1e-12 {
			t.Fatalf("record factor %v, decision %v", r.AdaptiveFactor, d.Factor)
		}
	}
	if s, _, _, _ := limits(sec); s != 20 {
		t.Fatalf("after 10 s at 40%%: search limit %d, want its floor, 20", s)
	}
	// Healed: +0.05 a second from where it fell, back to 1.
	floor := l.AdaptiveFactor()
	healed := 0
	for l.AdaptiveFactor() < 1 && healed < 60 {
		respond(l, sec, 100, 1)
		sec++
		healed++
	}
	if n := int(math.Ceil((1 - floor) / 0.05)); healed > n+1 {
		t.Errorf("back to 1 after %d healthy seconds, want %d", healed, n+1)
	}
	if s, e, _, d := limits(sec); s != 100 || e != 100 || d.Factor != 1 {
		t.Errorf("healed: limits %d %d factor %v", s, e, d.Factor)
	}
	if !strings.Contains(logs.String(), `msg="adaptive limits: factor changed" from=1 to=0.7 why="error rate above target" statuses=100 errors_5xx=40 error_rate=0.4`) {
		t.Errorf("no log line with the evidence of the first cut:\n%s", logs.String())
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP sluice_enforcer_adaptive_factor The factor adaptive rules' limits are scaled by (AIMD on the backend's responses), in (0, 1]; each rule applies at least its floor.
# TYPE sluice_enforcer_adaptive_factor gauge
sluice_enforcer_adaptive_factor 1
`), "sluice_enforcer_adaptive_factor"); err != nil {
		t.Error(err)
	}
	if got, err := testutil.GatherAndCount(reg, "sluice_enforcer_adaptive_changes_total"); err != nil || got != 2 {
		t.Errorf("changes_total: %d series, %v", got, err)
	}
}

// TestAdaptiveWithoutStatuses: with no response statuses (or fewer than
// Adaptive.MinSamples an interval) the factor stays at 1, and the limiter
// says so once, not every interval.
func TestAdaptiveWithoutStatuses(t *testing.T) {
	var logs bytes.Buffer
	l, err := enforcer.New(redistest.Server(t), mustSet(t, adaptiveRules), enforcer.Options{Budget: time.Second,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for sec := range int64(30) {
		l.Adapt(at(sec * 1000))
		if sec%3 == 0 {
			respond(l, sec, 5, 5) // a few failures, too few to judge
		}
	}
	if f := l.AdaptiveFactor(); f != 1 {
		t.Errorf("factor %v with too few statuses, want 1", f)
	}
	if n := strings.Count(logs.String(), "too few response statuses to judge the backend: a factor of 1 stays"); n != 1 {
		t.Errorf("said %d times that statuses are missing, want once:\n%s", n, logs.String())
	}
	r := &enforcer.Request{Now: at(30_000)}
	r.Descriptors[rules.KeyRoute] = "/v1/search"
	if d := decide(t, l, r); d.Limit != 100 || d.Factor != 1 {
		t.Errorf("limit %d factor %v, want 100 and 1", d.Limit, d.Factor)
	}
}

// TestMiddlewareReportsResponses: the middleware reports each served
// response's status to the adaptive controller: a failing handler cuts the
// factor.
func TestMiddlewareReportsResponses(t *testing.T) {
	l, err := enforcer.New(redistest.Server(t), mustSet(t, adaptiveRules), enforcer.Options{Budget: time.Second,
		Adaptive: enforcer.AdaptiveOptions{Interval: 50 * time.Millisecond, MinSamples: 5}})
	if err != nil {
		t.Fatal(err)
	}
	h := l.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadGateway)
	}), enforcer.MiddlewareOptions{})
	deadline := time.Now().Add(10 * time.Second)
	for l.AdaptiveFactor() == 1 && time.Now().Before(deadline) {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/v1/items", nil))
	}
	if f := l.AdaptiveFactor(); f != 0.7 {
		t.Errorf("after a failing handler: factor %v, want 0.7", f)
	}
}

// TestAdaptiveFactorIsShared: each enforcer records its own factor in the
// region's Redis at every Refresh and applies the region's, the mean of its
// enforcers' fresh factors; an enforcer that stopped recording drops out.
func TestAdaptiveFactorIsShared(t *testing.T) {
	rdb := redistest.Server(t)
	set := mustSet(t, adaptiveRules)
	newL := func(instance string) *enforcer.Limiter {
		l, err := enforcer.New(rdb, set, enforcer.Options{Budget: time.Second, Instance: instance})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	a, b := newL("a"), newL("b")
	respond(a, 0, 100, 50) // a sees its backend fail; b sees nothing
	respond(a, 1, 100, 50)
	if f := a.AdaptiveFactor(); f != 0.7 {
		t.Fatalf("a's own factor %v, want 0.7", f)
	}
	now := at(1500) // the responses' clock: within the interval a is judging
	for _, l := range []*enforcer.Limiter{a, b, a} {
		if err := l.Refresh(context.Background(), now); err != nil {
			t.Fatal(err)
		}
	}
	for name, l := range map[string]*enforcer.Limiter{"a": a, "b": b} {
		if f := l.AdaptiveFactor(); math.Abs(f-0.85) > 1e-9 {
			t.Errorf("%s: region factor %v, want 0.85 (the mean of 0.7 and 1)", name, f)
		}
	}
	r := &enforcer.Request{Now: at(0)}
	r.Descriptors[rules.KeyRoute] = "/v1/search"
	if d := decide(t, b, r); d.Limit != 85 {
		t.Errorf("b's search limit %d, want 85", d.Limit)
	}
	// a stops recording: 10 s later b's region is b alone.
	if err := b.Refresh(context.Background(), now.Add(10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if f := b.AdaptiveFactor(); f != 1 {
		t.Errorf("b without a's fresh factor: %v, want 1", f)
	}
}

// TestAdaptiveOffWithoutAdaptiveRules: a rule set with neither adaptive
// rules nor shedding does not judge responses: failures move no factor and
// log nothing; a set that adds an adaptive rule turns the controller on.
func TestAdaptiveOffWithoutAdaptiveRules(t *testing.T) {
	var logs bytes.Buffer
	l, err := enforcer.New(redistest.Server(t), mustSet(t, "domain: api\nrules: [{id: u, match: [{key: user}], limit: 10, period: 1s}]"),
		enforcer.Options{Budget: time.Second, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for sec := range int64(5) {
		respond(l, sec, 100, 100)
	}
	if f := l.AdaptiveFactor(); f != 1 || strings.Contains(logs.String(), "adaptive") {
		t.Errorf("without adaptive rules: factor %v, log:\n%s", f, logs.String())
	}
	l.SetRules(mustSet(t, adaptiveRules))
	for sec := int64(5); sec < 8; sec++ {
		respond(l, sec, 100, 100)
	}
	if f := l.AdaptiveFactor(); f >= 1 {
		t.Errorf("with an adaptive rule, after failures: factor %v", f)
	}
}
