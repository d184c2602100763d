package replay_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/detector"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

// TestPromoter: the policy promotes, on tallied evidence, the shadow rule
// that earned it, in every region, and not the one that would deny nearly
// everything it matches; a rollback undoes the promotion in one step, and
// the policy leaves the rolled-back rule alone.
func TestPromoter(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	ctx := context.Background()
	stores := map[string]*store.Store{}
	for _, region := range []string{"eu", "us"} {
		st := store.NewStore(redistest.Server(t))
		stores[region] = st
		for _, id := range []string{"hh-asn-64500", "too-broad"} {
			r := rules.Rule{ID: id, Match: []rules.Match{{Key: rules.KeyASN, Value: "64500"}, {Key: rules.KeyClientIP}},
				Limit: 10, Period: time.Minute, Mode: rules.Shadow, Origin: "detector/asn", Reason: "test", ExpiresAt: t0.Add(time.Hour)}
			if _, err := st.PutDynamic(ctx, t0, []rules.Rule{r}); err != nil {
				t.Fatal(err)
			}
		}
	}
	tally := detector.NewShadowTally()
	l := stage.NewLocal([]stage.Stage{tally}, 2, time.Hour)
	for i := range 200 {
		d := &decisionpb.Decision{Version: 1, Outcome: decisionpb.Outcome_OUTCOME_ALLOWED, EventTimeMs: t0.UnixMilli(), MatchedRules: []string{"per-ip", "hh-asn-64500", "too-broad"}}
		switch {
		case i%5 == 0: // hh-asn-64500 would deny 20%
			d.ShadowRule = "hh-asn-64500"
		default: // too-broad would deny the other 80%, and more below
			d.ShadowRule = "too-broad"
		}
		l.Observe(i, d)
	}
	for i := range 1000 {
		l.Observe(i, &decisionpb.Decision{Version: 1, Outcome: decisionpb.Outcome_OUTCOME_SHADOW_DENIED, EventTimeMs: t0.UnixMilli(), MatchedRules: []string{"too-broad"}, ShadowRule: "too-broad"})
	}
	l.Advance(t0.Add(time.Hour))
	if s := tally.Stats("hh-asn-64500"); s.Matched != 200 || s.WouldDeny != 40 {
		t.Fatalf("tally %+v, want 200 matched, 40 would deny", s)
	}
	p := &store.Promoter{Policy: rules.DefaultPromotionPolicy(), Tally: tally, Stores: stores}

	// Too early: 5 minutes in shadow.
	if _, err := p.Promote(ctx, t0.Add(5*time.Minute)); err != nil {
		t.Fatal(err)
	}
	mode := func(region, id string) rules.Mode {
		ds, err := stores[region].Dynamic(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			if d.ID == id {
				return d.Mode
			}
		}
		t.Fatalf("%s: no rule %s", region, id)
		return 0
	}
	if mode("eu", "hh-asn-64500") != rules.Shadow {
		t.Fatal("promoted after 5 minutes in shadow")
	}
	vs, err := p.Promote(ctx, t0.Add(11*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for _, region := range []string{"eu", "us"} {
		if mode(region, "hh-asn-64500") != rules.Enforce || mode(region, "too-broad") != rules.Shadow {
			t.Errorf("%s: hh-asn-64500 %v, too-broad %v; want enforce and shadow (verdicts %+v)", region, mode(region, "hh-asn-64500"), mode(region, "too-broad"), vs[region])
		}
	}
	// One step back, and the policy leaves it there.
	if _, err := stores["eu"].RollbackRule(ctx, "hh-asn-64500"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Promote(ctx, t0.Add(12*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if mode("eu", "hh-asn-64500") != rules.Shadow {
		t.Error("the policy promoted a rolled-back rule again")
	}
}
