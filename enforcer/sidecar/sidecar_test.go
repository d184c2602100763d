package sidecar_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/enforcer/sidecar"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// testRules: token buckets of an hour, which refill one token per 20 min
// or more, so counts do not move while a test runs.
const testRules = `
domain: t
rules:
  - {id: per-user, match: [{key: user}], limit: 3, period: 1h}
  - {id: per-key, match: [{key: api_key}], limit: 5, period: 1h}
  - {id: per-ip-shadow, match: [{key: client_ip}], limit: 1, period: 1h, mode: shadow}
  - {id: login, match: [{key: route, value: /login}, {key: user}], limit: 100, period: 1h, failure_mode: closed}
`

// backends runs body against a real redis-server and the in-process Redis
// of embedded mode.
func backends(t *testing.T, body func(t *testing.T, rdb redis.UniversalClient)) {
	t.Run("redis-server", func(t *testing.T) { body(t, redistest.Server(t)) })
	t.Run("in-process", func(t *testing.T) {
		m := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		body(t, c)
	})
}

// env is a sidecar under test: a gRPC client over loopback and an HTTP
// server.
type env struct {
	srv  *sidecar.Server
	rls  rlsv3.RateLimitServiceClient
	conn *grpc.ClientConn
	http *httptest.Server
	reg  *prometheus.Registry
}

func newEnv(t *testing.T, rdb redis.UniversalClient, yaml string, o sidecar.Options, opts ...func(*enforcer.Options)) *env {
	t.Helper()
	set, err := rules.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	lo := enforcer.Options{Budget: time.Second, Registerer: reg}
	for _, f := range opts {
		f(&lo)
	}
	lim, err := enforcer.New(rdb, set, lo)
	if err != nil {
		t.Fatal(err)
	}
	o.Registry = reg
	srv, err := sidecar.New(lim, o)
	if err != nil {
		t.Fatal(err)
	}
	conn := serveGRPC(t, srv)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return &env{srv: srv, rls: rlsv3.NewRateLimitServiceClient(conn), conn: conn, http: hs, reg: reg}
}

// serveGRPC serves srv's gRPC API on a loopback port until the test ends
// and returns a client connection to it.
func serveGRPC(tb testing.TB, srv *sidecar.Server) *grpc.ClientConn {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	gs := srv.NewGRPCServer()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = gs.Serve(lis)
	}()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		conn.Close()
		gs.Stop()
		<-done
	})
	return conn
}

func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func hits(d *ratelimitv3.RateLimitDescriptor, n uint64) *ratelimitv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

func rlReq(domain string, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}
}

func (e *env) check(t *testing.T, r *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := e.rls.ShouldRateLimit(context.Background(), r)
	if err != nil {
		t.Fatalf("ShouldRateLimit(%v): %v", r, err)
	}
	return resp
}

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

// want is what a test expects of one descriptor's status: code, and for a
// descriptor with a limit, the limit's name, count and unit and the
// remaining.
type want struct {
	code      rlsv3.RateLimitResponse_Code
	name      string // "" = no current_limit
	perUnit   uint32
	unit      rlsv3.RateLimitResponse_RateLimit_Unit
	remaining uint32
	noReset   bool // a cost beyond the capacity: no wait admits it, so no duration_until_reset
}

func expect(t *testing.T, resp *rlsv3.RateLimitResponse, overall rlsv3.RateLimitResponse_Code, ws ...want) {
	t.Helper()
	if resp.GetOverallCode() != overall {
		t.Errorf("overall code %v, want %v", resp.GetOverallCode(), overall)
	}
	if len(resp.GetStatuses()) != len(ws) {
		t.Fatalf("%d statuses, want %d: %v", len(resp.GetStatuses()), len(ws), resp)
	}
	for i, w := range ws {
		st := resp.GetStatuses()[i]
		if st.GetCode() != w.code {
			t.Errorf("status %d: code %v, want %v", i, st.GetCode(), w.code)
		}
		lim := st.GetCurrentLimit()
		if w.name == "" {
			if lim != nil || st.GetDurationUntilReset() != nil {
				t.Errorf("status %d: limit %v reset %v, want none", i, lim, st.GetDurationUntilReset())
			}
			continue
		}
		if lim.GetName() != w.name || lim.GetRequestsPerUnit() != w.perUnit || lim.GetUnit() != w.unit || st.GetLimitRemaining() != w.remaining {
			t.Errorf("status %d: limit %q %d per %v, remaining %d; want %q %d per %v, remaining %d",
				i, lim.GetName(), lim.GetRequestsPerUnit(), lim.GetUnit(), st.GetLimitRemaining(), w.name, w.perUnit, w.unit, w.remaining)
		}
		window := time.Hour
		if w.unit == rlsv3.RateLimitResponse_RateLimit_DAY {
			window = 24 * time.Hour
		}
		if r := st.GetDurationUntilReset(); w.noReset {
			if r != nil {
				t.Errorf("status %d: duration_until_reset %v, want none (a cost beyond the capacity)", i, r)
			}
		} else if r == nil || r.AsDuration() < 0 || r.AsDuration() > window {
			t.Errorf("status %d: duration_until_reset %v, want one within %v", i, r, window)
		}
	}
}

func header(resp *rlsv3.RateLimitResponse, name string) string {
	for _, h := range resp.GetResponseHeadersToAdd() {
		if strings.EqualFold(h.GetKey(), name) {
			return h.GetValue()
		}
	}
	return ""
}

func user(n uint32, rem uint32) want {
	return want{code: ok, name: "per-user", perUnit: n, unit: rlsv3.RateLimitResponse_RateLimit_HOUR, remaining: rem}
}

func TestGRPC(t *testing.T) {
	backends(t, func(t *testing.T, rdb redis.UniversalClient) {
		e := newEnv(t, rdb, testRules, sidecar.Options{})
		t.Run("allow then deny", func(t *testing.T) {
			for rem := uint32(2); ; rem-- {
				resp := e.check(t, rlReq("t", desc("user", "u1")))
				expect(t, resp, ok, user(3, rem))
				if header(resp, "RateLimit") != fmt.Sprintf(`"per-user";r=%d;t=%d`, rem, 1200*(3-rem)) {
					t.Errorf("RateLimit header %q", header(resp, "RateLimit"))
				}
				if header(resp, "RateLimit-Policy") != `"per-user";q=3;w=3600` || header(resp, "X-RateLimit-Limit") != "3" {
					t.Errorf("headers %v", resp.GetResponseHeadersToAdd())
				}
				if rem == 0 {
					break
				}
			}
			resp := e.check(t, rlReq("t", desc("user", "u1")))
			w := user(3, 0)
			w.code = over
			expect(t, resp, over, w)
			if ra := header(resp, "Retry-After"); ra == "" || ra == "0" {
				t.Errorf("Retry-After %q on a deny; headers %v", ra, resp.GetResponseHeadersToAdd())
			}
		})
		t.Run("descriptors are decided together", func(t *testing.T) {
			// per-key has 5: a cost of 6 denies, and the user's part is not charged.
			resp := e.check(t, rlReq("t", desc("user", "u2"), hits(desc("x-api-key", "k2"), 6)))
			expect(t, resp, over, user(3, 3), want{code: over, name: "per-key", perUnit: 5, unit: rlsv3.RateLimitResponse_RateLimit_HOUR, remaining: 5, noReset: true})
			resp = e.check(t, rlReq("t", desc("user_id", "u2"), desc("api_key", "k2")))
			expect(t, resp, ok, user(3, 2), want{code: ok, name: "per-key", perUnit: 5, unit: rlsv3.RateLimitResponse_RateLimit_HOUR, remaining: 4})
		})
		t.Run("hits_addend", func(t *testing.T) {
			r := rlReq("t", desc("user", "u3"))
			r.HitsAddend = 2
			expect(t, e.check(t, r), ok, user(3, 1))
			// The descriptor's own hits_addend wins over the request's.
			r = rlReq("t", hits(desc("user", "u4"), 1))
			r.HitsAddend = 2
			expect(t, e.check(t, r), ok, user(3, 2))
		})
		t.Run("check only", func(t *testing.T) {
			for range 3 {
				expect(t, e.check(t, rlReq("t", hits(desc("user", "u5"), 0))), ok, user(3, 3))
			}
			expect(t, e.check(t, rlReq("t", desc("user", "u5"))), ok, user(3, 2))
		})
		t.Run("limit override", func(t *testing.T) {
			d := func() *ratelimitv3.RateLimitDescriptor {
				d := desc("user", "u6", "generic_key", "g")
				d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_DAY}
				return d
			}
			w := want{code: ok, name: "override_2_per_24h0m0s", perUnit: 2, unit: rlsv3.RateLimitResponse_RateLimit_DAY, remaining: 1}
			expect(t, e.check(t, rlReq("t", d())), ok, w)
			w.remaining = 0
			expect(t, e.check(t, rlReq("t", d())), ok, w)
			w.code = over
			expect(t, e.check(t, rlReq("t", d())), over, w)
			// per-user was replaced, not charged; other entries count apart.
			expect(t, e.check(t, rlReq("t", desc("user", "u6"))), ok, user(3, 2))
			o := desc("user", "u6", "generic_key", "h")
			o.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_DAY}
			w.code, w.remaining = ok, 1
			expect(t, e.check(t, rlReq("t", o)), ok, w)
		})
		t.Run("keys that cannot be keys match nothing", func(t *testing.T) {
			before := counter(t, e.reg, "sluice_sidecar_unmatched_descriptors_total")
			resp := e.check(t, rlReq("t", desc("bad key", "x", "user", "u7"), desc("user", "u7")))
			expect(t, resp, ok, want{code: ok}, user(3, 2))
			if got := counter(t, e.reg, "sluice_sidecar_unmatched_descriptors_total") - before; got != 1 {
				t.Errorf("unmatched descriptors counted %v, want 1", got)
			}
		})
		t.Run("shadow rules stay invisible", func(t *testing.T) {
			for range 3 {
				expect(t, e.check(t, rlReq("t", desc("remote_address", "192.0.2.9"))), ok, want{code: ok})
			}
		})
		t.Run("another domain", func(t *testing.T) {
			for range 4 {
				expect(t, e.check(t, rlReq("other", desc("user", "u8"))), ok, want{code: ok})
			}
		})
		t.Run("bad requests", func(t *testing.T) {
			many := rlReq("t")
			for range enforcer.MaxParts + 1 {
				many.Descriptors = append(many.Descriptors, desc("user", "u"))
			}
			unknownUnit := desc("user", "u")
			unknownUnit.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2}
			zeroLimit := desc("user", "u")
			zeroLimit.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{Unit: typev3.RateLimitUnit_SECOND}
			negative := hits(desc("user", "u"), 1)
			negative.IsNegativeHits = true
			bigHits := rlReq("t", desc("user", "u"))
			bigHits.HitsAddend = 1<<30 + 1
			for _, c := range []struct {
				name string
				r    *rlsv3.RateLimitRequest
				msg  string
			}{
				{"empty domain", rlReq("", desc("user", "u")), "rate limit domain must not be empty"},
				{"no descriptors", rlReq("t"), "rate limit descriptor list must not be empty"},
				{"too many descriptors", many, "more than 16"},
				{"request hits_addend", bigHits, "hits_addend 1073741825"},
				{"descriptor hits_addend", rlReq("t", hits(desc("user", "u"), 1<<31)), "hits_addend 2147483648"},
				{"negative hits", rlReq("t", negative), "is_negative_hits"},
				{"override without unit", rlReq("t", unknownUnit), "unit UNKNOWN"},
			} {
				_, err := e.rls.ShouldRateLimit(context.Background(), c.r)
				if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), c.msg) {
					t.Errorf("%s: got %v, want InvalidArgument containing %q", c.name, err, c.msg)
				}
			}
			// An override of 0 blocks, as envoyproxy/ratelimit counts
			// against a limit of 0: over the limit, with no Redis call.
			resp, err := e.rls.ShouldRateLimit(context.Background(), rlReq("t", zeroLimit))
			if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Errorf("override of 0: %v %v, want OVER_LIMIT", resp, err)
			}
		})
		t.Run("health", func(t *testing.T) {
			resp, err := healthpb.NewHealthClient(e.conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
			if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("health: %v %v", resp, err)
			}
		})
	})
}

// TestDirectCall: ShouldRateLimit called as a Go method answers as over gRPC.
func TestDirectCall(t *testing.T) {
	e := newEnv(t, redistest.Server(t), testRules, sidecar.Options{})
	resp, err := e.srv.ShouldRateLimit(context.Background(), rlReq("t", desc("user", "d"), desc("zzz", "1")))
	if err != nil {
		t.Fatal(err)
	}
	expect(t, resp, ok, user(3, 2), want{code: ok})
	if _, err := e.srv.ShouldRateLimit(context.Background(), nil); status.Code(err) != codes.InvalidArgument {
		t.Errorf("nil request: %v, want InvalidArgument", err)
	}
	if _, err := e.srv.ShouldRateLimit(context.Background(), rlReq("t", nil)); err != nil {
		t.Errorf("a nil descriptor: %v, want an answer", err)
	}
}

// TestConcurrentAnswersAreTheirOwn: answers are built in pooled memory; under
// concurrency each must still describe its own request.
func TestConcurrentAnswersAreTheirOwn(t *testing.T) {
	e := newEnv(t, redistest.Server(t), testRules, sidecar.Options{})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				n := 1 + (g+i)%4 // descriptors; the odd ones are unknown
				r := rlReq("t")
				for j := range n {
					if j%2 == 0 {
						r.Descriptors = append(r.Descriptors, hits(desc("user", fmt.Sprintf("c%d-%d-%d", g, i, j)), 0))
					} else {
						r.Descriptors = append(r.Descriptors, desc("nope", "x"))
					}
				}
				resp, err := e.rls.ShouldRateLimit(context.Background(), r)
				if err != nil {
					t.Error(err)
					return
				}
				if len(resp.GetStatuses()) != n {
					t.Errorf("%d statuses for %d descriptors", len(resp.GetStatuses()), n)
					return
				}
				for j, st := range resp.GetStatuses() {
					if (st.GetCurrentLimit() != nil) != (j%2 == 0) || (j%2 == 0 && st.GetLimitRemaining() != 3) {
						t.Errorf("status %d of %d: %v", j, n, st)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
}

func counter(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue metric
				}
			}
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

func post(t *testing.T, url, body string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func TestHTTP(t *testing.T) {
	backends(t, func(t *testing.T, rdb redis.UniversalClient) {
		e := newEnv(t, rdb, testRules, sidecar.Options{})
		url := e.http.URL + "/v1/check"
		body := `{"domain": "t", "descriptors": [{"entries": [{"key": "user", "value": "h1"}]}, {"entries": [{"key": "generic_key", "value": "x"}]}], "hits_addend": 2}`
		resp, out := post(t, url, body)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Ratelimit") != `"per-user";r=1;t=2400` || resp.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("first check: %d %v %s", resp.StatusCode, resp.Header, out)
		}
		var rl rlsv3.RateLimitResponse
		if err := protojson.Unmarshal([]byte(out), &rl); err != nil {
			t.Fatalf("answer %s: %v", out, err)
		}
		expect(t, &rl, ok, user(3, 1), want{code: ok})
		if len(rl.GetResponseHeadersToAdd()) == 0 {
			t.Errorf("no response_headers_to_add in %s", out)
		}
		resp, out = post(t, url, body)
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || !strings.Contains(out, `"OVER_LIMIT"`) {
			t.Errorf("deny: %d %v %s", resp.StatusCode, resp.Header, out)
		}
		// envoyproxy/ratelimit's path answers the same way.
		if resp, out := post(t, e.http.URL+"/json", `{"domain": "t", "descriptors": [{"entries": [{"key": "user", "value": "h2"}]}]}`); resp.StatusCode != http.StatusOK {
			t.Errorf("/json: %d %s", resp.StatusCode, out)
		}
		for _, c := range []struct {
			name, body string
			code       int
			msg        string
		}{
			{"not JSON", `{"domain": `, 400, "not a RateLimitRequest"},
			{"unknown field", `{"domain": "t", "descriptors": [], "bogus": 1}`, 400, "bogus"},
			{"empty domain", `{"descriptors": [{"entries": [{"key": "user", "value": "u"}]}]}`, 400, "rate limit domain must not be empty"},
			{"no descriptors", `{"domain": "t"}`, 400, "descriptor list must not be empty"},
			{"too big", `{"domain": "` + strings.Repeat("a", 65<<10) + `"}`, 413, "larger than 65536"},
		} {
			resp, out := post(t, url, c.body)
			if resp.StatusCode != c.code || !strings.Contains(out, c.msg) {
				t.Errorf("%s: %d %s, want %d with %q", c.name, resp.StatusCode, out, c.code, c.msg)
			}
		}
		r, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != http.StatusMethodNotAllowed || r.Header.Get("Allow") != "POST" {
			t.Errorf("GET /v1/check: %d Allow %q, want 405 Allow POST", r.StatusCode, r.Header.Get("Allow"))
		}
		for path, want := range map[string]string{
			"/healthz": "ok",
			"/readyz":  "ready\nrules: domain \"t\"",
			"/metrics": `sluice_sidecar_checks_total{api="http",code="ok"} 2`,
		} {
			r, err := http.Get(e.http.URL + path)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(r.Body)
			r.Body.Close()
			if r.StatusCode != http.StatusOK || !strings.Contains(string(b), want) {
				t.Errorf("GET %s: %d %q, want 200 with %q", path, r.StatusCode, b, want)
			}
		}
		if got := counter(t, e.reg, "sluice_enforcer_decisions_total", "outcome", "denied"); got != 1 {
			t.Errorf("the limiter's metrics on the same registry: %v denied, want 1", got)
		}
	})
}

// TestRedisDown: with Redis unavailable a fail-closed rule denies, with
// Retry-After: 1 and the reason; readiness holds unless Redis is required.
func TestRedisDown(t *testing.T) {
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, ContextTimeoutEnabled: true, DialTimeout: 50 * time.Millisecond, DialerRetries: 1})
	t.Cleanup(func() { dead.Close() })
	for _, c := range []struct {
		opts      sidecar.Options
		status    int
		readyCode int
	}{
		{sidecar.Options{Redis: dead}, http.StatusTooManyRequests, http.StatusOK},
		{sidecar.Options{Redis: dead, RequireRedis: true, UnavailableStatus: http.StatusServiceUnavailable}, http.StatusServiceUnavailable, http.StatusServiceUnavailable},
	} {
		e := newEnv(t, dead, testRules, c.opts)
		resp := e.check(t, rlReq("t", desc("route", "/login", "user", "u"), desc("user", "v")))
		if resp.GetOverallCode() != over || header(resp, "Retry-After") != "1" || header(resp, "Sluice-Reason") != "limiter_unavailable" {
			t.Errorf("fail closed: %v", resp)
		}
		if st := resp.GetStatuses(); st[0].GetCode() != over || st[1].GetCode() != ok || st[0].GetCurrentLimit() != nil {
			t.Errorf("statuses %v: want the login descriptor over limit without counts, the other ok", st)
		}
		// A descriptor of fail-open rules alone is allowed (a local bucket).
		expect(t, e.check(t, rlReq("t", desc("user", "w"))), ok, want{code: ok})
		r, body := post(t, e.http.URL+"/v1/check", `{"domain": "t", "descriptors": [{"entries": [{"key": "route", "value": "/login"}, {"key": "user", "value": "u"}]}]}`)
		if r.StatusCode != c.status || r.Header.Get("Retry-After") != "1" {
			t.Errorf("HTTP: %d %v %s, want %d", r.StatusCode, r.Header, body, c.status)
		}
		rr, err := http.Get(e.http.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(rr.Body)
		rr.Body.Close()
		if rr.StatusCode != c.readyCode || !strings.Contains(string(b), "redis does not answer") {
			t.Errorf("readyz: %d %q, want %d naming Redis", rr.StatusCode, b, c.readyCode)
		}
		e.srv.UpdateHealth(context.Background())
		h, err := healthpb.NewHealthClient(e.conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
		if wantServing := c.readyCode == http.StatusOK; err != nil || (h.GetStatus() == healthpb.HealthCheckResponse_SERVING) != wantServing {
			t.Errorf("gRPC health %v %v, want serving %v", h, err, wantServing)
		}
	}
}

func TestDrain(t *testing.T) {
	e := newEnv(t, redistest.Server(t), testRules, sidecar.Options{})
	e.srv.Drain()
	r, err := http.Get(e.http.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("readyz while draining: %d, want 503", r.StatusCode)
	}
	h, err := healthpb.NewHealthClient(e.conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health while draining: %v %v", h, err)
	}
	// Checks are still answered while draining.
	expect(t, e.check(t, rlReq("t", desc("user", "dr"))), ok, user(3, 2))
}

// TestHeadersOption: Options.Headers selects the engine's headers.
func TestHeadersOption(t *testing.T) {
	e := newEnv(t, redistest.Server(t), testRules, sidecar.Options{Headers: enforcer.HeadersLegacy})
	resp := e.check(t, rlReq("t", desc("user", "hd")))
	var names []string
	for _, h := range resp.GetResponseHeadersToAdd() {
		names = append(names, h.GetKey())
	}
	if strings.Join(names, ",") != "X-RateLimit-Limit,X-RateLimit-Remaining,X-RateLimit-Reset" {
		t.Errorf("headers %v", names)
	}
	if _, err := sidecar.New(nil, sidecar.Options{}); err == nil {
		t.Error("New(nil limiter) succeeded")
	}
	lim, _ := enforcer.New(redistest.Server(t), sidecar.ExampleRules(), enforcer.Options{})
	if _, err := sidecar.New(lim, sidecar.Options{UnavailableStatus: 500}); err == nil {
		t.Error("UnavailableStatus 500 accepted")
	}
}

// With the limiter in global shadow mode (sluice serve --shadow) a
// descriptor over its limit is answered OK, per descriptor and overall, and
// shows no limit: shadow rules are invisible to clients.
func TestGlobalShadow(t *testing.T) {
	set, err := rules.Parse("test.yaml", []byte(testRules))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := enforcer.New(redistest.Server(t), set, enforcer.Options{Budget: time.Second, Shadow: true})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := sidecar.New(lim, sidecar.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rls := rlsv3.NewRateLimitServiceClient(serveGRPC(t, srv))
	for i := range 5 { // per-user allows 3
		resp, err := rls.ShouldRateLimit(context.Background(), rlReq(set.Domain, desc("user_id", "u")))
		if err != nil {
			t.Fatal(err)
		}
		st := resp.GetStatuses()[0]
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetCurrentLimit() != nil {
			t.Fatalf("check %d in shadow mode: overall %v, descriptor %v with limit %v; want OK, OK and no limit",
				i+1, resp.GetOverallCode(), st.GetCode(), st.GetCurrentLimit())
		}
	}
}

// With RequireRules, a sidecar holding only the empty, unversioned set it
// starts with (its rules come from a Redis that has none) is unready; a set
// loaded later, even an empty one pushed on purpose, makes it ready.
func TestReadyNeedsRules(t *testing.T) {
	lim, err := enforcer.New(redistest.Server(t), rules.NewSet("", 0, nil), enforcer.Options{Budget: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := sidecar.New(lim, sidecar.Options{RequireRules: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Ready(context.Background()); !errors.Is(err, sidecar.ErrNoRules) {
		t.Fatalf("ready with no rule set: %v, want ErrNoRules", err)
	}
	lim.SetRules(rules.NewSet("t", 3, nil))
	if err := srv.Ready(context.Background()); err != nil {
		t.Fatalf("ready with a pushed (empty) set: %v", err)
	}
}

// With RequireRedis, a Redis that answers PING but not within the
// decisions' budget, so that the circuit breaker opens, makes the sidecar
// unready; without it, the sidecar stays ready.
func TestReadyNeedsTheBreakerClosed(t *testing.T) {
	px := redistest.NewProxy(t, redistest.Addr(t))
	slow := redis.NewClient(&redis.Options{Addr: px.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { slow.Close() })
	set, err := rules.Parse("t.yaml", []byte(testRules))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := enforcer.New(slow, set, enforcer.Options{Budget: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	strict, err := sidecar.New(lim, sidecar.Options{Redis: slow, RequireRedis: true})
	if err != nil {
		t.Fatal(err)
	}
	lenient, err := sidecar.New(lim, sidecar.Options{Redis: slow})
	if err != nil {
		t.Fatal(err)
	}
	px.Inject(redistest.Delay, 100*time.Millisecond) // PING answers within its 500 ms; decisions do not within 5 ms
	var req enforcer.Request
	req.Descriptors[rules.KeyUser] = "u"
	// Under load more than 50 may be needed: a timeout in a stall of this
	// process does not count against Redis (enforcer.ErrStalled).
	for deadline := time.Now().Add(30 * time.Second); !lim.BreakerOpen(); {
		if time.Now().After(deadline) {
			t.Fatal("the breaker did not open within 30 s of decisions past their budget")
		}
		if _, err := lim.Check(context.Background(), &req); err != nil {
			t.Fatal(err)
		}
	}
	if err := strict.Ready(context.Background()); !errors.Is(err, sidecar.ErrBreakerOpen) {
		t.Errorf("ready with the breaker open: %v, want ErrBreakerOpen", err)
	}
	if err := lenient.Ready(context.Background()); err != nil {
		t.Errorf("ready without RequireRedis: %v, want ready", err)
	}
}

// TestReadyNamesARefusingRedis: found by a fresh user. A Redis that
// starts refusing connections opens the circuit breaker within
// milliseconds; /readyz, whose PING answer of a moment before was kept for
// a second, said "answers PING, but the circuit breaker is open: too slow
// for the budget". With the breaker open, readiness asks Redis again.
func TestReadyNamesARefusingRedis(t *testing.T) {
	srv := sidecarWithBreakerOpen(t, redistest.Refuse, sidecar.Options{RequireRedis: true})
	time.Sleep(150 * time.Millisecond) // past the open breaker's 100 ms cache, not the second's
	err := srv.Ready(context.Background())
	if err == nil || errors.Is(err, sidecar.ErrBreakerOpen) {
		t.Fatalf("ready with Redis refusing connections: %v; want Redis's own error", err)
	}
	t.Logf("ready: %v", err)
}

// TestOtherDomainIsCountedAndLogged: a check for a domain the rule set
// does not have is allowed (no rule matches, as in envoyproxy/ratelimit),
// and counted and logged, once however many come, so that a gateway and a
// rule file that disagree on the domain do not turn limits off silently.
func TestOtherDomainIsCountedAndLogged(t *testing.T) {
	var logs strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), nil))
	e := newEnv(t, redistest.Server(t), testRules, sidecar.Options{Logger: logger})
	for range 5 {
		if resp := e.check(t, rlReq("not-t", desc("user", "u1"))); resp.OverallCode != ok || len(resp.Statuses) != 1 || resp.Statuses[0].CurrentLimit != nil {
			t.Fatalf("other domain: %v, want OK with no limit", resp)
		}
	}
	e.check(t, rlReq("t", desc("user", "u1")))
	if got := counter(t, e.reg, "sluice_sidecar_other_domain_checks_total"); got != 5 {
		t.Errorf("other-domain checks counted %v, want 5", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if n := strings.Count(logs.String(), "domain=not-t"); n != 1 {
		t.Errorf("%d warnings naming the domain, want 1:\n%s", n, logs.String())
	}
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// sidecarWithBreakerOpen returns a sidecar (so, with its Redis set) whose
// limiter's Redis, reached through a proxy, was ready and then took fault
// until decisions opened the circuit breaker (a budget of 50 ms, two
// failures).
func sidecarWithBreakerOpen(t *testing.T, fault redistest.Fault, so sidecar.Options) *sidecar.Server {
	t.Helper()
	px := redistest.NewProxy(t, redistest.Addr(t))
	rdb := redis.NewClient(&redis.Options{Addr: px.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true, DialerRetries: 1})
	t.Cleanup(func() { rdb.Close() })
	set, err := rules.Parse("t.yaml", []byte(testRules))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := enforcer.New(rdb, set, enforcer.Options{Budget: 50 * time.Millisecond, Breaker: enforcer.BreakerOptions{Failures: 2}})
	if err != nil {
		t.Fatal(err)
	}
	so.Redis = rdb
	srv, err := sidecar.New(lim, so)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Ready(context.Background()); err != nil {
		t.Fatalf("ready with Redis up: %v", err)
	}
	px.Inject(fault, 0)
	var req enforcer.Request
	req.Descriptors[rules.KeyUser] = "u"
	for deadline := time.Now().Add(30 * time.Second); !lim.BreakerOpen(); {
		if time.Now().After(deadline) {
			t.Fatalf("the breaker did not open within 30 s of decisions with Redis faulted (%v)", fault)
		}
		if _, err := lim.Check(context.Background(), &req); err != nil {
			t.Fatal(err)
		}
	}
	return srv
}
