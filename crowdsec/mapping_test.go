package crowdsec

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/rules"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// TestMappingMatch: each scope maps to the match the enforcer can apply,
// IPv6 widened to its prefix, and what sluice cannot enforce is refused
// with its reason.
func TestMappingMatch(t *testing.T) {
	m := Mapping{Limits: map[string]Limit{"captcha": {10, time.Minute}}}
	m.defaults()
	for _, c := range []struct {
		scope, value, typ string
		cidr              string // client_ip network; "" with asn
		asn               string
		limit             Limit
		refused           string
	}{
		{scope: "Ip", value: "192.0.2.7", typ: "ban", cidr: "192.0.2.7/32", limit: Limit{0, time.Second}},
		{scope: "ip", value: " 192.0.2.7 ", typ: "ban", cidr: "192.0.2.7/32", limit: Limit{0, time.Second}},
		{scope: "Ip", value: "2001:db8::5", typ: "captcha", cidr: "2001:db8::/64", limit: Limit{10, time.Minute}},
		{scope: "Ip", value: "::ffff:192.0.2.9", typ: "ban", cidr: "192.0.2.9/32", limit: Limit{0, time.Second}},
		{scope: "Range", value: "198.51.100.0/24", typ: "ban", cidr: "198.51.100.0/24", limit: Limit{0, time.Second}},
		{scope: "Range", value: "198.51.100.7/24", typ: "throttle", cidr: "198.51.100.0/24", limit: DefaultLimit},
		{scope: "Range", value: "2001:db8:0:0:1::/80", typ: "ban", cidr: "2001:db8::/64", limit: Limit{0, time.Second}},
		{scope: "Range", value: "2001:db8::/32", typ: "ban", cidr: "2001:db8::/32", limit: Limit{0, time.Second}},
		{scope: "AS", value: "64500", typ: "ban", asn: "64500", limit: Limit{0, time.Second}},
		{scope: "AS", value: "AS64500", typ: "Captcha", asn: "64500", limit: Limit{10, time.Minute}},
		{scope: "Country", value: "FR", typ: "ban", refused: RefusedScope},
		{scope: "Username", value: "bob", typ: "ban", refused: RefusedScope},
		{scope: "Ip", value: "not-an-ip", typ: "ban", refused: RefusedValue},
		{scope: "Ip", value: "fe80::1%eth0", typ: "ban", refused: RefusedValue},
		{scope: "Range", value: "10.0.0.0/33", typ: "ban", refused: RefusedValue},
		{scope: "AS", value: "AS-EXAMPLE", typ: "ban", refused: RefusedValue},
	} {
		w, why := m.match(&Decision{Scope: c.scope, Value: c.value, Type: c.typ})
		name := c.scope + ":" + c.value + " " + c.typ
		if c.refused != "" {
			if why == nil || why.reason != c.refused {
				t.Errorf("%s: %v; want refused for %s", name, why, c.refused)
			}
			continue
		}
		if why != nil {
			t.Errorf("%s: refused: %v", name, why)
			continue
		}
		if w.limit != c.limit {
			t.Errorf("%s: limit %s, want %s", name, w.limit, c.limit)
		}
		switch {
		case c.cidr != "":
			if w.match.Key != rules.KeyClientIP || len(w.match.CIDR) != 1 || w.match.CIDR[0] != netip.MustParsePrefix(c.cidr) {
				t.Errorf("%s: match %+v, want client_ip in %s", name, w.match, c.cidr)
			}
		default:
			if w.match.Key != rules.KeyASN || w.match.Value != c.asn {
				t.Errorf("%s: match %+v, want asn %s", name, w.match, c.asn)
			}
		}
		if !rules.ValidID(w.id) || !strings.HasPrefix(w.id, "cs-") {
			t.Errorf("%s: id %q", name, w.id)
		}
	}
	// One rule per source and type: two spellings of one source share it,
	// another type makes another.
	a, _ := m.match(&Decision{Scope: "Ip", Value: "2001:db8::5", Type: "ban"})
	b, _ := m.match(&Decision{Scope: "Range", Value: "2001:db8::/64", Type: "ban"})
	c, _ := m.match(&Decision{Scope: "Ip", Value: "2001:db8::5", Type: "captcha"})
	if a.id != b.id || a.id == c.id {
		t.Errorf("ids: %s %s %s; want the first two equal, the third another", a.id, b.id, c.id)
	}
}

func TestParseLimit(t *testing.T) {
	for in, want := range map[string]Limit{"10/1m": {10, time.Minute}, "1/1s": {1, time.Second}, "5/250ms": {5, 250 * time.Millisecond}} {
		if got, err := ParseLimit(in); err != nil || got != want {
			t.Errorf("ParseLimit(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for l, want := range map[Limit]string{{60, time.Minute}: "60/1m", {1, time.Hour}: "1/1h", {5, 90 * time.Second}: "5/1m30s", {2, 250 * time.Millisecond}: "2/250ms"} {
		if got := l.String(); got != want {
			t.Errorf("%v.String() = %q, want %q", l.Period, got, want)
		}
		if back, err := ParseLimit(want); err != nil || back != l {
			t.Errorf("ParseLimit(%q) = %v %v", want, back, err)
		}
	}
	for _, in := range []string{"", "10", "0/1m", "-1/1m", "10/0s", "10/1us", "x/1m", "10/m"} {
		if _, err := ParseLimit(in); err == nil {
			t.Errorf("ParseLimit(%q): no error", in)
		}
	}
}

// TestExpiry: until wins when given, else the duration from receipt; an
// unreadable or spent one is refused.
func TestExpiry(t *testing.T) {
	if e, why := expiry(&Decision{Duration: "3h59m58.5s"}, t0); why != nil || !e.Equal(t0.Add(3*time.Hour+59*time.Minute+58500*time.Millisecond)) {
		t.Errorf("duration: %v %v", e, why)
	}
	until := t0.Add(time.Hour)
	if e, why := expiry(&Decision{Duration: "1s", Until: until.Format(time.RFC3339Nano)}, t0); why != nil || !e.Equal(until) {
		t.Errorf("until: %v %v", e, why)
	}
	for _, d := range []Decision{{Duration: "-3s"}, {Duration: "soon"}, {Duration: "0s"}, {Until: t0.Add(-time.Second).Format(time.RFC3339), Duration: "1h"}} {
		if _, why := expiry(&d, t0); why == nil || why.reason != RefusedDuration {
			t.Errorf("%+v: %v; want refused for duration", d, why)
		}
	}
}

// TestStateApply: decisions on one source and type make one rule that
// lasts until the last of them ends; deletions remove it; a startup answer
// replaces everything, keeping the expiry of decisions already held; what
// sluice cannot enforce is returned to count.
func TestStateApply(t *testing.T) {
	s := newState(Mapping{Shadow: true})
	ban := func(id int64, v, dur string) Decision {
		return Decision{ID: id, Origin: "cscli", Scenario: "manual", Scope: "Ip", Type: "ban", Value: v, Duration: dur}
	}
	refused, changed := s.apply(&Stream{New: []Decision{
		ban(1, "192.0.2.7", "2m"), ban(2, "192.0.2.7", "5m"), ban(3, "198.51.100.1", "1m"),
		{ID: 4, Scope: "Country", Value: "FR", Type: "ban", Duration: "1h"},
	}}, true, t0)
	if !changed || len(refused) != 1 || refused[0].d.ID != 4 || refused[0].why.reason != RefusedScope {
		t.Fatalf("apply: changed %v, refused %+v", changed, refused)
	}
	d, bad := s.desired(t0)
	if len(bad) != 0 || len(d.rules) != 2 || d.decisions != 3 {
		t.Fatalf("desired: %+v %v", d, bad)
	}
	r := d.rules[d.byID[mustID(t, s, "192.0.2.7")]].rule
	if !r.ExpiresAt.Equal(t0.Add(5*time.Minute)) || r.Limit != 0 || r.Mode != rules.Shadow || r.Origin != "crowdsec/cscli" ||
		r.Evidence["crowdsec_decisions"] != "1,2" || r.Version != 2 {
		t.Errorf("the rule of two decisions: %+v", r)
	}
	// At t0+90s decision 3 has ended: its rule is gone from what is wanted.
	if d, _ := s.desired(t0.Add(90 * time.Second)); len(d.rules) != 1 {
		t.Errorf("after decision 3 ended: %d rules, want 1", len(d.rules))
	}
	// Deleting decision 2 shortens the rule; deleting 1 too removes it.
	if _, changed := s.apply(&Stream{Deleted: []Decision{{ID: 2}}}, false, t0.Add(time.Second)); !changed {
		t.Error("a deletion changed nothing")
	}
	d, _ = s.desired(t0.Add(time.Second))
	if r := d.rules[d.byID[mustID(t, s, "192.0.2.7")]].rule; !r.ExpiresAt.Equal(t0.Add(2 * time.Minute)) {
		t.Errorf("after deleting decision 2: expires %v, want t0+2m", r.ExpiresAt)
	}
	if _, changed := s.apply(&Stream{Deleted: []Decision{{ID: 99}}}, false, t0); changed {
		t.Error("deleting an unknown decision changed the rules")
	}
	// A startup answer after an outage: decision 1 again (with the
	// duration left then), and a new one; 3 is gone.
	later := t0.Add(30 * time.Second)
	refused, changed = s.apply(&Stream{New: []Decision{ban(1, "192.0.2.7", "1m29.9s"), ban(5, "203.0.113.5", "1h"),
		{ID: 4, Scope: "Country", Value: "FR", Type: "ban", Duration: "59m"}}}, true, later)
	if len(refused) != 0 {
		t.Errorf("a startup answer reports the Country decision again: %+v", refused)
	}
	d, _ = s.desired(later)
	if !changed || len(d.rules) != 2 || d.decisions != 2 {
		t.Fatalf("after a startup answer: %+v", d)
	}
	if r := d.rules[d.byID[mustID(t, s, "192.0.2.7")]].rule; !r.ExpiresAt.Equal(t0.Add(2 * time.Minute)) {
		t.Errorf("a decision held before a startup answer: expires %v, want its first expiry, t0+2m", r.ExpiresAt)
	}
	if _, ok := d.byID[mustID(t, s, "198.51.100.1")]; ok {
		t.Error("decision 3, absent from the startup answer, still makes a rule")
	}
}

// mustID is the id of the ban rule of address v.
func mustID(t *testing.T, s *state, v string) string {
	t.Helper()
	w, why := s.m.match(&Decision{Scope: "Ip", Value: v, Type: "ban"})
	if why != nil {
		t.Fatal(why)
	}
	return w.id
}

// FuzzDecision: no decision the Local API may send panics the mapping or
// makes a rule that does not validate.
func FuzzDecision(f *testing.F) {
	f.Add("Ip", "192.0.2.7", "ban", "4h", "")
	f.Add("Range", "2001:db8::/48", "captcha", "1m", "")
	f.Add("AS", "AS64500", "throttle", "-1s", "2026-12-01T12:00:00Z")
	f.Fuzz(func(t *testing.T, scope, value, typ, dur, until string) {
		s := newState(Mapping{})
		s.apply(&Stream{New: []Decision{{ID: 1, Scope: scope, Value: value, Type: typ, Duration: dur, Until: until, Origin: value, Scenario: typ}}}, true, t0)
		if _, bad := s.desired(t0); len(bad) > 0 {
			t.Fatalf("invalid rule: %v", bad)
		}
	})
}
