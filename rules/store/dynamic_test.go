package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func dyn(id string, mode rules.Mode, expires time.Time) rules.Rule {
	return rules.Rule{ID: id, Match: []rules.Match{{Key: rules.KeyASN, Value: "64500"}, {Key: rules.KeyClientIP}}, Limit: 10, Period: time.Minute,
		Mode: mode, Origin: "detector/heavy-hitter", Reason: "test", ExpiresAt: expires}
}

func ids(rs []*rules.Rule) string {
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
	var rs []rules.Rule
	for i := range 5 {
		rs = append(rs, dyn(fmt.Sprintf("r%d", i), rules.Shadow, t0.Add(time.Duration(i+1)*time.Minute)))
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
	up := dyn("r1", rules.Shadow, t0.Add(time.Hour))
	if n, err := st.PutDynamic(ctx, t0, []rules.Rule{up}); n != 1 || err != nil {
		t.Errorf("update at the cap: %d %v", n, err)
	}
	// At t0+90s r0 has expired: it is pruned and its place taken.
	now := t0.Add(90 * time.Second)
	if n, err := st.PutDynamic(ctx, now, []rules.Rule{dyn("r5", rules.Shadow, now.Add(time.Hour)), dyn("r6", rules.Shadow, now.Add(time.Hour))}); n != 1 || !errors.Is(err, ErrCapReached) {
		t.Errorf("after one expiry: wrote %d, %v; want 1 and ErrCapReached", n, err)
	}
	if ok, _ := rdb.HExists(ctx, DynamicRulesKey, "r0").Result(); ok {
		t.Error("the expired r0 was not pruned")
	}

	// A writer that bypassed the cap: Load keeps the 3 created first.
	for i, id := range []string{"x1", "x2"} {
		b, _ := json.Marshal(&rules.DynamicRule{Rule: dyn(id, rules.Shadow, t0.Add(time.Hour)), Created: t0.Add(-time.Duration(i+1) * time.Hour)})
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
	noOrigin := dyn("o", rules.Shadow, t0.Add(time.Hour))
	noOrigin.Origin = ""
	for name, c := range map[string]struct {
		r    rules.Rule
		want error
	}{
		"no expiry":   {dyn("a", rules.Shadow, time.Time{}), rules.ErrNoExpiry},
		"in the past": {dyn("b", rules.Shadow, t0.Add(-time.Second)), rules.ErrNoExpiry},
		"now":         {dyn("c", rules.Shadow, t0), rules.ErrNoExpiry},
		"no origin":   {noOrigin, rules.ErrInvalidRule},
		"invalid":     {rules.Rule{ID: "d", Origin: "x", ExpiresAt: t0.Add(time.Hour)}, rules.ErrInvalidRule},
		// The hash that holds it expires 24 h after the last write.
		"beyond 24 h": {dyn("f", rules.Shadow, t0.Add(rules.MaxDynamicTTL+time.Second)), rules.ErrExpiryTooFar},
		"100 years":   {dyn("g", rules.Shadow, t0.Add(876000*time.Hour)), rules.ErrExpiryTooFar},
	} {
		// With a valid rule in the batch: nothing is written.
		n, err := st.PutDynamic(ctx, t0, []rules.Rule{dyn("ok", rules.Shadow, t0.Add(time.Hour)), c.r})
		if n != 0 || !errors.Is(err, c.want) {
			t.Errorf("%s: wrote %d, %v; want 0 and %v", name, n, err, c.want)
		}
	}
	if ds, _ := st.Dynamic(ctx); len(ds) != 0 {
		t.Errorf("refused batches wrote %d rules", len(ds))
	}
	_, err := st.PutDynamic(ctx, t0, []rules.Rule{dyn("far", rules.Shadow, t0.Add(48*time.Hour))})
	if err == nil || !strings.Contains(err.Error(), "a dynamic rule lives at most 24h; make it a static rule for longer") {
		t.Errorf("an expiry 48 h ahead: %v; want the limit and the fix", err)
	}
	if n, err := st.PutDynamic(ctx, t0, []rules.Rule{dyn("day", rules.Shadow, t0.Add(rules.MaxDynamicTTL))}); n != 1 || err != nil {
		t.Errorf("an expiry exactly 24 h ahead: %d %v", n, err)
	}
	// PutRules without a clock (the pipeline's, in event time) takes an
	// expiry in the past: a replay's rules are.
	if err := st.PutRules(ctx, []rules.Rule{dyn("replayed", rules.Shadow, time.Date(2026, 1, 1, 0, 10, 0, 0, time.UTC))}); err != nil {
		t.Errorf("PutRules without a clock: %v", err)
	}
	if err := st.PutRules(ctx, []rules.Rule{dyn("e", rules.Shadow, time.Time{})}); !errors.Is(err, rules.ErrNoExpiry) {
		t.Errorf("PutRules of a rule without expiry: %v", err)
	}
	// Nor can it tell an expiry too far: it takes it.
	if err := st.PutRules(ctx, []rules.Rule{dyn("far", rules.Shadow, time.Now().Add(100*24*time.Hour))}); err != nil {
		t.Errorf("PutRules without a clock, of an expiry 100 days ahead: %v", err)
	}
	clocked := NewStore(st.rdb, StoreClock(func() time.Time { return t0 }))
	if err := clocked.PutRules(ctx, []rules.Rule{dyn("late", rules.Shadow, t0.Add(-time.Minute))}); !errors.Is(err, rules.ErrNoExpiry) {
		t.Errorf("PutRules with a clock, of an expired rule: %v", err)
	}
}

// TestDynamicKill: the kill switch empties the dynamic rules every enforcer
// loads, and turning it off restores those not expired.
func TestDynamicKill(t *testing.T) {
	ctx := context.Background()
	st := NewStore(redistest.Server(t))
	if _, err := st.PutDynamic(ctx, t0, []rules.Rule{dyn("a", rules.Enforce, t0.Add(time.Hour)), dyn("b", rules.Shadow, t0.Add(time.Hour))}); err != nil {
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
	if _, err := st.PutDynamic(ctx, t0, []rules.Rule{dyn("c", rules.Shadow, t0.Add(time.Hour))}); err != nil {
		t.Errorf("write while killed: %v", err)
	}
	if err := st.SetKill(ctx, false, ""); err != nil {
		t.Fatal(err)
	}
	if c, err = st.Load(ctx, t0); err != nil || c.Killed || ids(c.Rules) != "a,b,c" {
		t.Errorf("after kill off: %v %+v", err, c)
	}
}

// TestDeleteDynamic: a writer deletes only its own rules (by origin),
// ids that are not stored are no error, and "" deletes any origin.
func TestDeleteDynamic(t *testing.T) {
	ctx := context.Background()
	st := NewStore(redistest.Server(t))
	mine := func(id string) rules.Rule {
		r := dyn(id, rules.Enforce, t0.Add(time.Hour))
		r.Origin = "crowdsec/cscli"
		return r
	}
	if _, err := st.PutDynamic(ctx, t0, []rules.Rule{mine("cs-1"), mine("cs-2"), dyn("hh", rules.Shadow, t0.Add(time.Hour))}); err != nil {
		t.Fatal(err)
	}
	n, err := st.DeleteDynamic(ctx, "crowdsec/", "cs-1", "hh", "absent")
	if n != 1 || err != nil {
		t.Fatalf("delete cs-1, hh (the detector's), absent: %d %v; want 1", n, err)
	}
	c, err := st.Load(ctx, t0)
	if err != nil || ids(c.Rules) != "cs-2,hh" {
		t.Fatalf("after the delete: %v %s; want cs-2,hh", err, ids(c.Rules))
	}
	if n, err := st.DeleteDynamic(ctx, "", "hh", "cs-2"); n != 2 || err != nil {
		t.Errorf("delete with origin \"\": %d %v; want 2", n, err)
	}
	if n, err := st.DeleteDynamic(ctx, "crowdsec/"); n != 0 || err != nil {
		t.Errorf("delete of no ids: %d %v", n, err)
	}
}

// TestPromoteRollback: promote switches a shadow rule to enforce and
// rollback restores the shadow rule in one step; a writer's refresh of a
// promoted rule keeps the promotion.
func TestPromoteRollback(t *testing.T) {
	ctx := context.Background()
	st := NewStore(redistest.Server(t))
	r := dyn("hh", rules.Shadow, t0.Add(time.Hour))
	r.Version = 4
	if _, err := st.PutDynamic(ctx, t0, []rules.Rule{r, dyn("en", rules.Enforce, t0.Add(time.Hour))}); err != nil {
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
	if err != nil || d.Mode != rules.Enforce || d.Version != 5 || !d.Promoted() || d.Previous.Mode != rules.Shadow || !d.Created.Equal(t0) {
		t.Fatalf("promote: %+v %v", d, err)
	}
	c, _ := st.Load(ctx, t0)
	if len(c.Rules) != 2 || c.Rules[1].ID != "hh" || c.Rules[1].Mode != rules.Enforce {
		t.Fatalf("loaded after promotion: %+v", c.Rules)
	}
	// The detector refreshes its rule (shadow, a later expiry): it stays
	// promoted, and the refresh is what a rollback restores.
	refresh := dyn("hh", rules.Shadow, t0.Add(2*time.Hour))
	refresh.Version = 6
	if _, err := st.PutDynamic(ctx, t0.Add(time.Minute), []rules.Rule{refresh}); err != nil {
		t.Fatal(err)
	}
	ds, _ := st.Dynamic(ctx)
	if h := ds[1]; h.Mode != rules.Enforce || !h.Promoted() || !h.Previous.ExpiresAt.Equal(t0.Add(2*time.Hour)) || !h.Created.Equal(t0) {
		t.Fatalf("refreshed while promoted: %+v", h)
	}
	d, err = st.RollbackRule(ctx, "hh")
	if err != nil || d.Mode != rules.Shadow || d.Promoted() || !d.RolledBack || d.Version != 7 || !d.ExpiresAt.Equal(t0.Add(2*time.Hour)) {
		t.Fatalf("rollback: %+v %v", d, err)
	}
	if c, _ := st.Load(ctx, t0); c.Rules[1].Mode != rules.Shadow {
		t.Errorf("loaded after rollback: %+v", c.Rules[1])
	}
	if _, err := st.RollbackRule(ctx, "hh"); !errors.Is(err, ErrNotPromoted) {
		t.Errorf("second rollback: %v", err)
	}
}
