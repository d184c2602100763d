package rules

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/redistest"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func dyn(id string, mode Mode, expires time.Time) Rule {
	return Rule{ID: id, Match: []Match{{Key: KeyASN, Value: "64500"}, {Key: KeyClientIP}}, Limit: 10, Period: time.Minute,
		Mode: mode, Origin: "detector/heavy-hitter", Reason: "test", ExpiresAt: expires}
}

func ids(rs []*Rule) string {
	var s []string
	for _, r := range rs {
		s = append(s, r.ID)
	}
	return strings.Join(s, ",")
}

// TestDynamicCap: writes beyond the cap are refused atomically, updates
// of active rules are not, expired rules free their place, and Load keeps
// at most the cap, the earliest created, when a writer bypassed the cap.
func TestDynamicCap(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := NewStore(rdb, DynamicCap(3))
	var rs []Rule
	for i := range 5 {
		rs = append(rs, dyn(fmt.Sprintf("r%d", i), Shadow, t0.Add(time.Duration(i+1)*time.Minute)))
	}
	n, err := st.PutDynamic(ctx, t0, rs)
	if n != 3 || !errors.Is(err, ErrCapReached) || !strings.Contains(err.Error(), "r3, r4") {
		t.Fatalf("5 rules into a cap of 3: wrote %d, %v; want 3 and ErrCapReached naming r3, r4", n, err)
	}
	c, err := st.Load(ctx, t0)
	if err != nil || ids(c.Rules) != "r0,r1,r2" || c.OverCap != 0 {
		t.Fatalf("load: %v %+v", err, c)
	}
	// An update of an active rule is not a new one.
	up := dyn("r1", Shadow, t0.Add(time.Hour))
	if n, err := st.PutDynamic(ctx, t0, []Rule{up}); n != 1 || err != nil {
		t.Errorf("update at the cap: %d %v", n, err)
	}
	// At t0+90s r0 has expired: it is pruned and its place taken.
	now := t0.Add(90 * time.Second)
	if n, err := st.PutDynamic(ctx, now, []Rule{dyn("r5", Shadow, now.Add(time.Hour)), dyn("r6", Shadow, now.Add(time.Hour))}); n != 1 || !errors.Is(err, ErrCapReached) {
		t.Errorf("after one expiry: wrote %d, %v; want 1 and ErrCapReached", n, err)
	}
	if ok, _ := rdb.HExists(ctx, DynamicRulesKey, "r0").Result(); ok {
		t.Error("the expired r0 was not pruned")
	}

	// A writer that bypassed the cap: Load keeps the 3 created first.
	for i, id := range []string{"x1", "x2"} {
		b, _ := json.Marshal(&DynamicRule{Rule: dyn(id, Shadow, t0.Add(time.Hour)), Created: t0.Add(-time.Duration(i+1) * time.Hour)})
		rdb.HSet(ctx, DynamicRulesKey, id, b)
	}
	c, err = st.Load(ctx, now)
	if err != nil || ids(c.Rules) != "r1,x1,x2" || c.OverCap != 2 {
		t.Errorf("load over the cap: %v rules %s, over %d; want r1,x1,x2 (r1 created at t0, x1 and x2 before) and 2 over", err, ids(c.Rules), c.OverCap)
	}
}

func TestDynamicNeedsExpiry(t *testing.T) {
	ctx := context.Background()
	st := NewStore(redistest.Server(t))
	noOrigin := dyn("o", Shadow, t0.Add(time.Hour))
	noOrigin.Origin = ""
	for name, c := range map[string]struct {
		r    Rule
		want error
	}{
		"no expiry":   {dyn("a", Shadow, time.Time{}), ErrNoExpiry},
		"in the past": {dyn("b", Shadow, t0.Add(-time.Second)), ErrNoExpiry},
		"now":         {dyn("c", Shadow, t0), ErrNoExpiry},
		"no origin":   {noOrigin, ErrInvalidRule},
		"invalid":     {Rule{ID: "d", Origin: "x", ExpiresAt: t0.Add(time.Hour)}, ErrInvalidRule},
		// The hash that holds it expires 24 h after the last write.
		"beyond 24 h": {dyn("f", Shadow, t0.Add(MaxDynamicTTL+time.Second)), ErrExpiryTooFar},
		"100 years":   {dyn("g", Shadow, t0.Add(876000*time.Hour)), ErrExpiryTooFar},
	} {
		// With a valid rule in the batch: nothing is written.
		n, err := st.PutDynamic(ctx, t0, []Rule{dyn("ok", Shadow, t0.Add(time.Hour)), c.r})
		if n != 0 || !errors.Is(err, c.want) {
			t.Errorf("%s: wrote %d, %v; want 0 and %v", name, n, err, c.want)
		}
	}
	if ds, _ := st.Dynamic(ctx); len(ds) != 0 {
		t.Errorf("refused batches wrote %d rules", len(ds))
	}
	_, err := st.PutDynamic(ctx, t0, []Rule{dyn("far", Shadow, t0.Add(48*time.Hour))})
	if err == nil || !strings.Contains(err.Error(), "a dynamic rule lives at most 24h; make it a static rule for longer") {
		t.Errorf("an expiry 48 h ahead: %v; want the limit and the fix", err)
	}
	if n, err := st.PutDynamic(ctx, t0, []Rule{dyn("day", Shadow, t0.Add(MaxDynamicTTL))}); n != 1 || err != nil {
		t.Errorf("an expiry exactly 24 h ahead: %d %v", n, err)
	}
	// PutRules without a clock (the pipeline's, in event time) takes an
	// expiry in the past: a replay's rules are.
	if err := st.PutRules(ctx, []Rule{dyn("replayed", Shadow, time.Date(2026, 1, 1, 0, 10, 0, 0, time.UTC))}); err != nil {
		t.Errorf("PutRules without a clock: %v", err)
	}
	if err := st.PutRules(ctx, []Rule{dyn("e", Shadow, time.Time{})}); !errors.Is(err, ErrNoExpiry) {
		t.Errorf("PutRules of a rule without expiry: %v", err)
	}
	// Nor can it tell an expiry too far: it takes it.
	if err := st.PutRules(ctx, []Rule{dyn("far", Shadow, time.Now().Add(100*24*time.Hour))}); err != nil {
		t.Errorf("PutRules without a clock, of an expiry 100 days ahead: %v", err)
	}
	clocked := NewStore(st.rdb, StoreClock(func() time.Time { return t0 }))
	if err := clocked.PutRules(ctx, []Rule{dyn("late", Shadow, t0.Add(-time.Minute))}); !errors.Is(err, ErrNoExpiry) {
		t.Errorf("PutRules with a clock, of an expired rule: %v", err)
	}
}

// TestDynamicKill: the kill switch empties the dynamic rules every enforcer
// loads, and turning it off restores those not expired.
func TestDynamicKill(t *testing.T) {
	ctx := context.Background()
	st := NewStore(redistest.Server(t))
	if _, err := st.PutDynamic(ctx, t0, []Rule{dyn("a", Enforce, t0.Add(time.Hour)), dyn("b", Shadow, t0.Add(time.Hour))}); err != nil {
		t.Fatal(err)
	}
	if err := st.SetKill(ctx, true, "alice: false positives"); err != nil {
		t.Fatal(err)
	}
	c, err := st.Load(ctx, t0)
	if err != nil || !c.Killed || len(c.Rules) != 0 {
		t.Fatalf("killed: %v %+v; want no rules and Killed", err, c)
	}
	if on, why, err := st.Killed(ctx); !on || why != "alice: false positives" || err != nil {
		t.Errorf("Killed: %v %q %v", on, why, err)
	}
	// Writes go on while killed.
	if _, err := st.PutDynamic(ctx, t0, []Rule{dyn("c", Shadow, t0.Add(time.Hour))}); err != nil {
		t.Errorf("write while killed: %v", err)
	}
	if err := st.SetKill(ctx, false, ""); err != nil {
		t.Fatal(err)
	}
	if c, err = st.Load(ctx, t0); err != nil || c.Killed || ids(c.Rules) != "a,b,c" {
		t.Errorf("after kill off: %v %+v", err, c)
	}
}

// TestPromoteRollback: promote switches a shadow rule to enforce and
// rollback restores the shadow rule in one step; a writer's refresh of a
// promoted rule keeps the promotion.
func TestPromoteRollback(t *testing.T) {
	ctx := context.Background()
	st := NewStore(redistest.Server(t))
	r := dyn("hh", Shadow, t0.Add(time.Hour))
	r.Version = 4
	if _, err := st.PutDynamic(ctx, t0, []Rule{r, dyn("en", Enforce, t0.Add(time.Hour))}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Promote(ctx, "nope"); !errors.Is(err, ErrRuleNotFound) {
		t.Errorf("promote unknown: %v", err)
	}
	if _, err := st.Promote(ctx, "en"); !errors.Is(err, ErrNotShadow) {
		t.Errorf("promote an enforcing rule: %v", err)
	}
	if _, err := st.RollbackRule(ctx, "hh"); !errors.Is(err, ErrNotPromoted) {
		t.Errorf("rollback before promotion: %v", err)
	}
	d, err := st.Promote(ctx, "hh")
	if err != nil || d.Mode != Enforce || d.Version != 5 || !d.Promoted() || d.Previous.Mode != Shadow || !d.Created.Equal(t0) {
		t.Fatalf("promote: %+v %v", d, err)
	}
	c, _ := st.Load(ctx, t0)
	if len(c.Rules) != 2 || c.Rules[1].ID != "hh" || c.Rules[1].Mode != Enforce {
		t.Fatalf("loaded after promotion: %+v", c.Rules)
	}
	// The detector refreshes its rule (shadow, a later expiry): it stays
	// promoted, and the refresh is what a rollback restores.
	refresh := dyn("hh", Shadow, t0.Add(2*time.Hour))
	refresh.Version = 6
	if _, err := st.PutDynamic(ctx, t0.Add(time.Minute), []Rule{refresh}); err != nil {
		t.Fatal(err)
	}
	ds, _ := st.Dynamic(ctx)
	if h := ds[1]; h.Mode != Enforce || !h.Promoted() || !h.Previous.ExpiresAt.Equal(t0.Add(2*time.Hour)) || !h.Created.Equal(t0) {
		t.Fatalf("refreshed while promoted: %+v", h)
	}
	d, err = st.RollbackRule(ctx, "hh")
	if err != nil || d.Mode != Shadow || d.Promoted() || !d.RolledBack || d.Version != 7 || !d.ExpiresAt.Equal(t0.Add(2*time.Hour)) {
		t.Fatalf("rollback: %+v %v", d, err)
	}
	if c, _ := st.Load(ctx, t0); c.Rules[1].Mode != Shadow {
		t.Errorf("loaded after rollback: %+v", c.Rules[1])
	}
	if _, err := st.RollbackRule(ctx, "hh"); !errors.Is(err, ErrNotPromoted) {
		t.Errorf("second rollback: %v", err)
	}
}

func TestPromotionPolicy(t *testing.T) {
	now := t0.Add(time.Hour)
	base := func(mut func(d *DynamicRule)) *DynamicRule {
		d := &DynamicRule{Rule: dyn("r", Shadow, now.Add(30*time.Minute)), Created: now.Add(-20 * time.Minute)}
		if mut != nil {
			mut(d)
		}
		return d
	}
	ok := ShadowStats{Matched: 1000, WouldDeny: 300}
	for _, c := range []struct {
		name    string
		d       *DynamicRule
		stats   ShadowStats
		promote bool
		reason  string
	}{
		{"promoted", base(nil), ok, true, "would deny 30.0% of 1000"},
		{"enforcing", base(func(d *DynamicRule) { d.Mode = Enforce }), ok, false, "already enforce"},
		{"rolled back", base(func(d *DynamicRule) { d.RolledBack = true }), ok, false, "rolled back"},
		{"operator's", base(func(d *DynamicRule) { d.Origin = "operator/alice" }), ok, false, "not promoted automatically"},
		{"young", base(func(d *DynamicRule) { d.Created = now.Add(-5 * time.Minute) }), ok, false, "in shadow for 5m0s, under 10m0s"},
		{"no created time", base(func(d *DynamicRule) { d.Created = time.Time{} }), ok, false, "in shadow for"},
		{"expiring", base(func(d *DynamicRule) { d.ExpiresAt = now.Add(30 * time.Second) }), ok, false, "expires in 30s"},
		{"expired", base(func(d *DynamicRule) { d.ExpiresAt = now }), ok, false, "expired"},
		{"little evidence", base(nil), ShadowStats{Matched: 50, WouldDeny: 20}, false, "matched 50 requests, under 100"},
		{"toothless", base(nil), ShadowStats{Matched: 1000, WouldDeny: 5}, false, "under 1.0%"},
		{"too broad", base(nil), ShadowStats{Matched: 1000, WouldDeny: 990}, false, "over 95.0%"},
	} {
		v := PromotionPolicy{}.Decide(now, []Candidate{{Rule: c.d, Stats: c.stats}})
		if len(v) != 1 || v[0].Promote != c.promote || !strings.Contains(v[0].Reason, c.reason) || v[0].ID != "r" {
			t.Errorf("%s: %+v; want promote=%v, reason with %q", c.name, v, c.promote, c.reason)
		}
	}
	// Origins: exact names and prefixes ending in "/"; an empty list takes any.
	p := PromotionPolicy{Origins: []string{"operator/alice", "pipeline/"}}
	for o, want := range map[string]bool{"operator/alice": true, "operator/bob": false, "pipeline/asn": true, "detector/hh": false} {
		if got := p.origin(o); got != want {
			t.Errorf("origin %q: %v, want %v", o, got, want)
		}
	}
	if v := (PromotionPolicy{Origins: []string{}}).Decide(now, []Candidate{{Rule: base(func(d *DynamicRule) { d.Origin = "x" }), Stats: ok}}); !v[0].Promote {
		t.Errorf("empty Origins: %+v; want any origin", v)
	}
}
