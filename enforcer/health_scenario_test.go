package enforcer_test

import (
	"testing"
	"time"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// TestBackendDegradesAndHeals is issue 22's scenario in event time, at the
// enforcer: a backend answers 100 requests a second with 1% errors, then
// 40% for two minutes, then 1% again. Within 10 s of the degradation the
// adaptive rule falls to the level the controller computes (its floor);
// sheddable requests are shed first, then normal ones; critical requests
// are never shed at that level; within 30 s of healing every limit is whole
// and nothing is shed. It prints the factor and the sheds per 10 s, the
// report a replay would chart.
func TestBackendDegradesAndHeals(t *testing.T) {
	l, err := enforcer.New(redistest.Server(t), mustSet(t, `
domain: api
rules:
  - {id: search, match: [{key: route, value: /v1/search}], limit: 100, period: 1s, adaptive: {floor: 0.2}}
shedding:
  routes: {/v1/search: sheddable, /v1/items: normal, /v1/charges: critical}
`), enforcer.Options{Budget: time.Second, HotKeys: enforcer.HotKeyOptions{Table: -1}})
	if err != nil {
		t.Fatal(err)
	}
	const degradeAt, healAt, end = 60, 180, 240
	firstShed := map[string]int64{}
	lastShed := map[string]int64{}
	floorAt := int64(-1)
	type row struct {
		factor float64
		shed   map[string]int
	}
	var report []row
	for sec := int64(0); sec < end; sec++ {
		errs := 1
		if sec >= degradeAt && sec < healAt {
			errs = 40
		}
		respond(l, sec, 100, errs)
		if sec%10 == 0 {
			report = append(report, row{l.AdaptiveFactor(), map[string]int{}})
		}
		for _, route := range []string{"/v1/search", "/v1/items", "/v1/charges"} {
			r := &enforcer.Request{Now: at(sec*1000 + 999)}
			r.Descriptors[rules.KeyRoute] = route
			d := decide(t, l, r)
			if d.Reason == decision.ReasonShed {
				if _, ok := firstShed[route]; !ok {
					firstShed[route] = sec
				}
				lastShed[route] = sec
				report[len(report)-1].shed[route]++
				continue
			}
		}
		// The adaptive rule's limit, seen by a critical search (its own
		// priority entry wins over the route's): never shed.
		r := &enforcer.Request{Now: at(sec*1000 + 999)}
		r.Descriptors[rules.KeyRoute] = "/v1/search"
		r.Descriptors.SetCustom("priority", "critical")
		d := decide(t, l, r)
		if d.Reason == decision.ReasonShed {
			t.Fatalf("a critical search was shed at %d s", sec)
		}
		if d.Limit == 20 && floorAt < 0 && sec >= degradeAt {
			floorAt = sec
		}
		if sec >= healAt+30 && d.Limit != 100 {
			t.Errorf("at %d s, %d s after healing: search limit %d, want 100", sec, sec-healAt, d.Limit)
		}
	}
	for i, r := range report {
		t.Logf("%3d s  factor %.3f  shed sheddable %2d normal %2d critical %2d", i*10, r.factor,
			r.shed["/v1/search"], r.shed["/v1/items"], r.shed["/v1/charges"])
	}
	if floorAt < 0 || floorAt-degradeAt > 10 {
		t.Errorf("the adaptive rule reached its floor (20) at %d s, want within 10 s of %d s", floorAt, degradeAt)
	}
	s, sOK := firstShed["/v1/search"]
	n, nOK := firstShed["/v1/items"]
	if !sOK || !nOK || s > n || s < degradeAt || s-degradeAt > 10 {
		t.Errorf("first sheds: sheddable at %d (%v), normal at %d (%v); want sheddable first, within 10 s of %d", s, sOK, n, nOK, degradeAt)
	}
	if c, ok := firstShed["/v1/charges"]; ok {
		t.Errorf("a critical request was shed at %d s", c)
	}
	for route, last := range lastShed {
		if last >= healAt+30 {
			t.Errorf("%s still shed at %d s, %d s after healing", route, last, last-healAt)
		}
	}
}
