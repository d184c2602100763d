package enforcer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// Multi-part requests (Envoy's list of descriptors): every part's rules are
// decided in one atomic call, each part with its own cost or limit override.

const partRules = `
domain: p
rules:
  - {id: per_user, match: [{key: user}], limit: 5, period: 1h}
  - {id: per_key, match: [{key: api_key}], limit: 3, period: 1h}`

func parts(ms int64, ps ...enforcer.Part) *enforcer.Request {
	return &enforcer.Request{Now: at(ms), Parts: ps}
}

func user(u string) rules.Descriptors { return rules.Descriptors{rules.KeyUser: u} }
func apiKey(k string) rules.Descriptors {
	return rules.Descriptors{rules.KeyAPIKey: k}
}

func TestPartsAreDecidedTogether(t *testing.T) {
	body := func(t *testing.T, rdb redis.UniversalClient) {
		l := newLimiter(t, rdb, partRules)
		// Part 0 costs 1 of per_user's 5; part 1 costs 2 of per_key's 3.
		d := decide(t, l, parts(0, enforcer.Part{Descriptors: user("u")}, enforcer.Part{Descriptors: apiKey("k"), Cost: 2}))
		if d.Outcome != decision.Allowed || len(d.Statuses) != 2 {
			t.Fatalf("got %v with %d statuses, want allowed with 2", d.Outcome, len(d.Statuses))
		}
		for i, want := range []struct {
			id        string
			part      int
			remaining int64
		}{{"per_user", 0, 4}, {"per_key", 1, 1}} {
			st := d.Statuses[i]
			if st.Rule.ID != want.id || st.Part != want.part || st.Remaining != want.remaining {
				t.Errorf("status %d: rule %s part %d remaining %d; want %s part %d remaining %d",
					i, st.Rule.ID, st.Part, st.Remaining, want.id, want.part, want.remaining)
			}
		}
		// Part 1 now denies (2 > 1 left): part 0 is not charged either.
		d = decide(t, l, parts(0, enforcer.Part{Descriptors: user("u")}, enforcer.Part{Descriptors: apiKey("k"), Cost: 2}))
		if d.Outcome != decision.Denied || d.Rule.ID != "per_key" || !d.Statuses[1].Denied || d.Statuses[0].Denied {
			t.Fatalf("got %v by %v, statuses %+v; want denied by per_key alone", d.Outcome, d.Rule, d.Statuses)
		}
		if st := status(t, &d, "per_user"); st.Remaining != 4 {
			t.Errorf("per_user remaining %d after the deny, want 4: a deny must consume nothing", st.Remaining)
		}
		// A check-only part reports without consuming.
		for range 3 {
			d = decide(t, l, parts(0, enforcer.Part{Descriptors: user("u"), CheckOnly: true}))
			if d.Outcome != decision.Allowed || d.Statuses[0].Remaining != 4 {
				t.Fatalf("check only: got %v remaining %d, want allowed with 4 left", d.Outcome, d.Statuses[0].Remaining)
			}
		}
		// The same rule matched by two parts is charged for both.
		d = decide(t, l, parts(0, enforcer.Part{Descriptors: user("u")}, enforcer.Part{Descriptors: user("u"), Cost: 2}))
		if d.Outcome != decision.Allowed || d.Remaining != 1 {
			t.Fatalf("two parts on one rule: got %v remaining %d, want allowed with 1 left", d.Outcome, d.Remaining)
		}
		// A part that matches nothing has no status; the others still count.
		d = decide(t, l, parts(0, enforcer.Part{Descriptors: rules.Descriptors{rules.KeyTenant: "t"}}, enforcer.Part{Descriptors: apiKey("k")}))
		if d.Outcome != decision.Allowed || len(d.Statuses) != 1 || d.Statuses[0].Part != 1 || d.Statuses[0].Remaining != 0 {
			t.Fatalf("got %v statuses %+v; want allowed, per_key of part 1 with 0 left", d.Outcome, d.Statuses)
		}
	}
	backends(t, body)
	t.Run("cluster", func(t *testing.T) { body(t, redistest.Cluster(t)) })
}

func TestOverrideLimit(t *testing.T) {
	backends(t, func(t *testing.T, rdb redis.UniversalClient) {
		l := newLimiter(t, rdb, partRules)
		ov := func(entity string) enforcer.Part {
			// The override replaces per_user, which would allow 5.
			return enforcer.Part{Descriptors: user("u"), Override: &enforcer.Override{Limit: 2, Period: time.Minute, Entity: entity}}
		}
		for i, want := range []decision.Outcome{decision.Allowed, decision.Allowed, decision.Denied} {
			d := decide(t, l, parts(int64(i), ov("p|user=u")))
			if d.Outcome != want || len(d.Statuses) != 1 || d.Statuses[0].Rule.Algorithm != rules.FixedWindow || d.Limit != 2 {
				t.Fatalf("request %d: got %v limit %d statuses %+v, want %v under a fixed window of 2", i, d.Outcome, d.Limit, d.Statuses, want)
			}
			if want == decision.Denied && d.RetryAfter != 40*time.Second {
				// at(0) is 20 s into an epoch-aligned minute.
				t.Errorf("Retry-After %v, want 40s (the window's end)", d.RetryAfter)
			}
		}
		// Another entity has its own counter; the next window starts afresh.
		if d := decide(t, l, parts(3, ov("p|user=v"))); d.Outcome != decision.Allowed {
			t.Errorf("another entity: %v, want allowed", d.Outcome)
		}
		if d := decide(t, l, parts(40_000, ov("p|user=u"))); d.Outcome != decision.Allowed || d.Remaining != 1 {
			t.Errorf("next window: %v remaining %d, want allowed with 1 left", d.Outcome, d.Remaining)
		}
		// per_user itself was never charged.
		if d := decide(t, l, parts(40_001, enforcer.Part{Descriptors: user("u")})); d.Remaining != 4 {
			t.Errorf("per_user remaining %d, want 4: the override replaced it", d.Remaining)
		}
	})
}

// An override of 0 blocks, as envoyproxy/ratelimit counts against a limit
// of 0.
func TestZeroOverrideBlocks(t *testing.T) {
	l := newLimiter(t, redistest.Server(t), partRules)
	d := decide(t, l, parts(0, enforcer.Part{Override: &enforcer.Override{Limit: 0, Period: time.Second, Entity: "e"}}))
	if d.Outcome != decision.Denied || d.Reason != decision.ReasonBlocked || l.RoundTrips() != 0 {
		t.Errorf("override of 0: %v %v after %d round trips, want denied, blocked, without Redis", d.Outcome, d.Reason, l.RoundTrips())
	}
}

func TestBadParts(t *testing.T) {
	l := newLimiter(t, redistest.Server(t), partRules)
	for name, r := range map[string]*enforcer.Request{
		"too many parts":  {Parts: make([]enforcer.Part, enforcer.MaxParts+1)},
		"sub-ms override": parts(0, enforcer.Part{Override: &enforcer.Override{Limit: 1, Period: time.Microsecond, Entity: "e"}}),
		"no entity":       parts(0, enforcer.Part{Override: &enforcer.Override{Limit: 1, Period: time.Second}}),
		"huge override":   parts(0, enforcer.Part{Override: &enforcer.Override{Limit: 1 << 60, Period: time.Second, Entity: "e"}}),
	} {
		if _, err := l.Check(context.Background(), r); !errors.Is(err, enforcer.ErrBadRequest) {
			t.Errorf("%s: err %v, want ErrBadRequest", name, err)
		}
	}
}

// TestOverrideCounterOutlivesItsLimit: an override's counter is its entity
// and window, as envoyproxy/ratelimit keys it (domain, entries, window
// start), not its limit: lowering an override mid-window counts what was
// already taken, and changing it back and forth lets no more through in a
// window than the highest limit given. A changed period counts in its own
// windows.
func TestOverrideCounterOutlivesItsLimit(t *testing.T) {
	backends(t, func(t *testing.T, rdb redis.UniversalClient) {
		l := newLimiter(t, rdb, partRules)
		ov := func(limit int64, period time.Duration) enforcer.Part {
			return enforcer.Part{Override: &enforcer.Override{Limit: limit, Period: period, Entity: "p|user=u"}}
		}
		allowed := 0
		for i, c := range []struct {
			limit int64
			n     int
			want  decision.Outcome
		}{
			{100, 5, decision.Allowed}, // 5 of 100
			{2, 1, decision.Denied},    // lowered: 5 already taken
			{6, 1, decision.Allowed},   // the 6th
			{6, 1, decision.Denied},
			{3, 1, decision.Denied},
			{100, 1, decision.Allowed}, // raised again: the 7th of 100
		} {
			for j := range c.n {
				d := decide(t, l, parts(int64(10*i+j), ov(c.limit, time.Minute)))
				if d.Outcome != c.want {
					t.Fatalf("step %d, request %d under %d/min: %v, want %v (%d allowed before it in the window)", i, j, c.limit, d.Outcome, c.want, allowed)
				}
				if d.Outcome == decision.Allowed {
					allowed++
				}
			}
		}
		if d := decide(t, l, parts(100, ov(100, time.Minute))); d.Remaining != 92 {
			t.Errorf("remaining %d under 100/min after 8 allowed, want 92", d.Remaining)
		}
		// Another period: its own window (an hour from the epoch), so 2 of 2.
		for i, want := range []decision.Outcome{decision.Allowed, decision.Allowed, decision.Denied} {
			if d := decide(t, l, parts(200+int64(i), ov(2, time.Hour))); d.Outcome != want {
				t.Errorf("2/hour request %d: %v, want %v", i, d.Outcome, want)
			}
		}
	})
}

// TestOverridesShareOneRuleLabel: every limit override's decisions are
// counted under rule="override", whatever their limits (the callers'), so
// that callers sending many limits do not spend the rule label's values
// that the rule set's own rules need.
func TestOverridesShareOneRuleLabel(t *testing.T) {
	reg := prometheus.NewRegistry()
	l, err := enforcer.New(redistest.Server(t), mustSet(t, partRules), enforcer.Options{Budget: time.Second, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		o := &enforcer.Override{Limit: int64(100 + i), Period: time.Minute, Entity: "e"}
		decide(t, l, parts(int64(i), enforcer.Part{Override: o}))
	}
	decide(t, l, parts(100, enforcer.Part{Descriptors: user("u")}))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "sluice_enforcer_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "rule" {
					labels[lp.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	if len(labels) != 2 || labels["override"] != 50 || labels["per_user"] != 1 {
		t.Errorf("decisions_total by rule: %v, want override 50 and per_user 1", labels)
	}
}
