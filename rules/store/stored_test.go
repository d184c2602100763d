package store

import (
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// loadStored puts a fixture of ../../testdata/stored (a JSON object, field to
// stored value) into the Redis hash key, byte for byte.
func loadStored(t *testing.T, ctx context.Context, rdb redis.UniversalClient, file, key string) map[string]string {
	t.Helper()
	b, err := os.ReadFile("../../testdata/stored/" + file)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	for f, v := range m {
		if err := rdb.HSet(ctx, key, f, v).Err(); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// v0Time is the clock of the writes that made the v0 fixture.
var v0Time = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// v0Dynamic is what testdata/stored/v0-dynamic-rules.json holds, by id.
func v0Dynamic() map[string]*rules.DynamicRule {
	exp := v0Time.Add(time.Hour)
	sw := rules.Rule{ID: "sw-promoted", Match: []rules.Match{{Key: rules.KeyCustom, Name: "x-plan", Value: "free"}, {Key: rules.KeyPath, Prefix: "/v1/", NotPrefix: []string{"/v1/health"}}},
		Algorithm: rules.SlidingWindow, Limit: 100, Period: 10 * time.Second, Burst: 100, Mode: rules.Shadow, FailureMode: rules.FailOpenUnlimited, Global: true,
		Origin: "detector/heavy-hitter", Reason: "free plan burst", ExpiresAt: exp, Version: 1796040000000}
	promoted := sw
	promoted.Mode, promoted.Version = rules.Enforce, sw.Version+1
	ds := []*rules.DynamicRule{
		{Rule: rules.Rule{ID: "hh-tb-shadow", Match: []rules.Match{{Key: rules.KeyClientIP, Value: "198.51.100.7"}, {Key: rules.KeyASN, Value: "64500"}},
			Algorithm: rules.TokenBucket, Limit: 10, Period: time.Minute, Burst: 20, Mode: rules.Shadow, FailureMode: rules.FailClosed,
			Origin: "detector/heavy-hitter", Reason: "198.51.100.7 sent 4000 requests in 1m", Evidence: map[string]string{"count": "4000", "window": "1m"},
			ExpiresAt: exp, Version: 1796040000000}},
		{Rule: promoted, Previous: &sw},
		{Rule: rules.Rule{ID: "fw-day", Match: []rules.Match{{Key: rules.KeyTier, Values: []string{"free", "trial"}}, {Key: rules.KeyRoute, Template: "/v1/users/{id}/orders"}},
			Algorithm: rules.FixedWindow, Limit: 5000, Burst: 5000, Calendar: rules.Day, Mode: rules.Shadow, FailureMode: rules.FailOpen,
			Origin: "operator/alice", Reason: "daily cap for trials", ExpiresAt: exp, Version: 1796040000001}},
		{Rule: rules.Rule{ID: "fw-week-gcounter", Match: []rules.Match{{Key: rules.KeyAccount}},
			Algorithm: rules.FixedWindow, Limit: 70000, Burst: 70000, Calendar: rules.Week, Mode: rules.Enforce, Global: true, GCounter: true,
			Origin: "operator/bob", ExpiresAt: exp, Version: 1796040000002}},
		{Rule: rules.Rule{ID: "fw-month", Match: []rules.Match{{Key: rules.KeyOrg, Value: "acme"}},
			Algorithm: rules.FixedWindow, Limit: 1000000, Burst: 1000000, Calendar: rules.Month, Mode: rules.Enforce, FailureMode: rules.FailClosed,
			Origin: "operator/bob", ExpiresAt: exp, Version: 1796040000003}},
		{Rule: rules.Rule{ID: "conc-rolled-back", Match: []rules.Match{{Key: rules.KeyAPIKey}, {Key: rules.KeyUser}, {Key: rules.KeyTenant, Not: []string{"internal"}}, {Key: rules.KeyJA4}, {Key: rules.KeyMethod, Value: "POST"}},
			Algorithm: rules.Concurrency, Limit: 5, Period: 30 * time.Second, Burst: 5, Mode: rules.Shadow, ExactKeys: true,
			Origin: "detector/concurrency", Reason: "slow clients", ExpiresAt: exp, Version: 1796040000006}, RolledBack: true},
		{Rule: rules.Rule{ID: "fw-pinned-cidr", Match: []rules.Match{{Key: rules.KeyClientIP, CIDR: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}, Shared: true}},
			Algorithm: rules.FixedWindow, Limit: 600, Period: time.Hour, Burst: 600, Mode: rules.Enforce, Global: true, Pinned: true,
			Origin: "operator/carol", ExpiresAt: exp, Version: 1796040000005}},
	}
	m := map[string]*rules.DynamicRule{}
	for _, d := range ds {
		d.Created = v0Time
		m[d.ID] = d
	}
	return m
}

const v0Tag = "4ba12667cf0f32f8789c10bd8cb63ed7"

// TestStoredFormatsOfV0: the hashes as written before text enums (bare
// integers, Go field names; testdata/stored/v0-*.json), loaded into Redis
// byte for byte, read back unchanged: every dynamic rule, share and hot key.
func TestStoredFormatsOfV0(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	stored := loadStored(t, ctx, rdb, "v0-dynamic-rules.json", DynamicRulesKey)
	loadStored(t, ctx, rdb, "v0-shares.json", SharesKey)
	loadStored(t, ctx, rdb, "v0-hot-keys.json", HotKeysKey)
	st := NewStore(rdb)

	want := v0Dynamic()
	if len(stored) != len(want) {
		t.Fatalf("the fixture holds %d rules, the test expects %d", len(stored), len(want))
	}
	ds, err := st.Dynamic(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != len(want) {
		t.Errorf("read %d dynamic rules of %d", len(ds), len(want))
	}
	for _, d := range ds {
		if w := want[d.ID]; !reflect.DeepEqual(d, w) {
			t.Errorf("dynamic rule %s:\n got %+v\nwant %+v", d.ID, d, w)
		}
	}

	c, err := st.Load(ctx, v0Time)
	if err != nil {
		t.Fatal(err)
	}
	if c.Bad != 0 || len(c.Rules) != len(want) {
		t.Errorf("load: %d rules, %d bad; want %d and 0", len(c.Rules), c.Bad, len(want))
	}
	for _, r := range c.Rules {
		if w := want[r.ID]; w == nil || !reflect.DeepEqual(*r, w.Rule) {
			t.Errorf("loaded rule %s:\n got %+v\nwant %+v", r.ID, r, w)
		}
	}
	wantShares := map[string]rules.Share{
		"sw-promoted|": {RuleID: "sw-promoted", Region: "eu-west", Fraction: 0.6, Version: 1796040000000, ComputedAt: v0Time},
		"sw-promoted|" + v0Tag: {RuleID: "sw-promoted", Key: v0Tag, Region: "eu-west", Fraction: 0.25, Version: 1796040000000,
			ComputedAt: v0Time.Add(time.Second)},
	}
	if !reflect.DeepEqual(c.Shares, wantShares) {
		t.Errorf("shares:\n got %+v\nwant %+v", c.Shares, wantShares)
	}
	wantHot := map[string]rules.HotKey{
		"hh-tb-shadow|" + v0Tag: {RuleID: "hh-tb-shadow", Key: v0Tag, Lease: true, ExpiresAt: v0Time.Add(time.Hour)},
		"sw-promoted|" + v0Tag:  {RuleID: "sw-promoted", Key: v0Tag, Split: 4, ExpiresAt: v0Time.Add(time.Hour)},
	}
	if !reflect.DeepEqual(c.Hot, wantHot) {
		t.Errorf("hot keys:\n got %+v\nwant %+v", c.Hot, wantHot)
	}
}

// storedBareEnum finds an enum stored as an integer, or a Go field name as a key.
var storedBareEnum = regexp.MustCompile(`"(?i:algorithm|mode|failure_?mode|calendar|key)":\s*-?[0-9]|"[A-Z][A-Za-z]*":`)

// Writes store format 2: "format":2, enums by name, snake_case keys; a rule
// of format 1 is rewritten so by its next write (here Promote); Load and
// Dynamic read it back unchanged.
func TestStoredFormatWrites(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	loadStored(t, ctx, rdb, "v0-dynamic-rules.json", DynamicRulesKey)
	st := NewStore(rdb)
	if _, err := st.Promote(ctx, "hh-tb-shadow"); err != nil {
		t.Fatal(err)
	}
	r := rules.Rule{ID: "cal", Match: []rules.Match{{Key: rules.KeyTier, Value: "free"}}, Algorithm: rules.FixedWindow, Limit: 9, Calendar: rules.Month,
		Mode: rules.Shadow, FailureMode: rules.FailOpenUnlimited, Origin: "operator/alice", ExpiresAt: v0Time.Add(time.Hour)}
	if _, err := st.PutDynamic(ctx, v0Time, []rules.Rule{r}); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string][]string{
		"hh-tb-shadow": {`{"format":2,"id":"hh-tb-shadow",`, `"algorithm":"token_bucket"`, `"mode":"enforce"`, `"failure_mode":"closed"`,
			`"prev":{"id":"hh-tb-shadow"`, `"mode":"shadow"`, `"key":"client_ip"`},
		"cal": {`{"format":2,"id":"cal",`, `"algorithm":"fixed_window"`, `"calendar":"month"`, `"mode":"shadow"`, `"failure_mode":"open_unlimited"`},
	} {
		v, err := rdb.HGet(ctx, DynamicRulesKey, id).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range want {
			if !strings.Contains(v, w) {
				t.Errorf("%s: %s lacks %s", id, v, w)
			}
		}
		if m := storedBareEnum.FindString(v); m != "" {
			t.Errorf("%s: %s has %s", id, v, m)
		}
	}
	ds, err := st.Dynamic(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := v0Dynamic()
	hh := want["hh-tb-shadow"]
	prev := hh.Rule
	hh.Previous, hh.Mode, hh.Version = &prev, rules.Enforce, prev.Version+1
	r.Burst = r.Limit
	want["cal"] = &rules.DynamicRule{Rule: r, Created: v0Time}
	if len(ds) != len(want) {
		t.Errorf("%d rules, want %d", len(ds), len(want))
	}
	for _, d := range ds {
		if !reflect.DeepEqual(d, want[d.ID]) {
			t.Errorf("%s:\n got %+v\nwant %+v", d.ID, d, want[d.ID])
		}
	}
}

// A stored rule of an unknown format, or with an unknown enum name or
// integer, is counted bad and skipped; the others load.
func TestStoredFormatBad(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := NewStore(rdb)
	good := rules.Rule{ID: "ok", Match: []rules.Match{{Key: rules.KeyASN}}, Limit: 1, Period: time.Second, Origin: "o", ExpiresAt: v0Time.Add(time.Hour)}
	if _, err := st.PutDynamic(ctx, v0Time, []rules.Rule{good}); err != nil {
		t.Fatal(err)
	}
	v, _ := rdb.HGet(ctx, DynamicRulesKey, "ok").Result()
	for id, bad := range map[string]string{
		"f3":      strings.Replace(v, `"format":2`, `"format":3`, 1),
		"name":    strings.Replace(v, `"algorithm":"token_bucket"`, `"algorithm":"leaky_bucket"`, 1),
		"int":     strings.Replace(v, `"algorithm":"token_bucket"`, `"algorithm":7`, 1),
		"mode":    strings.Replace(v, `"mode":"enforce"`, `"mode":"Enforce"`, 1),
		"failure": strings.Replace(v, `"failure_mode":"open"`, `"FailureMode":3`, 1),
	} {
		if bad == v {
			t.Fatalf("%s: no change to %s", id, v)
		}
		rdb.HSet(ctx, DynamicRulesKey, id, strings.Replace(bad, `"id":"ok"`, `"id":"`+id+`"`, 1))
	}
	c, err := st.Load(ctx, v0Time)
	if err != nil || c.Bad != 5 || ids(c.Rules) != "ok" {
		t.Errorf("load: %v, %d bad, rules %s; want 5 bad and ok", err, c.Bad, ids(c.Rules))
	}
	if _, err := st.Promote(ctx, "int"); err == nil || !strings.Contains(err.Error(), "algorithm 7") {
		t.Errorf("promote a rule with algorithm 7: %v", err)
	}
}
