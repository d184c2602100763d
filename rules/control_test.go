package rules

import (
	"strings"
	"testing"
	"time"
)

func TestPromotionPolicy(t *testing.T) {
	now := time.Date(2026, 11, 30, 13, 0, 0, 0, time.UTC)
	dyn := func(id string, mode Mode, expires time.Time) Rule {
		return Rule{ID: id, Match: []Match{{Key: KeyASN, Value: "64500"}, {Key: KeyClientIP}}, Limit: 10, Period: time.Minute,
			Mode: mode, Origin: "detector/heavy-hitter", Reason: "test", ExpiresAt: expires}
	}
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
