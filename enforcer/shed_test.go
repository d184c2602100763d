package enforcer_test

import (
	"net/http"
	"net/http/httptest"
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

const sheddingRules = `
domain: api
rules:
  - {id: per-key, match: [{key: api_key}], limit: 1, period: 1m}
shedding:
  routes: {/v1/search: sheddable, /v1/charges: critical}
  thresholds: {sheddable: 0.5, normal: 0.75, critical: 1}
`

func prioReq(ms int64, key, route, prio string) *enforcer.Request {
	r := &enforcer.Request{Now: at(ms)}
	r.Descriptors[rules.KeyAPIKey], r.Descriptors[rules.KeyRoute] = key, route
	if prio != "" {
		r.Descriptors.SetCustom("priority", prio)
	}
	return r
}

// TestPriorityShedding: as the load rises past each threshold, sheddable
// requests are refused first, then normal ones, critical ones only past the
// last; a request's own priority entry wins over its route's default, and
// an unknown one is the default (counted). A shed request is denied with
// ReasonShed on PathShed, Retry-After and Sluice-Reason: shed, its record,
// and no Redis call: it charges no quota.
func TestPriorityShedding(t *testing.T) {
	addr := redistest.Addr(t)
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	calls := serverCalls(t, addr)
	reg := prometheus.NewRegistry()
	var recs []decision.Record
	l, err := enforcer.New(rdb, mustSet(t, sheddingRules), enforcer.Options{Budget: time.Second, Registerer: reg,
		Sink: sinkFunc(func(r decision.Record) { recs = append(recs, r) })})
	if err != nil {
		t.Fatal(err)
	}
	type req struct {
		route, prio string
		shed        bool
	}
	for _, c := range []struct {
		load float64
		reqs []req
	}{
		{0.49, []req{{"/v1/search", "", false}, {"/v1/items", "sheddable", false}}},
		{0.5, []req{{"/v1/search", "", true}, {"/v1/items", "sheddable", true}, {"/v1/items", "", false},
			{"/v1/search", "normal", false}, {"/v1/search", "urgent", true}}},
		{0.8, []req{{"/v1/items", "", true}, {"/v1/items", "normal", true}, {"/v1/charges", "", false},
			{"/v1/items", "critical", false}}},
		{1.0, []req{{"/v1/charges", "", true}, {"/v1/items", "critical", true}}},
	} {
		l.SetBackendLoad(c.load)
		for i, rq := range c.reqs {
			key := "k-" + rq.route + rq.prio + time.Duration(c.load*1e9).String()
			before := calls()
			d := decide(t, l, prioReq(int64(i), key, rq.route, rq.prio))
			shed := d.Reason == decision.ReasonShed
			if shed != rq.shed {
				t.Errorf("load %v, route %s, priority %q: %v %v; want shed %v", c.load, rq.route, rq.prio, d.Outcome, d.Reason, rq.shed)
				continue
			}
			if !shed {
				if d.Outcome != decision.Allowed {
					t.Errorf("load %v, %s %q: %v", c.load, rq.route, rq.prio, d.Outcome)
				}
				continue
			}
			if d.Outcome != decision.Denied || d.Path != decision.PathShed || d.RetryAfter != time.Second || d.Rule != nil ||
				header(&d, "Retry-After") != "1" || header(&d, "Sluice-Reason") != "shed" || len(d.Statuses) != 0 {
				t.Errorf("shed: %v %v path %v retry-after %v rule %v headers %q %q statuses %d",
					d.Outcome, d.Reason, d.Path, d.RetryAfter, d.Rule, header(&d, "Retry-After"), header(&d, "Sluice-Reason"), len(d.Statuses))
			}
			if after := calls(); after != before {
				t.Errorf("a shed request ran %d commands in Redis", after-before)
			}
			if r := recs[len(recs)-1]; r.Path != decision.PathShed || r.Outcome != decision.Denied || r.DenyingRule != "" {
				t.Errorf("record %+v", r)
			}
			// The shed charged nothing: the key's one request is still there.
			l.SetBackendLoad(0)
			if d := decide(t, l, prioReq(int64(i), key, rq.route, rq.prio)); d.Outcome != decision.Allowed || d.Remaining != 0 {
				t.Errorf("after a shed, %s: %v remaining %d; want allowed with 0 left (the shed took nothing)", key, d.Outcome, d.Remaining)
			}
			l.SetBackendLoad(c.load)
		}
	}
	got, err := testutil.GatherAndCount(reg, "sluice_enforcer_load_shed_total", "sluice_enforcer_priority_unknown_total")
	if err != nil || got != 4 {
		t.Fatalf("shed metrics: %d series, %v", got, err)
	}
	want := map[string]float64{"sheddable": 3, "normal": 2, "critical": 2}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		switch mf.GetName() {
		case "sluice_enforcer_load_shed_total":
			for _, m := range mf.GetMetric() {
				p := m.GetLabel()[0].GetValue()
				if v := m.GetCounter().GetValue(); v != want[p] {
					t.Errorf("load_shed_total{priority=%s} = %v, want %v", p, v, want[p])
				}
			}
		case "sluice_enforcer_priority_unknown_total":
			// "urgent", looked up once: at load 0 no priority is looked up.
			if v := mf.GetMetric()[0].GetCounter().GetValue(); v != 1 {
				t.Errorf("priority_unknown_total = %v, want 1", v)
			}
		}
	}
}

// TestShedInFlight: the middleware counts the work in flight; over
// Shedding.Capacity it is the load, and a sheddable request is answered 503 with
// Retry-After and Sluice-Reason: shed, without reaching the handler.
func TestShedInFlight(t *testing.T) {
	l, err := enforcer.New(redistest.Server(t), mustSet(t, sheddingRules), enforcer.Options{Budget: time.Second, Shedding: enforcer.SheddingOptions{Capacity: 4}})
	if err != nil {
		t.Fatal(err)
	}
	var inHandler float64
	served := 0
	h := l.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served++
		inHandler = l.Load()
	}), enforcer.MiddlewareOptions{})
	l.BeginWork()
	l.BeginWork() // two requests in flight elsewhere: load 0.5
	if got := l.Load(); got != 0.5 {
		t.Fatalf("load with 2 of 4 in flight: %v", got)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/v1/search", nil))
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" || w.Header().Get("Sluice-Reason") != "shed" || served != 0 {
		t.Fatalf("sheddable at 0.5: %d Retry-After %q Sluice-Reason %q, served %d; want 503, 1, shed, 0",
			w.Code, w.Header().Get("Retry-After"), w.Header().Get("Sluice-Reason"), served)
	}
	w = httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/v1/items", nil))
	if w.Code != http.StatusOK || served != 1 || inHandler != 0.75 {
		t.Fatalf("normal at 0.5: %d, served %d, load in the handler %v; want 200, 1, 0.75 (its own work counted)", w.Code, served, inHandler)
	}
	l.EndWork()
	l.EndWork()
	if got := l.Load(); got != 0 {
		t.Errorf("load after all work ended: %v", got)
	}
}
