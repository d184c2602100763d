package sidecar

import (
	"fmt"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/rules"
)

func TestCurrentLimit(t *testing.T) {
	const (
		sec   = rlsv3.RateLimitResponse_RateLimit_SECOND
		min   = rlsv3.RateLimitResponse_RateLimit_MINUTE
		day   = rlsv3.RateLimitResponse_RateLimit_DAY
		wk    = rlsv3.RateLimitResponse_RateLimit_WEEK
		mon   = rlsv3.RateLimitResponse_RateLimit_MONTH
		yr    = rlsv3.RateLimitResponse_RateLimit_YEAR
		unkwn = rlsv3.RateLimitResponse_RateLimit_UNKNOWN
	)
	rule := func(alg rules.Algorithm, limit, burst int64, period time.Duration) *rules.Rule {
		return &rules.Rule{ID: "r", Algorithm: alg, Limit: limit, Burst: burst, Period: period}
	}
	for _, c := range []struct {
		name    string
		r       *rules.Rule
		capac   int64 // Status.Limit: the capacity in this region
		perUnit uint32
		unit    rlsv3.RateLimitResponse_RateLimit_Unit
	}{
		{"one unit: the rate, not the burst", rule(rules.TokenBucket, 10, 20, time.Second), 20, 10, sec},
		{"a minute", rule(rules.SlidingWindow, 100, 100, time.Minute), 100, 100, min},
		{"30 days are a month", rule(rules.FixedWindow, 7, 7, 720*time.Hour), 7, 7, mon},
		{"365 days are a year", rule(rules.FixedWindow, 7, 7, 365*24*time.Hour), 7, 7, yr},
		{"90 s: per minute, rounded down", rule(rules.FixedWindow, 100, 100, 90*time.Second), 100, 66, min},
		{"13 s rounds to 0 per second: per minute", rule(rules.TokenBucket, 10, 10, 13*time.Second), 10, 46, min},
		{"36 h: per week", rule(rules.SlidingWindow, 1, 1, 36*time.Hour), 1, 4, wk},
		{"sub-second: per second", rule(rules.TokenBucket, 5, 5, 250*time.Millisecond), 5, 20, sec},
		{"two years: at least 1 per year", rule(rules.FixedWindow, 1, 1, 2*365*24*time.Hour), 1, 1, yr},
		{"a region's share of a global bucket", rule(rules.TokenBucket, 20, 40, time.Second), 13, 6, sec},
		{"calendar day", &rules.Rule{ID: "r", Algorithm: rules.FixedWindow, Limit: 1000, Burst: 1000, Calendar: rules.Day}, 1000, 1000, day},
		{"calendar week", &rules.Rule{ID: "r", Algorithm: rules.FixedWindow, Limit: 9, Burst: 9, Calendar: rules.Week}, 9, 9, wk},
		{"calendar month", &rules.Rule{ID: "r", Algorithm: rules.FixedWindow, Limit: 9, Burst: 9, Calendar: rules.Month}, 9, 9, mon},
		{"concurrency", rule(rules.Concurrency, 10, 10, 30*time.Second), 10, 10, unkwn},
	} {
		n, u := currentLimit(&enforcer.Status{Rule: c.r, Limit: c.capac})
		if n != c.perUnit || u != c.unit {
			t.Errorf("%s: %d per %v, want %d per %v", c.name, n, u, c.perUnit, c.unit)
		}
	}
}

func TestKeyFor(t *testing.T) {
	for k, want := range map[string]rules.Key{
		"remote_address": rules.KeyClientIP, "masked_remote_address": rules.KeyClientIP, "client_ip": rules.KeyClientIP,
		"user_id": rules.KeyUser, "tenant_id": rules.KeyTenant, "x-api-key": rules.KeyAPIKey, "api-key": rules.KeyAPIKey,
		":path": rules.KeyPath, ":method": rules.KeyMethod, "route": rules.KeyRoute, "asn": rules.KeyASN, "ja4": rules.KeyJA4,
	} {
		if got, ok := KeyFor(k); !ok || got != want {
			t.Errorf("KeyFor(%q) = %v %v, want %v", k, got, ok, want)
		}
	}
	for i := range rules.NumKeys { // every rule-file name maps to itself
		if got, ok := KeyFor(i.String()); !ok || got != i {
			t.Errorf("KeyFor(%q) = %v %v", i.String(), got, ok)
		}
	}
	for _, k := range []string{"generic_key", "User", "X-Api-Key", "destination_cluster"} { // custom keys, by name
		if got, ok := KeyFor(k); !ok || got != rules.KeyCustom {
			t.Errorf("KeyFor(%q) = %v %v, want a custom key", k, got, ok)
		}
	}
	for _, k := range []string{"", "a b", "x\x00"} {
		if _, ok := KeyFor(k); ok {
			t.Errorf("KeyFor(%q) mapped", k)
		}
	}
}

func TestOverrideEntitiesDoNotCollide(t *testing.T) {
	entity := func(domain string, kv ...string) string {
		d := &ratelimitv3.RateLimitDescriptor{}
		for i := 0; i+1 < len(kv); i += 2 {
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		return overrideEntity(new(scratch), domain, d)
	}
	seen := map[string]string{}
	for _, c := range [][]string{
		{"d", "a", "b.c"}, {"d", "a.b", "c"}, {"d", "a", "bc"}, {"d", "ab", "c"}, {"da", "", "bc"}, {"d", "a", "b", "c", ""},
		{"d", "a", "b"}, {"d.a", "b", ""}, {"e", "a", "b"},
	} {
		e := entity(c[0], c[1:]...)
		if prev, ok := seen[e]; ok {
			t.Errorf("%q and %s share the entity %q", c, prev, e)
		}
		seen[e] = fmt.Sprint(c)
	}
}

// A user_agent (or user-agent) entry is not a descriptor: it goes to the
// request's UserAgent, for the decision record, and the rest of its
// descriptor still maps.
func TestUserAgentEntry(t *testing.T) {
	for _, key := range []string{"user_agent", "User-Agent"} {
		sc := new(scratch)
		in := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
			{Key: "remote_address", Value: "192.0.2.1"}, {Key: key, Value: "curl/8.4.0"}}}}}
		unmatched, err := toRequest(in, "d", sc)
		if err != nil || unmatched != 0 {
			t.Fatalf("%s: %v, %d unmatched", key, err, unmatched)
		}
		if sc.req.UserAgent != "curl/8.4.0" || sc.req.Parts[0].Descriptors[rules.KeyClientIP] != "192.0.2.1" {
			t.Fatalf("%s: user agent %q, descriptors %v", key, sc.req.UserAgent, sc.req.Parts[0].Descriptors)
		}
	}
}

// The user agent and the request id are taken from a descriptor even
// after an entry that keeps it from mapping (which then matches no rule).
func TestUserAgentAndRequestIDAfterAnUnmappableEntry(t *testing.T) {
	sc := new(scratch)
	in := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
		{Key: "remote_address", Value: "192.0.2.1"}, {Key: "bad key", Value: "x"}, {Key: "request_id", Value: "r-1"}, {Key: "user-agent", Value: "curl/8.4.0"}}}}}
	unmatched, err := toRequest(in, "d", sc)
	if err != nil || unmatched != 1 {
		t.Fatalf("%v, %d unmatched, want 1", err, unmatched)
	}
	if sc.req.RequestID != "r-1" || sc.req.UserAgent != "curl/8.4.0" || sc.req.Parts[0].Descriptors != (rules.Descriptors{}) {
		t.Fatalf("request id %q, user agent %q, descriptors %v", sc.req.RequestID, sc.req.UserAgent, sc.req.Parts[0].Descriptors)
	}
}
