package enforcer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

// The rule model as the limiter applies it: blocking rules, replaces,
// dynamic rules that never loosen a static one and lapse at their TTL, and
// rule sets swapped under load.

func TestBlockingRules(t *testing.T) {
	l := newLimiter(t, redistest.Server(t), `
domain: api
rules:
  - {id: blocked-net, match: [{key: client_ip, cidr: 203.0.113.0/24}], limit: 0, period: 1s}
  - {id: trial-block, mode: shadow, match: [{key: client_ip, cidr: 198.51.100.0/24}], limit: 0, period: 1m}
  - {id: per-user, match: [{key: user}], limit: 2, period: 1m}
`)
	req := func(ip string) *enforcer.Request {
		r := &enforcer.Request{Now: at(0)}
		r.Descriptors[rules.KeyClientIP], r.Descriptors[rules.KeyUser] = ip, "u-"+ip
		return r
	}
	trips := l.RoundTrips()
	d := decide(t, l, req("203.0.113.9"))
	if d.Outcome != decision.Denied || d.Reason != decision.ReasonBlocked || d.Rule.ID != "blocked-net" || d.Path != decision.PathBlocked {
		t.Fatalf("blocked network: %v %v %v %v, want denied, blocked, by blocked-net", d.Outcome, d.Reason, d.Rule, d.Path)
	}
	if d.RetryAfter != 0 || d.Limit != 0 || d.Remaining != 0 || d.Reset != time.Second {
		t.Errorf("blocked: retry-after %v limit %d remaining %d reset %v; want no retry-after, 0, 0 and the period", d.RetryAfter, d.Limit, d.Remaining, d.Reset)
	}
	if l.RoundTrips() != trips {
		t.Errorf("a blocking rule called Redis")
	}
	// Waiting never helps: no reset is announced, and the reason is said.
	h := http.Header{}
	d.WriteHeaders(h, enforcer.AllHeaders)
	want := http.Header{"Ratelimit": {`"blocked-net";r=0`}, "Ratelimit-Policy": {`"blocked-net";q=0;w=1`},
		"X-Ratelimit-Limit": {"0"}, "X-Ratelimit-Remaining": {"0"}, "Sluice-Reason": {"blocked"}}
	if !reflect.DeepEqual(h, want) {
		t.Errorf("blocked: headers %v, want %v (no reset, no Retry-After)", h, want)
	}
	// Nothing else was charged: per-user still has both tokens.
	if d := decide(t, l, req("192.0.2.1")); d.Remaining != 1 {
		t.Errorf("per-user remaining %d, want 1", d.Remaining)
	}
	// A shadow block would deny; the request goes on to the other rules.
	d = decide(t, l, req("198.51.100.4"))
	if d.Outcome != decision.ShadowDenied || d.Shadow == nil || d.Shadow.ID != "trial-block" || d.Remaining != 1 {
		t.Errorf("shadow block: %v shadow %v remaining %d, want shadow_denied by trial-block with per-user charged", d.Outcome, d.Shadow, d.Remaining)
	}
	decide(t, l, req("198.51.100.4"))
	d = decide(t, l, req("198.51.100.4"))
	if d.Outcome != decision.Denied || d.Rule.ID != "per-user" || d.Shadow == nil || d.Shadow.ID != "trial-block" {
		t.Errorf("per-user over its limit behind a shadow block: %v by %v (shadow %v)", d.Outcome, d.Rule, d.Shadow)
	}
}

// TestCostBeyondCapacityAnnouncesNoReset: a request costing more than its
// rule holds is denied with no wait that would admit it: no Retry-After, no
// reset (a full bucket's reset is 0 s, which would send a client straight
// back), and Sluice-Reason saying why.
func TestCostBeyondCapacityAnnouncesNoReset(t *testing.T) {
	l := newLimiter(t, redistest.Server(t), `
domain: api
rules:
  - {id: per-ip, match: [{key: client_ip}], limit: 20, period: 1m}
`)
	r := &enforcer.Request{Now: at(0), Cost: 21}
	r.Descriptors[rules.KeyClientIP] = "192.0.2.222"
	d := decide(t, l, r)
	if d.Outcome != decision.Denied || d.Reason != decision.ReasonCostExceedsCapacity || d.RetryAfter != 0 {
		t.Fatalf("cost 21 of 20: %v %v retry-after %v, want denied, cost exceeds capacity, no retry-after", d.Outcome, d.Reason, d.RetryAfter)
	}
	h := http.Header{}
	d.WriteHeaders(h, enforcer.AllHeaders)
	want := http.Header{"Ratelimit": {`"per-ip";r=20`}, "Ratelimit-Policy": {`"per-ip";q=20;w=60`},
		"X-Ratelimit-Limit": {"20"}, "X-Ratelimit-Remaining": {"20"}, "Sluice-Reason": {"cost_exceeds_capacity"}}
	if !reflect.DeepEqual(h, want) {
		t.Errorf("headers %v, want %v (no reset, no Retry-After)", h, want)
	}
	// A cost the bucket holds still announces its reset.
	r = &enforcer.Request{Now: at(0), Cost: 20}
	r.Descriptors[rules.KeyClientIP] = "192.0.2.222"
	d = decide(t, l, r)
	h = http.Header{}
	d.WriteHeaders(h, enforcer.AllHeaders)
	if d.Outcome != decision.Allowed || h.Get("X-Ratelimit-Reset") == "" || h.Get("Sluice-Reason") != "" {
		t.Errorf("cost 20 of 20: %v, headers %v; want allowed with a reset and no reason", d.Outcome, h)
	}
}

func TestReplacesAcrossParts(t *testing.T) {
	l := newLimiter(t, redistest.Server(t), `
domain: api
rules:
  - {id: tier-pro, match: [{key: tier, value: pro}, {key: api_key}], limit: 2, period: 1m}
  - {id: acme-contract, replaces: [tier-pro], match: [{key: account, value: acme}], limit: 5, period: 1m}
`)
	req := func(key, account string) *enforcer.Request {
		r := &enforcer.Request{Now: at(0)}
		r.Descriptors[rules.KeyAPIKey], r.Descriptors[rules.KeyTier], r.Descriptors[rules.KeyAccount] = key, "pro", account
		return r
	}
	for i := range 5 {
		if d := decide(t, l, req("k1", "acme")); d.Outcome != decision.Allowed || len(d.Statuses) != 1 || d.Statuses[0].Rule.ID != "acme-contract" {
			t.Fatalf("request %d of the enterprise customer: %v %v, want allowed by acme-contract alone", i, d.Outcome, d.Statuses)
		}
	}
	if d := decide(t, l, req("k1", "acme")); d.Outcome != decision.Denied || d.Rule.ID != "acme-contract" {
		t.Errorf("6th: %v by %v, want denied by acme-contract", d.Outcome, d.Rule)
	}
	// Another pro customer keeps the tier's limit; the override's part in
	// another descriptor replaces it too (envoyproxy/ratelimit's replaces
	// works across a request's descriptors).
	decide(t, l, req("k2", "other"))
	decide(t, l, req("k2", "other"))
	if d := decide(t, l, req("k2", "other")); d.Outcome != decision.Denied || d.Rule.ID != "tier-pro" {
		t.Errorf("a pro customer's 3rd: %v by %v, want denied by tier-pro", d.Outcome, d.Rule)
	}
	two := &enforcer.Request{Now: at(0), Parts: []enforcer.Part{
		{Descriptors: rules.Descriptors{rules.KeyAPIKey: "k2", rules.KeyTier: "pro"}},
		{Descriptors: rules.Descriptors{rules.KeyAccount: "acme"}},
	}}
	if d := decide(t, l, two); d.Outcome != decision.Denied || d.Rule.ID != "acme-contract" {
		t.Errorf("override in another part: %v by %v, want tier-pro replaced and acme-contract (spent) denying", d.Outcome, d.Rule)
	}
}

// allowedThenNext decides n requests of user u, at 0 to n-1 ms, failing
// unless each is allowed, and returns the decision of the next, at n ms.
func allowedThenNext(t *testing.T, l *enforcer.Limiter, n int, u string) enforcer.Decision {
	t.Helper()
	for i := range n {
		if d := decide(t, l, userReq(int64(i), 1, u)); d.Outcome != decision.Allowed {
			t.Fatalf("request %d: %v", i, d.Outcome)
		}
	}
	return decide(t, l, userReq(int64(n), 1, u))
}

// dynamic writes dynamic rules into the limiter's Redis and refreshes.
func dynamic(t *testing.T, l *enforcer.Limiter, st *store.Store, now time.Time, rs ...rules.Rule) {
	t.Helper()
	if err := st.PutRules(context.Background(), rs); err != nil {
		t.Fatal(err)
	}
	if err := l.Refresh(context.Background(), now); err != nil {
		t.Fatal(err)
	}
}

func dynRule(id string, limit int64, expires time.Time, m ...rules.Match) rules.Rule {
	return rules.Rule{ID: id, Match: m, Limit: limit, Period: time.Minute, Origin: "operator", Reason: "test", ExpiresAt: expires}
}

// perUserLimiter is a limiter of one static rule, per-user at 3 a minute,
// on a Redis of its own, and its metrics.
func perUserLimiter(t *testing.T) (redis.UniversalClient, *prometheus.Registry, *enforcer.Limiter) {
	t.Helper()
	rdb := redistest.Server(t)
	reg := prometheus.NewRegistry()
	l, err := enforcer.New(rdb, mustSet(t, "domain: api\nrules: [{id: per-user, match: [{key: user}], limit: 3, period: 1m}]"),
		enforcer.Options{Budget: time.Second, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return rdb, reg, l
}

func TestDynamicRulesNeverLoosen(t *testing.T) {
	rdb, reg, l := perUserLimiter(t)
	st := store.NewStore(rdb)
	exp := at(0).Add(time.Hour)
	// A looser dynamic rule on the same entity, one that takes the static
	// rule's id, and one that would replace it.
	dynamic(t, l, st, at(0),
		dynRule("loose", 1000, exp, rules.Match{Key: rules.KeyUser}),
		dynRule("per-user", 1000, exp, rules.Match{Key: rules.KeyUser}),
	)
	rep := dynRule("replacer", 1000, exp, rules.Match{Key: rules.KeyUser})
	rep.Replaces = []string{"per-user"}
	if err := st.PutRules(context.Background(), []rules.Rule{rep}); !errors.Is(err, rules.ErrInvalidRule) {
		t.Errorf("the store took a dynamic rule that replaces: %v", err)
	}
	// Written past the store's check, the enforcer refuses it too.
	b, err := json.Marshal(&rep)
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(context.Background(), store.DynamicRulesKey, rep.ID, b).Err(); err != nil {
		t.Fatal(err)
	}
	if err := l.Refresh(context.Background(), at(0)); err != nil {
		t.Fatal(err)
	}
	if n := len(l.Control().Rules); n != 3 {
		t.Fatalf("%d dynamic rules loaded, want 3", n)
	}
	d := allowedThenNext(t, l, 3, "u")
	if d.Outcome != decision.Denied || d.Rule.ID != "per-user" {
		t.Errorf("4th request: %v by %v; the static limit of 3 must hold", d.Outcome, d.Rule)
	}
	for _, s := range d.Statuses {
		if s.Rule.ID == "replacer" || (s.Rule.ID == "per-user" && s.Rule.Dynamic()) {
			t.Errorf("a loosening dynamic rule applied: %s", s.Rule.ID)
		}
	}
	if got := testutil.ToFloat64(metricWith(t, reg, "sluice_enforcer_dynamic_rules_refused")); got != 2 {
		t.Errorf("refused dynamic rules gauge %v, want 2", got)
	}
}

func TestDynamicRuleLapsesAtItsTTL(t *testing.T) {
	rdb := redistest.Server(t)
	l := newLimiter(t, rdb, "domain: api\nrules: [{id: per-user, match: [{key: user}], limit: 100, period: 1m}]")
	st := store.NewStore(rdb)
	dynamic(t, l, st, at(0), dynRule("hammer", 1, at(10_000), rules.Match{Key: rules.KeyUser, Value: "bot"}))
	if d := decide(t, l, userReq(1, 1, "bot")); d.Outcome != decision.Allowed {
		t.Fatalf("first: %v", d.Outcome)
	}
	if d := decide(t, l, userReq(2, 1, "bot")); d.Outcome != decision.Denied || d.Rule.ID != "hammer" {
		t.Fatalf("second: %v by %v, want denied by the dynamic rule", d.Outcome, d.Rule)
	}
	if d := decide(t, l, userReq(9_999, 1, "bot")); d.Outcome != decision.Denied {
		t.Errorf("1 ms before the TTL: %v, want denied", d.Outcome)
	}
	// No refresh in between: the rule lapses at ExpiresAt by itself.
	if d := decide(t, l, userReq(10_000, 1, "bot")); d.Outcome != decision.Allowed || len(d.Statuses) != 1 {
		t.Errorf("at the TTL: %v with %d rules, want allowed by the static rule alone", d.Outcome, len(d.Statuses))
	}
}

func TestDynamicKillSwitchOption(t *testing.T) {
	rdb := redistest.Server(t)
	l, err := enforcer.New(rdb, mustSet(t, "domain: api\nrules: [{id: per-user, match: [{key: user}], limit: 100, period: 1m}]"),
		enforcer.Options{Budget: time.Second, NoDynamic: true})
	if err != nil {
		t.Fatal(err)
	}
	dynamic(t, l, store.NewStore(rdb), at(0), dynRule("hammer", 1, at(60_000), rules.Match{Key: rules.KeyUser}))
	for i := range 3 {
		if d := decide(t, l, userReq(int64(i), 1, "bot")); d.Outcome != decision.Allowed || len(d.Statuses) != 1 {
			t.Fatalf("request %d: %v with %d rules; NoDynamic must leave dynamic rules out", i, d.Outcome, len(d.Statuses))
		}
	}
}

// TestConcurrentReloads swaps static rule sets and refreshes dynamic rules
// while 8 goroutines decide requests. Every version's rules carry its
// number, and each decision must see the rules of one version only: never
// half of one and half of another. Run under -race (make test).
func TestConcurrentReloads(t *testing.T) {
	rdb := redistest.Server(t)
	set := func(v int) *rules.Set {
		s, err := rules.Parse("v.yaml", fmt.Appendf(nil, `
version: %[1]d
domain: api
rules:
  - {id: a-v%[1]d, match: [{key: user}], limit: 1000000, period: 1s}
  - {id: b-v%[1]d, match: [{key: route, prefix: /}], limit: 1000000, period: 1s}
  - {id: c-v%[1]d, match: [{key: client_ip, cidr: 10.0.0.0/8}], limit: 1000000, period: 1s}
`, v))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	l := newLimiter(t, rdb, "domain: api\nrules: [{id: a-v0, match: [{key: user}], limit: 1000000, period: 1s}, {id: b-v0, match: [{key: route, prefix: /}], limit: 1000000, period: 1s}, {id: c-v0, match: [{key: client_ip, cidr: 10.0.0.0/8}], limit: 1000000, period: 1s}]")
	st := store.NewStore(rdb)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var decisions, torn atomic.Int64
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var d enforcer.Decision
			r := &enforcer.Request{}
			r.Descriptors[rules.KeyUser], r.Descriptors[rules.KeyRoute], r.Descriptors[rules.KeyClientIP] = fmt.Sprint("u", g), "/x", "10.1.2.3"
			for ctx.Err() == nil {
				if err := l.Decide(context.Background(), r, &d); err != nil {
					t.Error(err)
					return
				}
				decisions.Add(1)
				version := ""
				static := 0
				for _, s := range d.Statuses {
					if s.Rule.Dynamic() {
						continue
					}
					static++
					v := s.Rule.ID[strings.Index(s.Rule.ID, "-v")+2:]
					if version != "" && v != version {
						torn.Add(1)
					}
					version = v
				}
				if static != 3 {
					torn.Add(1)
				}
			}
		}()
	}
	swaps := 0
	for v := 1; ctx.Err() == nil; v++ {
		l.SetRules(set(v))
		if v%10 == 0 {
			dynamic(t, l, st, time.Now(), dynRule(fmt.Sprint("dyn-", v%50), 1_000_000, time.Now().Add(time.Hour), rules.Match{Key: rules.KeyUser}))
		}
		swaps++
	}
	wg.Wait()
	if torn.Load() != 0 {
		t.Errorf("%d of %d decisions saw a torn rule set", torn.Load(), decisions.Load())
	}
	if decisions.Load() < 100 || swaps < 10 {
		t.Errorf("only %d decisions across %d swaps: the test did not exercise reloads", decisions.Load(), swaps)
	}
	t.Logf("%d decisions across %d swaps", decisions.Load(), swaps)
}

// TestTiersFromTheKeyStore: an API key's account, organisation and tier come
// from the key store, and the key, account and organisation limits are
// checked together, so an organisation's many keys share its limit.
func TestTiersFromTheKeyStore(t *testing.T) {
	rdb := redistest.Server(t)
	ks := store.NewRedisKeys(rdb)
	ctx := context.Background()
	for _, k := range []struct{ key, account string }{{"k1", "acme-eu"}, {"k2", "acme-eu"}, {"k3", "acme-us"}, {"k4", "solo"}} {
		if err := ks.PutKey(ctx, k.key, k.account); err != nil {
			t.Fatal(err)
		}
	}
	for _, a := range [][3]string{{"acme-eu", "acme", "enterprise"}, {"acme-us", "acme", "enterprise"}, {"solo", "", "free"}} {
		if err := ks.PutAccount(ctx, a[0], a[1], a[2]); err != nil {
			t.Fatal(err)
		}
	}
	var recs []decision.Record
	sink := sinkFunc(func(r decision.Record) { recs = append(recs, r) })
	l, err := enforcer.New(rdb, mustSet(t, `
domain: api
rules:
  - {id: tier-free, match: [{key: tier, value: free}, {key: api_key}], limit: 2, period: 1m}
  - {id: tier-enterprise, match: [{key: tier, value: enterprise}, {key: api_key}], limit: 100, period: 1m}
  - {id: per-account, match: [{key: account}], limit: 5, period: 1m}
  - {id: per-org, match: [{key: org}], limit: 6, period: 1m}
`), enforcer.Options{Budget: time.Second, Keys: store.NewKeyCache(ks, 0, 0), Sink: sink})
	if err != nil {
		t.Fatal(err)
	}
	key := func(k string) *enforcer.Request {
		r := &enforcer.Request{Now: at(0)}
		r.Descriptors[rules.KeyAPIKey] = k
		return r
	}
	// A free key: its tier's limit of 2.
	decide(t, l, key("k4"))
	d := decide(t, l, key("k4"))
	if d.Outcome != decision.Allowed || len(d.Statuses) != 2 {
		t.Fatalf("free key: %v with %d rules, want allowed by tier-free and per-account", d.Outcome, len(d.Statuses))
	}
	if d := decide(t, l, key("k4")); d.Outcome != decision.Denied || d.Rule.ID != "tier-free" {
		t.Errorf("free key, 3rd: %v by %v, want denied by tier-free", d.Outcome, d.Rule)
	}
	// Two accounts of one organisation, three keys: the organisation's 6
	// hold across all of them, the account's 5 across its two keys.
	allowed := map[string]int{}
	for i := range 12 {
		k := []string{"k1", "k2", "k3"}[i%3]
		if d := decide(t, l, key(k)); d.Outcome == decision.Allowed {
			allowed[k]++
		}
	}
	if n := allowed["k1"] + allowed["k2"] + allowed["k3"]; n != 6 {
		t.Errorf("organisation allowed %d across 3 keys (%v), want its limit of 6", n, allowed)
	}
	if n := allowed["k1"] + allowed["k2"]; n > 5 {
		t.Errorf("account acme-eu allowed %d across 2 keys, more than its 5", n)
	}
	// An unknown key gets no tier (no tier rule), and the record carries
	// what the key store said.
	if d := decide(t, l, key("nobody")); d.Outcome != decision.Allowed || len(d.Statuses) != 0 {
		t.Errorf("unknown key: %v with %v", d.Outcome, d.Statuses)
	}
	if r := recs[0]; r.Descriptors[rules.KeyAccount] != "solo" || r.Descriptors[rules.KeyTier] != "free" {
		t.Errorf("record: account %q tier %q, want solo and free", r.Descriptors[rules.KeyAccount], r.Descriptors[rules.KeyTier])
	}
}

// TestDynamicKillSwitchAndCap: the kill switch in Redis takes every dynamic
// rule out at the next refresh and puts them back when turned off; an
// enforcer applies at most DynamicCap dynamic rules, the first created.
func TestDynamicKillSwitchAndCap(t *testing.T) {
	rdb := redistest.Server(t)
	reg := prometheus.NewRegistry()
	l, err := enforcer.New(rdb, mustSet(t, "domain: api\nrules: [{id: per-user, match: [{key: user}], limit: 100, period: 1m}]"),
		enforcer.Options{Budget: time.Second, DynamicCap: 2, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	st := store.NewStore(rdb)
	ctx := context.Background()
	exp := time.Now().Add(time.Hour)
	for _, id := range []string{"first", "second", "third"} {
		dynamic(t, l, st, time.Now(), dynRule(id, 1, exp, rules.Match{Key: rules.KeyUser}))
	}
	matched := func() []string {
		d := decide(t, l, userReq(0, 1, fmt.Sprint("u", time.Now().UnixNano())))
		var got []string
		for _, s := range d.Statuses {
			got = append(got, s.Rule.ID)
		}
		return got
	}
	if got := matched(); strings.Join(got, ",") != "per-user,first,second" {
		t.Errorf("with a cap of 2: %v, want the static rule and the first two dynamic rules", got)
	}
	if got := testutil.ToFloat64(metricWith(t, reg, "sluice_enforcer_dynamic_rules_over_cap")); got != 1 {
		t.Errorf("over-cap gauge %v, want 1", got)
	}
	if err := st.SetKill(ctx, true, "test"); err != nil {
		t.Fatal(err)
	}
	if err := l.Refresh(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	if got := matched(); strings.Join(got, ",") != "per-user" {
		t.Errorf("kill switch on: %v, want the static rule alone", got)
	}
	if got := testutil.ToFloat64(metricWith(t, reg, "sluice_enforcer_dynamic_rules_killed")); got != 1 {
		t.Errorf("kill gauge %v, want 1", got)
	}
	if err := st.SetKill(ctx, false, ""); err != nil {
		t.Fatal(err)
	}
	if err := l.Refresh(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	if got := matched(); len(got) != 3 {
		t.Errorf("kill switch off: %v, want the dynamic rules back", got)
	}
}

// TestShadowOverrideKeepsTheLimit: an override tried in shadow mode does not
// lift the rule it would replace.
func TestShadowOverrideKeepsTheLimit(t *testing.T) {
	l := newLimiter(t, redistest.Server(t), `
domain: api
rules:
  - {id: tier-pro, match: [{key: tier, value: pro}, {key: api_key}], limit: 2, period: 1m}
  - {id: acme-trial, mode: shadow, replaces: [tier-pro], match: [{key: account, value: acme}], limit: 5, period: 1m}
`)
	r := &enforcer.Request{Now: at(0)}
	r.Descriptors[rules.KeyAPIKey], r.Descriptors[rules.KeyTier], r.Descriptors[rules.KeyAccount] = "k1", "pro", "acme"
	decide(t, l, r)
	decide(t, l, r)
	if d := decide(t, l, r); d.Outcome != decision.Denied || d.Rule.ID != "tier-pro" {
		t.Errorf("3rd request: %v by %v, want tier-pro still enforced under a shadow override", d.Outcome, d.Rule)
	}
}

// TestTooManyDynamicRules: found by a fresh user. 66 shadow dynamic rules
// on one client made its requests match more than MaxRules rules, and the
// request was refused (400): behind a gateway that lets the rate limit
// service's errors through, every limit of that client, the static ones
// included, stopped applying. Dynamic rules past the cap are left out
// instead, shadow ones first, and counted; the static rule and an
// enforcing dynamic rule still decide.
func TestTooManyDynamicRules(t *testing.T) {
	rdb, reg, l := perUserLimiter(t)
	exp := at(0).Add(time.Hour)
	var rs []rules.Rule
	for i := range enforcer.MaxRules + 2 {
		r := dynRule(fmt.Sprint("shadow-", i), int64(1000+i), exp, rules.Match{Key: rules.KeyUser})
		r.Mode = rules.Shadow
		rs = append(rs, r)
	}
	rs = append(rs, dynRule("tight", 2, exp, rules.Match{Key: rules.KeyUser}))
	dynamic(t, l, store.NewStore(rdb, store.DynamicCap(1000)), at(0), rs...)
	if n := len(l.Control().Rules); n != len(rs) {
		t.Fatalf("%d dynamic rules loaded, want %d", n, len(rs))
	}
	d := allowedThenNext(t, l, 2, "u")
	if d.Outcome != decision.Denied || d.Rule.ID != "tight" {
		t.Errorf("3rd request: %v by %v, want denied by the enforcing dynamic rule (limit 2)", d.Outcome, d.Rule)
	}
	if n := len(d.Statuses); n != enforcer.MaxRules {
		t.Errorf("%d rules decided, want %d", n, enforcer.MaxRules)
	}
	found := false
	for _, s := range d.Statuses {
		found = found || s.Rule.ID == "per-user"
	}
	if !found {
		t.Error("the static rule was left out")
	}
	// 68 matched, 64 decided: 4 left out per request, 3 requests.
	if got := seriesValue(t, reg, "sluice_enforcer_dynamic_rules_left_out_total"); got != 3*4 {
		t.Errorf("sluice_enforcer_dynamic_rules_left_out_total %v, want 12", got)
	}
}
