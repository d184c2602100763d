package sidecar_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/enforcer/sidecar"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/internal/storetest"
	"github.com/sluice-rl/sluice/rules"
)

// TestOverrideIgnoresRequestIDAndUserAgent: a limit override of 10 per
// minute for client_id=same-client, each call with a fresh request_id (as
// docs/enforcement.md tells users to send) or user_agent entry, allows 10
// calls and makes one counter (envoyproxy/ratelimit #275). The enforcer's
// clock stands still in the middle of a minute: the limit is a fixed window,
// and 200 calls that straddled a minute's end counted in two windows (20
// allowed, two keys; seen under load).
func TestOverrideIgnoresRequestIDAndUserAgent(t *testing.T) {
	const envoyRules = "domain: t\ndescriptors:\n  - key: client_id\n    rate_limit: {unit: hour, requests_per_unit: 1000}\n"
	midMinute := time.Now().Truncate(time.Minute).Add(30 * time.Second)
	for _, extra := range []string{"request_id", "x-request-id", "user_agent", "User-Agent"} {
		t.Run(extra, func(t *testing.T) {
			rdb := redistest.Server(t)
			e := newEnv(t, rdb, envoyRules, sidecar.Options{}, func(o *enforcer.Options) {
				o.Clock = func() time.Time { return midMinute }
			})
			allowed := 0
			for i := range 200 {
				d := desc("client_id", "same-client", extra, fmt.Sprintf("9b2f1c1e-%04d-4a43-b0a1-6f1b0c6e%04d", i, i))
				d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 10, Unit: typev3.RateLimitUnit_MINUTE}
				if e.check(t, rlReq("t", d)).GetOverallCode() == ok {
					allowed++
				}
			}
			if allowed != 10 {
				t.Errorf("%d of 200 calls allowed, want 10", allowed)
			}
			if n := rdb.DBSize(context.Background()).Val(); n != 1 {
				t.Errorf("%d Redis keys, want one counter", n)
			}
		})
	}
}

// TestEnvoyAllowListsOneIPv6Address: an envoyproxy/ratelimit config that
// allow-lists remote_address=2001:db8::7 (unlimited: true) beside a limit
// of 2 per minute per address lets that address through, while another
// address gets OVER_LIMIT on its third call (envoyproxy/ratelimit #365).
func TestEnvoyAllowListsOneIPv6Address(t *testing.T) {
	const cfg = `
domain: edge
descriptors:
  - key: remote_address
    value: 2001:db8::7
    rate_limit: {unlimited: true}
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2}
`
	e := newEnv(t, redistest.Server(t), cfg, sidecar.Options{})
	for i := range 20 {
		if resp := e.check(t, rlReq("edge", desc("remote_address", "2001:db8::7"))); resp.GetOverallCode() != ok {
			t.Fatalf("call %d from the allow-listed 2001:db8::7: %v", i+1, resp)
		}
	}
	for i := range 3 {
		want := ok
		if i == 2 {
			want = over
		}
		if resp := e.check(t, rlReq("edge", desc("remote_address", "2001:db8:1::9"))); resp.GetOverallCode() != want {
			t.Errorf("call %d from 2001:db8:1::9: %v, want %v", i+1, resp.GetOverallCode(), want)
		}
	}
}

// TestClientIPThatIsNoAddress: a client_ip that looks like an address but is
// none (999.1.1.1, " 999.1.1.1", 01.2.3.4) gets no bucket of its own, so
// 01.2.3.4 cannot dodge 1.2.3.4's: the check is refused, INVALID_ARGUMENT
// over gRPC and 400 over HTTP, naming the descriptor and the entry, and
// counted. A name (a hostname) is keyed as it is, and counted.
func TestClientIPThatIsNoAddress(t *testing.T) {
	const cfg = "domain: t\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"
	e := newEnv(t, redistest.Server(t), cfg, sidecar.Options{})
	if resp := e.check(t, rlReq("t", desc("remote_address", "1.2.3.4"))); resp.GetOverallCode() != ok {
		t.Fatalf("first call of 1.2.3.4: %v", resp)
	}
	for _, v := range []string{"999.1.1.1", " 999.1.1.1", "01.2.3.4", "2001:db8::1::2"} {
		resp, err := e.rls.ShouldRateLimit(context.Background(), rlReq("t", desc("generic_key", "g"), desc("remote_address", v)))
		want := fmt.Sprintf("descriptor 2: entry remote_address: %q: not an IP address", v) // the second, counted from 1
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v %v, want INVALID_ARGUMENT with %s", v, resp, err, want)
		}
	}
	hr, out := post(t, e.http.URL+"/v1/check", `{"domain": "t", "descriptors": [{"entries": [{"key": "remote_address", "value": "01.2.3.4"}]}]}`)
	if hr.StatusCode != http.StatusBadRequest || !strings.Contains(out, "entry remote_address") {
		t.Errorf("/v1/check with 01.2.3.4: %d %s, want 400 naming the entry", hr.StatusCode, out)
	}
	if got := e.metric(t, "sluice_enforcer_client_ip_refused_total"); got != 5 {
		t.Errorf("sluice_enforcer_client_ip_refused_total %v, want 5", got)
	}
	// A hostname (as in an old log) is a name: keyed as it is, in a space no
	// address reaches, and counted.
	for i, want := range []rlsv3.RateLimitResponse_Code{ok, over} {
		if resp := e.check(t, rlReq("t", desc("remote_address", "piweba3y.prodigy.com"))); resp.GetOverallCode() != want {
			t.Errorf("hostname, call %d: %v, want %v", i+1, resp.GetOverallCode(), want)
		}
	}
	if got := e.metric(t, "sluice_enforcer_client_ip_names_total"); got != 2 {
		t.Errorf("sluice_enforcer_client_ip_names_total %v, want 2", got)
	}
}

// metric is the value of the unlabelled counter name on the env's registry.
func (e *env) metric(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestZeroShareOverGRPC: a fresh share of 0 answers OVER_LIMIT with a limit
// of 0, Retry-After until the next share can arrive and Sluice-Reason:
// no_share.
func TestZeroShareOverGRPC(t *testing.T) {
	rdb := redistest.Server(t)
	set, err := rules.Parse("g.yaml", []byte("domain: t\nrules: [{id: g, match: [{key: user}], limit: 10, period: 1s, global: true}]"))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := enforcer.New(rdb, set, enforcer.Options{Budget: time.Second, Regions: 2, ShareRefresh: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	tag := rules.EntityTag(set.Rule("g"), &rules.Descriptors{rules.KeyUser: "zero"})
	storetest.PutShares(t, rdb, rules.Share{RuleID: "g", Key: tag, Region: "local", Fraction: 0, Version: 1, ComputedAt: time.Now()})
	if err := lim.Refresh(context.Background(), time.Now()); err != nil {
		t.Fatal(err)
	}
	srv, err := sidecar.New(lim, sidecar.Options{Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	rls := rlsv3.NewRateLimitServiceClient(serveGRPC(t, srv))
	resp, err := rls.ShouldRateLimit(context.Background(), rlReq("t", desc("user_id", "zero")))
	if err != nil {
		t.Fatal(err)
	}
	st := resp.GetStatuses()[0]
	if resp.GetOverallCode() != over || st.GetCode() != over || st.GetCurrentLimit().GetRequestsPerUnit() != 0 ||
		header(resp, "Retry-After") != "2" || header(resp, "Sluice-Reason") != "no_share" {
		t.Errorf("under a share of 0: %v", resp)
	}
}

// TestReloadKeepsCounters: an envoyproxy config whose alpha limit (3 per
// hour, named shared-name) is exhausted, then reloaded with a beta limit of
// the same name added before it, keeps denying alpha (hookaido #239: alpha
// was renamed and refilled).
func TestReloadKeepsCounters(t *testing.T) {
	const alpha = "  - key: generic_key\n    value: alpha\n    rate_limit: {unit: hour, requests_per_unit: 3, name: shared-name}\n"
	const beta = "  - key: generic_key\n    value: beta\n    rate_limit: {unit: hour, requests_per_unit: 50, name: shared-name}\n"
	v1, err := rules.Parse("v1.yaml", []byte("domain: t\ndescriptors:\n"+alpha))
	if err != nil {
		t.Fatal(err)
	}
	v2, err := rules.Parse("v2.yaml", []byte("domain: t\ndescriptors:\n"+beta+alpha))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := enforcer.New(redistest.Server(t), v1, enforcer.Options{Budget: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := sidecar.New(lim, sidecar.Options{Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	rls := rlsv3.NewRateLimitServiceClient(serveGRPC(t, srv))
	code := func() rlsv3.RateLimitResponse_Code {
		t.Helper()
		resp, err := rls.ShouldRateLimit(context.Background(), rlReq("t", desc("generic_key", "alpha")))
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetOverallCode()
	}
	for i := range 3 {
		if c := code(); c != ok {
			t.Fatalf("call %d under v1: %v", i+1, c)
		}
	}
	lim.SetRules(v2)
	for i := range 3 {
		if c := code(); c != over {
			t.Errorf("call %d after the reload: %v, want OVER_LIMIT (alpha is exhausted)", i+1, c)
		}
	}
}
