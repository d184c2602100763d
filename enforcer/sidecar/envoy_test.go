package sidecar_test

import (
	"context"
	"os"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/enforcer/sidecar"
	"github.com/sluice-rl/sluice/internal/redistest"
)

// envoyConfig returns an envoyproxy/ratelimit config from testdata/rules,
// loaded unchanged.
func envoyConfig(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile("../../testdata/rules/" + file)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestEnvoyConfigsOverGRPC: envoyproxy/ratelimit's README configs, loaded
// unchanged, answer Envoy's requests as envoyproxy/ratelimit does: the
// limit of the descriptor's exact path, custom keys included.
func TestEnvoyConfigsOverGRPC(t *testing.T) {
	rdb := redistest.Server(t)
	call := func(e *env, r *rlsv3.RateLimitRequest) (rlsv3.RateLimitResponse_Code, []*rlsv3.RateLimitResponse_DescriptorStatus) {
		t.Helper()
		resp, err := e.rls.ShouldRateLimit(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetOverallCode(), resp.GetStatuses()
	}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT

	t.Run("messaging", func(t *testing.T) {
		e := newEnv(t, rdb, envoyConfig(t, "envoy-messaging.good.yaml"), sidecar.Options{})
		// Two descriptors, as the README's example sends them: marketing
		// messages to one number (5 a day), and any message to it (100).
		req := rlReq("messaging", desc("message_type", "marketing", "to_number", "2061234567"), desc("to_number", "2061234567"))
		for i := range 5 {
			code, st := call(e, req)
			if code != ok || st[0].GetCurrentLimit().GetRequestsPerUnit() != 5 || st[1].GetCurrentLimit().GetRequestsPerUnit() != 100 {
				t.Fatalf("message %d: %v %v, want OK under limits of 5 and 100", i, code, st)
			}
		}
		code, st := call(e, req)
		if code != over || st[0].GetCode() != over || st[1].GetCode() != ok {
			t.Errorf("6th marketing message: %v %v, want the 5-a-day limit over", code, st)
		}
		// A transactional message to the number is not marketing: only the 100.
		code, st = call(e, rlReq("messaging", desc("message_type", "transactional", "to_number", "2061234567"), desc("to_number", "2061234567")))
		if code != ok || st[0].GetCurrentLimit() != nil || st[1].GetCurrentLimit().GetRequestsPerUnit() != 100 {
			t.Errorf("transactional: %v %v, want no limit on the first descriptor", code, st)
		}
	})
	t.Run("edge proxy per ip", func(t *testing.T) {
		// envoyproxy/ratelimit's limits are fixed windows (rules/envoy.go),
		// chosen on the enforcer's clock: pinned, all 11 requests fall in
		// one second's window however slowly they are decided. On the wall
		// clock the 11th opened a new window when the requests straddled a
		// second (at load 11, 0.08 s for the subtest: 1 run in some 12).
		at := time.Now()
		e := newEnv(t, rdb, envoyConfig(t, "envoy-edge-proxy-per-ip.good.yaml"), sidecar.Options{},
			func(o *enforcer.Options) { o.Clock = func() time.Time { return at } })
		code, st := call(e, rlReq("edge_proxy_per_ip", desc("remote_address", "50.0.0.5")))
		if l := st[0].GetCurrentLimit(); code != over || l.GetRequestsPerUnit() != 0 || l.GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND {
			t.Errorf("the blocked address: %v %v, want OVER_LIMIT at 0 per SECOND", code, st)
		}
		if st[0].GetDurationUntilReset() != nil {
			t.Errorf("the blocked address: duration until reset %v, want none: a limit of 0 never resets", st[0].GetDurationUntilReset())
		}
		for i := range 10 {
			if code, _ := call(e, rlReq("edge_proxy_per_ip", desc("remote_address", "50.0.0.6"))); code != ok {
				t.Fatalf("request %d of another address: %v", i, code)
			}
		}
		if code, _ := call(e, rlReq("edge_proxy_per_ip", desc("remote_address", "50.0.0.6"))); code != over {
			// A degraded decision (Redis unanswered within the budget)
			// is the local fallback's, which may allow it.
			t.Errorf("11th request in a second: %v, want OVER_LIMIT (%v decisions degraded)", code, counter(t, e.reg, "sluice_enforcer_degraded_decisions_total"))
		}
		// Another domain matches nothing.
		if code, st := call(e, rlReq("other", desc("remote_address", "50.0.0.5"))); code != ok || st[0].GetCurrentLimit() != nil {
			t.Errorf("another domain: %v %v", code, st)
		}
	})
	t.Run("mongo custom key", func(t *testing.T) {
		e := newEnv(t, rdb, envoyConfig(t, "envoy-mongo-cps.good.yaml"), sidecar.Options{})
		code, st := call(e, rlReq("mongo_cps", desc("database", "users")))
		if code != ok || st[0].GetCurrentLimit().GetRequestsPerUnit() != 500 {
			t.Errorf("database users: %v %v, want a limit of 500", code, st)
		}
		if _, st := call(e, rlReq("mongo_cps", desc("database", "other"))); st[0].GetCurrentLimit() != nil {
			t.Errorf("a database with no limit: %v", st)
		}
	})
}
