package sidecar_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/enforcer/sidecar"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// TestShedOverBothAPIs: a request refused by priority load shedding is
// answered 503 with Retry-After and Sluice-Reason: shed on /v1/check, and
// OVER_LIMIT with the same headers over gRPC (Envoy's filter turns every
// OVER_LIMIT into its rate_limited_status); one of a higher priority is
// decided by its rules.
func TestShedOverBothAPIs(t *testing.T) {
	set, err := rules.Parse("s.yaml", []byte(`
domain: t
rules: [{id: u, match: [{key: user}], limit: 10, period: 1s}]
shedding: {thresholds: {sheddable: 0.5, normal: 0.9, critical: 1}}
`))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := enforcer.New(redistest.Server(t), set, enforcer.Options{Budget: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := sidecar.New(lim, sidecar.Options{Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	lim.SetBackendLoad(0.6)
	rls := rlsv3.NewRateLimitServiceClient(serveGRPC(t, srv))
	resp, err := rls.ShouldRateLimit(context.Background(), rlReq("t", desc("user_id", "a", "priority", "sheddable")))
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetOverallCode() != over || resp.GetStatuses()[0].GetCode() != over ||
		header(resp, "Retry-After") != "1" || header(resp, "Sluice-Reason") != "shed" {
		t.Errorf("sheddable over gRPC at load 0.6: %v", resp)
	}
	resp, err = rls.ShouldRateLimit(context.Background(), rlReq("t", desc("user_id", "a", "priority", "normal")))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || header(resp, "Sluice-Reason") != "" {
		t.Errorf("normal over gRPC at load 0.6: %v %v", resp, err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	post := func(prio string) *http.Response {
		body := `{"domain":"t","descriptors":[{"entries":[{"key":"user_id","value":"b"},{"key":"priority","value":"` + prio + `"}]}]}`
		r, err := http.Post(hs.URL+"/v1/check", "application/json", bytes.NewBufferString(body))
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		return r
	}
	if r := post("sheddable"); r.StatusCode != http.StatusServiceUnavailable || r.Header.Get("Retry-After") != "1" || r.Header.Get("Sluice-Reason") != "shed" {
		t.Errorf("sheddable on /v1/check: %d Retry-After %q Sluice-Reason %q; want 503, 1, shed", r.StatusCode, r.Header.Get("Retry-After"), r.Header.Get("Sluice-Reason"))
	}
	if r := post("normal"); r.StatusCode != http.StatusOK {
		t.Errorf("normal on /v1/check: %d", r.StatusCode)
	}
}
