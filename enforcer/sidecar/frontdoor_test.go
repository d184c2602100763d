package sidecar_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/internal/syncbuf"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-rl/sluice/enforcer/sidecar"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// frontDoorRules are issue 35's: an exact path rule, a template rule and a
// per-user rule.
const frontDoorRules = `
domain: t
custom_keys: [x-tenant]
rules:
  - {id: login, match: [{key: path, value: /v1/login}], limit: 3, period: 1h}
  - {id: orders, match: [{key: path, template: "/v1/users/{id}/orders"}], limit: 3, period: 1h}
  - {id: per-user, match: [{key: user}], limit: 3, period: 1h}
  - {id: per-tenant, match: [{key: x-tenant}], limit: 3, period: 1h}
`

// TestRespellingsHitTheExactRule: every respelling of issue 35 (a query, a
// bare ?, //, /./, %6C for l, a trailing slash) counts against the exact
// path rule /v1/login, in one bucket: 3 pass, the rest are denied, over gRPC
// (Envoy's :path entry) and /v1/check alike. Upper case is another path
// unless the rule asks for case folding (rules.TestIgnoreCase).
func TestRespellingsHitTheExactRule(t *testing.T) {
	rdb := redistest.Server(t)
	e := newEnv(t, rdb, frontDoorRules, sidecar.Options{})
	spellings := []string{"/v1/login?x=1", "/v1/login?", "//v1/login", "/./v1/login", "/v1/%6Cogin", "/v1/login/", "/v1//login", "/v1/x/../login"}
	for i, p := range spellings {
		var code rlsv3.RateLimitResponse_Code
		if i%2 == 0 {
			code = e.check(t, rlReq("t", desc(":path", p))).GetOverallCode()
		} else {
			resp, body := post(t, e.http.URL+"/v1/check", fmt.Sprintf(`{"domain":"t","descriptors":[{"entries":[{"key":"path","value":%q}]}]}`, p))
			code = ok
			if resp.StatusCode == http.StatusTooManyRequests {
				code = over
			} else if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s: %d %s", p, resp.StatusCode, body)
			}
		}
		if want := map[bool]rlsv3.RateLimitResponse_Code{true: ok, false: over}[i < 3]; code != want {
			t.Errorf("request %d, %q: %v, want %v (the rule holds 3 for every spelling together)", i+1, p, code, want)
		}
	}
	if got := e.check(t, rlReq("t", desc(":path", "/V1/LOGIN"))).GetOverallCode(); got != ok {
		t.Errorf("/V1/LOGIN: %v, want OK: another path to a case-sensitive rule", got)
	}
	keys, err := rdb.Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 {
		t.Errorf("Redis keys %q, want 1: one bucket for every spelling", keys)
	}
}

// TestTemplateHoldsAgainstQueryStrings: issue 35's hole, where each new
// query string made a bucket of its own (20 of 20 allowed against 3/h, 20
// Redis keys): the template rule holds 3 of 20 query-string variants, in
// one Redis key.
func TestTemplateHoldsAgainstQueryStrings(t *testing.T) {
	rdb := redistest.Server(t)
	e := newEnv(t, rdb, frontDoorRules, sidecar.Options{})
	allowed := 0
	for i := range 20 {
		if e.check(t, rlReq("t", desc(":path", fmt.Sprintf("/v1/users/42/orders?cache=%d", i)))).GetOverallCode() == ok {
			allowed++
		}
	}
	if allowed != 3 {
		t.Errorf("%d of 20 query-string variants allowed, want 3", allowed)
	}
	keys, err := rdb.Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 {
		t.Errorf("Redis keys %q, want 1", keys)
	}
}

// TestLongValueCounted is the black-box RLS suite's hostile-value case
// (E5): a 10 KiB descriptor value, refused with InvalidArgument before
// issue 35 where envoyproxy/ratelimit counts it, is counted like a short
// one, over gRPC and HTTP, in a key as long as a short value's.
func TestLongValueCounted(t *testing.T) {
	rdb := redistest.Server(t)
	e := newEnv(t, rdb, frontDoorRules, sidecar.Options{})
	long := strings.Repeat("u", 10<<10)
	for _, v := range []string{"short", long, long + "2"} {
		for i := range 4 {
			var code rlsv3.RateLimitResponse_Code
			if i%2 == 0 {
				resp, err := e.rls.ShouldRateLimit(context.Background(), rlReq("t", desc("user", v)))
				if err != nil {
					t.Fatalf("a %d-byte value: %v", len(v), err)
				}
				code = resp.GetOverallCode()
			} else {
				resp, body := post(t, e.http.URL+"/v1/check", `{"domain":"t","descriptors":[{"entries":[{"key":"user","value":"`+v+`"}]}]}`)
				switch resp.StatusCode {
				case http.StatusOK:
					code = ok
				case http.StatusTooManyRequests:
					code = over
				default:
					t.Fatalf("a %d-byte value over HTTP: %d %.200s", len(v), resp.StatusCode, body)
				}
			}
			if want := map[bool]rlsv3.RateLimitResponse_Code{true: ok, false: over}[i < 3]; code != want {
				t.Errorf("a %d-byte value, request %d: %v, want %v", len(v), i+1, code, want)
			}
		}
	}
	keys, err := rdb.Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 3 {
		t.Errorf("%d Redis keys, want 3: one per value", len(keys))
	}
	for _, k := range keys {
		if len(k) != len(keys[0]) || len(k) > 128 {
			t.Errorf("key %q: every key as long as the others (%d), whatever the value's length", k, len(keys[0]))
		}
	}
}

// TestRepeatedIdentityRefused: an identity given twice with different
// values is refused with 400 (gRPC: InvalidArgument) on every endpoint: a
// gateway that authenticates one copy and forwards the other would let a
// caller spend or read another tenant's tokens.
func TestRepeatedIdentityRefused(t *testing.T) {
	e := newEnv(t, redistest.Server(t), testRules, sidecar.Options{
		ForwardAuth: sidecar.ForwardAuthOptions{Headers: map[rules.Key]string{rules.KeyUser: "X-User"}},
		Usage:       sidecar.UsageOptions{ClientIPHeader: "X-Real-IP"},
	})
	for _, kv := range [][]string{{"x-api-key", "a", "api_key", "b"}, {"remote_address", "192.0.2.1", "client_ip", "192.0.2.2"}, {"user", "a", "user_id", "b"}} {
		_, err := e.rls.ShouldRateLimit(context.Background(), rlReq("t", desc(kv...)))
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("gRPC %v: %v, want InvalidArgument", kv, err)
		}
		resp, body := post(t, e.http.URL+"/v1/check", fmt.Sprintf(`{"domain":"t","descriptors":[{"entries":[{"key":%q,"value":%q},{"key":%q,"value":%q}]}]}`, kv[0], kv[1], kv[2], kv[3]))
		if resp.StatusCode != http.StatusBadRequest || strings.Contains(body, `"b"`) {
			t.Errorf("/v1/check %v: %d %s, want 400 not echoing the values", kv, resp.StatusCode, body)
		}
	}
	// The same value twice is one identity, not two.
	if _, err := e.rls.ShouldRateLimit(context.Background(), rlReq("t", desc("x-api-key", "a", "api_key", "a"))); err != nil {
		t.Errorf("one key given twice alike: %v", err)
	}
	for _, c := range []struct {
		path    string
		headers [][2]string
	}{
		{"/v1/usage", [][2]string{{"X-Api-Key", "k1"}, {"X-Api-Key", "k2"}}},
		{"/v1/usage", [][2]string{{"X-Api-Key", "k1"}, {"X-Real-IP", "192.0.2.1"}, {"X-Real-IP", "192.0.2.2"}}},
		{sidecar.ForwardAuthPath, [][2]string{{"X-Forwarded-Uri", "/x"}, {"X-Forwarded-For", "192.0.2.1"}, {"X-Api-Key", "k1"}, {"X-Api-Key", "k2"}}},
		{sidecar.ForwardAuthPath, [][2]string{{"X-Forwarded-Uri", "/x"}, {"X-Forwarded-For", "192.0.2.1"}, {"X-User", "a"}, {"X-User", "b"}}},
		{sidecar.ForwardAuthPath, [][2]string{{"X-Forwarded-Uri", "/x"}, {"X-Forwarded-Uri", "/y"}, {"X-Forwarded-For", "192.0.2.1"}}},
	} {
		req, _ := http.NewRequest(http.MethodGet, e.http.URL+c.path, nil)
		for _, h := range c.headers {
			req.Header.Add(h[0], h[1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "given 2 times") {
			t.Errorf("%s %v: %d %s, want 400", c.path, c.headers, resp.StatusCode, b)
		}
	}
}

// TestUnknownKeyCounted: issue 35's typo, remote_adress, matched no rule and
// said nothing. Such a key is counted, and logged once a minute with the
// key; a key the rules match, an alias and another domain's check are not.
func TestUnknownKeyCounted(t *testing.T) {
	var log syncbuf.Buffer
	e := newEnv(t, redistest.Server(t), frontDoorRules, sidecar.Options{Logger: slog.New(slog.NewTextHandler(&log, nil))})
	for range 3 {
		e.check(t, rlReq("t", desc("remote_adress", "192.0.2.1")))
	}
	e.check(t, rlReq("t", desc("x-tenant", "acme", "remote_address", "192.0.2.1")))
	e.check(t, rlReq("other", desc("remote_adress", "192.0.2.1")))
	if n := e.metric(t, "sluice_sidecar_unknown_descriptor_keys_total"); n != 3 {
		t.Errorf("sluice_sidecar_unknown_descriptor_keys_total %v, want 3", n)
	}
	if got := strings.Count(log.String(), "key=remote_adress"); got != 1 {
		t.Errorf("%d log lines name remote_adress, want 1 (once a minute):\n%s", got, log.String())
	}
}

// faCall calls the forward-auth endpoint of srv as a gateway at peer
// would.
func faCall(t *testing.T, h http.Handler, peer, query string, headers ...string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, sidecar.ForwardAuthPath+query, nil)
	req.RemoteAddr = peer
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// TestForwardAuth: the forward-auth endpoint decides the original request
// from the gateway's headers with the same engine: the path normalized, the
// client the rightmost X-Forwarded-For address no trusted proxy has, a custom
// key from the header of its name; 429 with Retry-After and the RateLimit
// headers past the limit (or deny_status's 401 for nginx); a caller outside
// the trusted proxies refused.
func TestForwardAuth(t *testing.T) {
	const yml = `
domain: t
custom_keys: [x-tenant]
rules:
  - {id: per-ip, match: [{key: client_ip}, {key: route, prefix: /v1/, shared: true}], limit: 2, period: 1h}
  - {id: per-tenant, match: [{key: x-tenant}], limit: 5, period: 1h}
`
	e := newEnv(t, redistest.Server(t), yml, sidecar.Options{ForwardAuth: sidecar.ForwardAuthOptions{
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("10.0.0.0/8")},
	}})
	h := e.srv.Handler()
	gw := "127.0.0.1:5555"
	// The client 198.51.100.7 behind a proxy at 10.1.1.1, with a forged
	// address on the left: spoofing the left changes nothing.
	for i := range 3 {
		rec := faCall(t, h, gw, "", "X-Forwarded-Method", "POST", "X-Forwarded-Uri", "//v1/./orders?x="+fmt.Sprint(i),
			"X-Forwarded-For", fmt.Sprintf("203.0.113.%d, 198.51.100.7", i), "X-Forwarded-For", "10.1.1.1")
		want := map[bool]int{true: 200, false: 429}[i < 2]
		if rec.Code != want {
			t.Fatalf("call %d: %d %s, want %d", i+1, rec.Code, rec.Body, want)
		}
		if rec.Header().Get("RateLimit-Policy") == "" || rec.Header().Get("X-RateLimit-Limit") != "2" {
			t.Errorf("call %d: headers %v, want the RateLimit headers", i+1, rec.Header())
		}
		if want == 429 && rec.Header().Get("Retry-After") == "" {
			t.Errorf("429 without Retry-After: %v", rec.Header())
		}
	}
	// nginx: deny_status=401, the only denial auth_request passes on.
	if rec := faCall(t, h, gw, "?deny_status=401", "X-Forwarded-Uri", "/v1/x", "X-Forwarded-For", "198.51.100.7"); rec.Code != 401 || rec.Header().Get("Retry-After") == "" {
		t.Errorf("deny_status=401: %d %v", rec.Code, rec.Header())
	}
	// Another client is another bucket; a custom key from its header.
	for i := range 6 {
		rec := faCall(t, h, gw, "", "X-Forwarded-Uri", "/other", "X-Forwarded-For", "198.51.100.8", "X-Tenant", "acme")
		if want := map[bool]int{true: 200, false: 429}[i < 5]; rec.Code != want {
			t.Errorf("tenant call %d: %d, want %d", i+1, rec.Code, want)
		}
	}
	for _, c := range []struct {
		peer    string
		query   string
		headers []string
		code    int
	}{
		{"192.0.2.1:1", "", []string{"X-Forwarded-Uri", "/v1/x", "X-Forwarded-For", "198.51.100.9"}, 403},                               // not a gateway
		{gw, "", []string{"X-Forwarded-For", "198.51.100.9"}, 400},                                                                      // no URI
		{gw, "", []string{"X-Forwarded-Uri", "/v1/x"}, 400},                                                                             // no client address
		{gw, "", []string{"X-Forwarded-Uri", "/v1/x", "X-Forwarded-For", "nobody"}, 400},                                                // not an address
		{gw, "?deny_status=200", []string{"X-Forwarded-Uri", "/v1/x", "X-Forwarded-For", "198.51.100.9"}, 400},                          // never an allow
		{gw, "?deny_status=401&deny_status=200", []string{"X-Forwarded-Uri", "/v1/x", "X-Forwarded-For", "198.51.100.9"}, 400},          // twice (a fresh user's)
		{gw, "", []string{"X-Forwarded-Uri", "v1/x", "X-Forwarded-For", "198.51.100.9"}, 400},                                           // no leading / (a fresh user's)
		{gw, "", []string{"X-Forwarded-Uri", "/v1/x", "X-Forwarded-For", "198.51.100.9", "X-Tenant", strings.Repeat("t", 70<<10)}, 431}, // the bound
		{gw, "", []string{"X-Forwarded-Uri", "/v1/" + strings.Repeat("u", 40<<10), "X-Forwarded-For", "198.51.100.9"}, 200},             // a URI counted once (a fresh user's)
	} {
		if rec := faCall(t, h, c.peer, c.query, c.headers...); rec.Code != c.code {
			t.Errorf("%s %s %v: %d %s, want %d", c.peer, c.query, c.headers[:min(len(c.headers), 4)], rec.Code, rec.Body, c.code)
		}
	}
	if n := counter(t, e.reg, "sluice_sidecar_checks_total", "api", "forward_auth"); n < 10 {
		t.Errorf("sluice_sidecar_checks_total{api=forward_auth} %v", n)
	}
}

// TestUsageClientHeaderOnlyFromProxies: issue 35's outsider, who reached
// /v1/usage directly and read 100 keys past its 30/min limit by naming a new
// address in --usage-client-ip-header each time. The header is read only
// from a trusted proxy; from anyone else, the connection's address counts.
func TestUsageClientHeaderOnlyFromProxies(t *testing.T) {
	for _, c := range []struct {
		name    string
		proxies []netip.Prefix
		want    []int
	}{
		{"from a trusted proxy", nil, []int{200, 200, 200}}, // loopback, the default: each address its own count
		{"from anyone else", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, []int{200, 429, 429}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, redistest.Server(t), testRules, sidecar.Options{
				Usage:       sidecar.UsageOptions{Limit: 1, ClientIPHeader: "X-Real-IP"},
				ForwardAuth: sidecar.ForwardAuthOptions{TrustedProxies: c.proxies},
			})
			for i, want := range c.want {
				req, _ := http.NewRequest(http.MethodGet, e.http.URL+"/v1/usage", nil)
				req.Header.Set("X-Api-Key", fmt.Sprintf("key-%d", i))
				req.Header.Set("X-Real-IP", fmt.Sprintf("198.51.100.%d", i))
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != want {
					t.Errorf("request %d: %d, want %d", i+1, resp.StatusCode, want)
				}
			}
		})
	}
}
