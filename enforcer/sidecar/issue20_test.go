package sidecar_test

import (
	"context"
	"fmt"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/sluice-rl/sluice/enforcer/sidecar"
	"github.com/sluice-rl/sluice/internal/redistest"
)

// TestOverrideIgnoresRequestIDAndUserAgent: a limit override of 10 per
// minute for client_id=same-client, each call with a fresh request_id (as
// docs/enforcement.md tells users to send) or user_agent entry, allows 10
// calls and makes one counter (envoyproxy/ratelimit #275).
func TestOverrideIgnoresRequestIDAndUserAgent(t *testing.T) {
	const envoyRules = "domain: t\ndescriptors:\n  - key: client_id\n    rate_limit: {unit: hour, requests_per_unit: 1000}\n"
	for _, extra := range []string{"request_id", "x-request-id", "user_agent", "User-Agent"} {
		t.Run(extra, func(t *testing.T) {
			rdb := redistest.Server(t)
			e := newEnv(t, rdb, envoyRules, sidecar.Options{})
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
