package sidecar_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/enforcer/sidecar"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/internal/storetest"
	"github.com/sluice-rl/sluice/rules"
)

// usageRules: a key's token bucket of 10 that refills one a minute (so it
// does not move while a test runs), its account's daily quota, and a rule
// over the whole gold tier, whose count other customers share.
const usageRules = `
domain: t
rules:
  - id: per-key
    description: bursts of 10, then one request a minute
    match: [{key: api_key}]
    limit: 1
    period: 1m
    burst: 10
  - id: per-account
    description: the account's hourly quota
    match: [{key: account}]
    algorithm: fixed_window
    limit: 1000
    period: 1h
  - id: gold-tier
    match: [{key: tier, value: gold}]
    limit: 100000
    period: 1h
  - id: trial
    description: an operator's trial in shadow mode
    match: [{key: api_key}]
    limit: 1
    period: 1h
    mode: shadow
`

// usageEnv is a sidecar with a key store: key-a of account acme (gold,
// org initech), key-b and key-c of account globex (free).
type usageEnv struct {
	srv   *sidecar.Server
	lim   *enforcer.Limiter
	http  *httptest.Server
	rdb   *redis.Client
	trips *atomic.Int64 // Redis round trips of the sidecar's client
}

// tripCounter counts a client's round trips: each command or pipeline.
type tripCounter struct{ n *atomic.Int64 }

func (h tripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h tripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h tripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}

func newUsageEnv(t *testing.T, o sidecar.UsageOptions, mods ...func(*enforcer.Options)) *usageEnv {
	t.Helper()
	rdb := redistest.Server(t)
	storetest.PutKeys(t, rdb, map[string]string{"key-a": "acme", "key-b": "globex", "key-c": "globex"},
		map[string]storetest.Account{"acme": {Org: "initech", Tier: "gold"}, "globex": {Tier: "free"}})
	// The sidecar's own client, counted.
	c := redis.NewClient(&redis.Options{Addr: rdb.Options().Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	trips := new(atomic.Int64)
	c.AddHook(tripCounter{trips})
	set, err := rules.Parse("test.yaml", []byte(usageRules))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	lo := enforcer.Options{Budget: time.Second, Registerer: reg, Keys: storetest.KeyCache(c)}
	for _, m := range mods {
		m(&lo)
	}
	lim, err := enforcer.New(c, set, lo)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := sidecar.New(lim, sidecar.Options{Registry: reg, Usage: o})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return &usageEnv{srv: srv, lim: lim, http: hs, rdb: rdb, trips: trips}
}

// spend checks n requests of key through /v1/check.
func (e *usageEnv) spend(t *testing.T, key string, n int) {
	t.Helper()
	body := fmt.Sprintf(`{"domain":"t","descriptors":[{"entries":[{"key":"x-api-key","value":%q}]}]}`, key)
	for range n {
		resp, err := http.Post(e.http.URL+"/v1/check", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("check %s: %d %s", key, resp.StatusCode, b)
		}
	}
}

// get asks /v1/usage with the headers (name, value pairs) and returns the
// status and the body.
func (e *usageEnv) get(t *testing.T, path string, hdr ...string) (int, []byte, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, e.http.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b, resp.Header
}

// usageOf asks /v1/usage for key and decodes the 200 answer.
func (e *usageEnv) usageOf(t *testing.T, key string) (sidecar.UsageResponse, []byte) {
	t.Helper()
	code, b, _ := e.get(t, "/v1/usage", "x-api-key", key)
	if code != http.StatusOK {
		t.Fatalf("usage of %q: %d %s", key, code, b)
	}
	var u sidecar.UsageResponse
	if err := json.Unmarshal(b, &u); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return u, b
}

func ruleOf(t *testing.T, u sidecar.UsageResponse, id string) sidecar.UsageRule {
	t.Helper()
	for _, r := range u.Rules {
		if r.ID == id {
			return r
		}
	}
	t.Fatalf("no rule %s in %+v", id, u.Rules)
	return sidecar.UsageRule{}
}

// bucketState returns the stored state of every rule key in Redis but the
// endpoint's own (sl:{…}:override:…): what reading usage must not change.
func bucketState(t *testing.T, rdb *redis.Client) map[string]string {
	t.Helper()
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, "sl:{*").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, k := range keys {
		if strings.Contains(k, "}:override:") {
			continue
		}
		v, err := rdb.Dump(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		out[k] = v
	}
	return out
}

// TestUsageAfterSevenOfTen is must-show 1: after 7 of a key's 10 tokens are
// spent, /v1/usage reports 3 remaining and the reset, and 100 calls spend
// nothing: the rules' state in Redis is byte for byte the same, and the
// next check still finds 3 tokens.
func TestUsageAfterSevenOfTen(t *testing.T) {
	e := newUsageEnv(t, sidecar.UsageOptions{Limit: 1000})
	e.spend(t, "key-a", 7)
	u, body := e.usageOf(t, "key-a")
	r := ruleOf(t, u, "per-key")
	if r.Remaining == nil || *r.Remaining != 3 {
		t.Fatalf("per-key remaining %v, want 3:\n%s", r.Remaining, body)
	}
	// 7 tokens at one a minute: full again in 7 minutes, less the time
	// since the checks.
	if r.ResetSeconds == nil || *r.ResetSeconds > 420 || *r.ResetSeconds < 400 {
		t.Errorf("per-key reset %v s, want just under 420", r.ResetSeconds)
	}
	if r.Description != "bursts of 10, then one request a minute" || r.Algorithm != "token_bucket" || r.Limit != 1 ||
		r.Burst != 10 || r.Capacity != 10 || r.PeriodSeconds != 60 || r.WindowSeconds != 600 || r.CountedPer != "api_key" {
		t.Errorf("per-key: %+v", r)
	}
	acct := ruleOf(t, u, "per-account")
	if acct.Remaining == nil || *acct.Remaining != 1000-7 || acct.CountedPer != "account" {
		t.Errorf("per-account: %+v", acct)
	}
	if tier := ruleOf(t, u, "gold-tier"); tier.Remaining != nil || tier.ResetSeconds != nil || tier.CountedPer != "shared" {
		t.Errorf("gold-tier, whose count the whole tier shares: %+v, want no remaining or reset", tier)
	}
	if len(u.Rules) != 3 || strings.Contains(string(body), "trial") {
		t.Errorf("want per-key, per-account and gold-tier, and never the shadow rule:\n%s", body)
	}
	if u.Account != "acme" || u.Org != "initech" || u.Tier != "gold" || u.Domain != "t" || u.Denials != "none" {
		t.Errorf("usage: %+v", u)
	}
	if d := time.Since(u.Time); d < -time.Minute || d > time.Minute {
		t.Errorf("time %v", u.Time)
	}

	before := bucketState(t, e.rdb)
	if len(before) != 4 { // per-key, per-account, gold-tier, trial
		t.Fatalf("rule keys in Redis: %v", before)
	}
	for range 100 {
		u, body = e.usageOf(t, "key-a")
	}
	if after := bucketState(t, e.rdb); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("100 usage calls changed the rules' state:\nbefore %q\nafter  %q", before, after)
	}
	if r := ruleOf(t, u, "per-key"); r.Remaining == nil || *r.Remaining != 3 {
		t.Errorf("after 100 calls, per-key remaining %v, want 3:\n%s", r.Remaining, body)
	}
	// The next three checks pass, the fourth is denied: nothing was spent.
	e.spend(t, "key-a", 3)
	resp, err := http.Post(e.http.URL+"/v1/check", "application/json",
		strings.NewReader(`{"domain":"t","descriptors":[{"entries":[{"key":"x-api-key","value":"key-a"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("the 11th check: %d, want 429", resp.StatusCode)
	}
}

// shape returns the JSON field paths of v (arrays: the union over their
// elements), sorted: what must be the same for every key.
func shape(t *testing.T, b []byte) []string {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var walk func(p string, v any)
	walk = func(p string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, c := range x {
				seen[p+"."+k] = true
				walk(p+"."+k, c)
			}
		case []any:
			for _, c := range x {
				walk(p+"[]", c)
			}
		}
	}
	walk("", v)
	var out []string
	for k := range seen {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestUsageShowsOnlyTheCallersKey is must-show 2: two keys, a missing key,
// an unknown key and keys with hostile characters. Each key sees its own
// counts only; nothing in the request but the key header chooses what is
// read; an unknown key is answered 200 with the same fields as a real
// one, after the same Redis round trips, in the same time class.
func TestUsageShowsOnlyTheCallersKey(t *testing.T) {
	e := newUsageEnv(t, sidecar.UsageOptions{Limit: 100000})
	e.spend(t, "key-a", 4)
	e.spend(t, "key-b", 2)

	a, aBody := e.usageOf(t, "key-a")
	b, bBody := e.usageOf(t, "key-b")
	if r := ruleOf(t, a, "per-key"); *r.Remaining != 6 {
		t.Errorf("key-a per-key remaining %d, want 6", *r.Remaining)
	}
	if r := ruleOf(t, b, "per-key"); *r.Remaining != 8 {
		t.Errorf("key-b per-key remaining %d, want 8", *r.Remaining)
	}
	if b.Account != "globex" || b.Tier != "free" || len(b.Rules) != 2 { // per-key, per-account
		t.Errorf("key-b: %+v", b)
	}
	for _, leak := range []string{"acme", "initech", "gold", "key-a", "key-b"} {
		if strings.Contains(string(bBody), leak) {
			t.Errorf("key-b's answer has %q:\n%s", leak, bBody)
		}
	}
	if strings.Contains(string(aBody), "globex") || strings.Contains(string(aBody), "key-") {
		t.Errorf("key-a's answer names another account, or a key:\n%s", aBody)
	}
	// Only the header chooses: a query, another header or a second key
	// header changes nothing.
	for _, path := range []string{"/v1/usage?api_key=key-b", "/v1/usage?x-api-key=key-b&account=globex"} {
		code, body, _ := e.get(t, path, "x-api-key", "key-a", "api-key", "key-b", "x-account", "globex")
		var u sidecar.UsageResponse
		if err := json.Unmarshal(body, &u); code != 200 || err != nil || u.Account != "acme" || *ruleOf(t, u, "per-key").Remaining != 6 {
			t.Errorf("%s: %d %s", path, code, body)
		}
	}

	// No key: 401, and nothing about any key.
	code, body, hdr := e.get(t, "/v1/usage")
	if code != http.StatusUnauthorized || !strings.Contains(hdr.Get("WWW-Authenticate"), "x-api-key") || strings.Contains(string(body), "rules") {
		t.Errorf("no key: %d %v %s", code, hdr, body)
	}
	// A key longer than any API key: 400.
	if code, body, _ := e.get(t, "/v1/usage", "x-api-key", strings.Repeat("k", 513)); code != http.StatusBadRequest {
		t.Errorf("a 513-byte key: %d %s", code, body)
	}

	// Unknown and hostile keys: a fresh bucket each, full, with the
	// fields of a real key's answer; none touches key-a's or key-b's.
	aShape := shape(t, aBody)
	hostile := []string{
		"unknown-key",
		"key-a ", // net/http trims it: key-a itself, which must still read 6
		"key-a*", "key-?", "*", "sl:{x}:per-key:0", "}{", "key-a}:per-key:0",
		`' OR '1'='1`, `\'; DROP TABLE decisions; --`, "%00", "é🔑", "key-b\tkey-a", strings.Repeat("x", 512),
	}
	for _, k := range hostile {
		u, body := e.usageOf(t, k)
		want := int64(10)
		if k == "key-a " {
			want = 6
		}
		if r := ruleOf(t, u, "per-key"); r.Remaining == nil || *r.Remaining != want {
			t.Errorf("key %q: per-key remaining %v, want %d:\n%s", k, r.Remaining, want, body)
		}
		if k != "key-a " && (u.Account != "" || u.Tier != "" || len(u.Rules) != 1) {
			t.Errorf("key %q: %+v, want no parents and the per-key rule only", k, u)
		}
		if got := shape(t, body); !slices.Equal(got, aShape) {
			t.Errorf("key %q: fields\n%v\nwant key-a's\n%v", k, got, aShape)
		}
	}
	if r := ruleOf(t, e.mustUsage(t, "key-a"), "per-key"); *r.Remaining != 6 {
		t.Errorf("key-a after the hostile keys: %d, want 6", *r.Remaining)
	}
	if r := ruleOf(t, e.mustUsage(t, "key-b"), "per-key"); *r.Remaining != 8 {
		t.Errorf("key-b after the hostile keys: %d, want 8", *r.Remaining)
	}

	// The same time class: the same Redis round trips for a real and an
	// unknown key (the endpoint's rule, the key store on a cache miss, one
	// pipeline of reads, however many rules match) and, interleaved, the
	// same median time within a wide factor.
	trips := func(key string) int64 {
		before := e.trips.Load()
		e.usageOf(t, key)
		return e.trips.Load() - before
	}
	if real, unknown := trips("key-c"), trips("never-seen-1"); real != unknown {
		t.Errorf("Redis round trips: %d for a known key (first ask), %d for an unknown one", real, unknown)
	}
	if real, unknown := trips("key-b"), trips("never-seen-1"); real != unknown {
		t.Errorf("Redis round trips, cached: %d for a known key, %d for an unknown one", real, unknown)
	}
	var realT, unknownT []time.Duration
	for i := range 40 {
		for _, k := range []string{"key-a", fmt.Sprintf("unknown-%d", i)} {
			start := time.Now()
			e.usageOf(t, k)
			if k == "key-a" {
				realT = append(realT, time.Since(start))
			} else {
				unknownT = append(unknownT, time.Since(start))
			}
		}
	}
	slices.Sort(realT)
	slices.Sort(unknownT)
	mr, mu := realT[len(realT)/2], unknownT[len(unknownT)/2]
	t.Logf("median answer: known key %v, unknown key %v", mr, mu)
	if mu*5 < mr || mr*5 < mu {
		t.Errorf("median answer: known key %v, unknown key %v: not the same time class", mr, mu)
	}
}

func (e *usageEnv) mustUsage(t *testing.T, key string) sidecar.UsageResponse {
	u, _ := e.usageOf(t, key)
	return u
}

// TestUsageLimitsEnumeration is must-show 4: the endpoint's own rule (5 a
// minute per client address here) answers the 6th request 429, whatever
// key each request tries, with Retry-After; a request without a key
// counts too; the rule charges none of the rule set's rules.
func TestUsageLimitsEnumeration(t *testing.T) {
	e := newUsageEnv(t, sidecar.UsageOptions{Limit: 5, Period: time.Minute})
	before := bucketState(t, e.rdb)
	codes := []int{}
	for i := range 8 {
		var code int
		if i == 2 {
			code, _, _ = e.get(t, "/v1/usage") // no key
		} else {
			code, _, _ = e.get(t, "/v1/usage", "x-api-key", fmt.Sprintf("guess-%d", i))
		}
		codes = append(codes, code)
	}
	want := []int{200, 200, 401, 200, 200, 429, 429, 429}
	if !slices.Equal(codes, want) {
		t.Fatalf("codes %v, want %v", codes, want)
	}
	code, body, hdr := e.get(t, "/v1/usage", "x-api-key", "key-a")
	if code != http.StatusTooManyRequests || hdr.Get("Retry-After") == "" || strings.Contains(string(body), "acme") {
		t.Errorf("a real key once the address is over: %d %v %s", code, hdr, body)
	}
	if after := bucketState(t, e.rdb); len(after) != len(before) {
		t.Errorf("the endpoint's rule charged the rule set's rules: %v", after)
	}
	// A limiter in shadow mode (sluice serve --shadow) enforces no rule of
	// the set, but the endpoint's own rule still holds.
	sh := newUsageEnv(t, sidecar.UsageOptions{Limit: 1, Period: time.Minute}, func(o *enforcer.Options) { o.Shadow = true })
	for i, want := range []int{200, 429} {
		if code, body, _ := sh.get(t, "/v1/usage", "x-api-key", "key-a"); code != want {
			t.Errorf("shadow mode, request %d: %d %s, want %d", i+1, code, body, want)
		}
	}
	// Another client address has its own count: behind a trusted proxy
	// that names the client (ClientIPHeader).
	p := newUsageEnv(t, sidecar.UsageOptions{Limit: 1, Period: time.Minute, ClientIPHeader: "x-envoy-external-address"})
	for _, c := range []struct {
		ip   string
		want int
	}{{"198.51.100.1", 200}, {"198.51.100.1", 429}, {"198.51.100.2", 200}} {
		if code, body, _ := p.get(t, "/v1/usage", "x-api-key", "key-a", "x-envoy-external-address", c.ip); code != c.want {
			t.Errorf("from %s: %d %s, want %d", c.ip, code, body, c.want)
		}
	}
}

// fakeDenials stands in for ClickHouse (analytics' own test checks the
// real query): it records the keys it is asked about.
type fakeDenials struct {
	mu    sync.Mutex
	asked []string
	err   error
}

func (f *fakeDenials) KeyDenials(_ context.Context, key string, _ time.Time) (map[string]sidecar.DenialCount, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, key)
	if f.err != nil {
		return nil, f.err
	}
	if key != "key-a" {
		return nil, nil
	}
	return map[string]sidecar.DenialCount{"per-key": {LastHour: 2, LastDay: 9}}, nil
}

// TestUsageDenials: with a Denials reader the answer has each rule's
// denials of the caller's key (0 for a rule without), asked for that key
// only; when the reader fails, null counts and an error line, still 200.
func TestUsageDenials(t *testing.T) {
	f := &fakeDenials{}
	e := newUsageEnv(t, sidecar.UsageOptions{Limit: 100, Denials: f})
	u, body := e.usageOf(t, "key-a")
	r, acct := ruleOf(t, u, "per-key"), ruleOf(t, u, "per-account")
	if u.Denials != "clickhouse" || r.DeniedLastHour == nil || *r.DeniedLastHour != 2 || *r.DeniedLastDay != 9 ||
		acct.DeniedLastHour == nil || *acct.DeniedLastHour != 0 || *acct.DeniedLastDay != 0 {
		t.Errorf("denials:\n%s", body)
	}
	u, _ = e.usageOf(t, "unknown")
	if r := ruleOf(t, u, "per-key"); r.DeniedLastHour == nil || *r.DeniedLastHour != 0 {
		t.Errorf("unknown key: %+v", r)
	}
	if !slices.Equal(f.asked, []string{"key-a", "unknown"}) {
		t.Errorf("asked for %q", f.asked)
	}
	f.err = errors.New("clickhouse: connection refused")
	u, body = e.usageOf(t, "key-a")
	if r := ruleOf(t, u, "per-key"); u.Denials != "unavailable" || r.DeniedLastHour != nil || len(u.Errors) != 1 || *r.Remaining != 10 {
		t.Errorf("ClickHouse down:\n%s", body)
	}
	if strings.Contains(string(body), "refused") {
		t.Errorf("the answer shows the internal error:\n%s", body)
	}
}
