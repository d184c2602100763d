package sidecar_test

import (
	"context"
	"testing"
	"time"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/enforcer/sidecar"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// TestAccessLogMovesAdaptiveLimits: response statuses that Envoy's access
// log reports through the sidecar's AccessLogService reach the adaptive
// controller (StatusJoinOptions.Observe): 5xx answers make an adaptive
// rule's limit in the check's answer fall, never below its floor, and
// healthy answers make it rise back.
func TestAccessLogMovesAdaptiveLimits(t *testing.T) {
	set, err := rules.Parse("a.yaml", []byte(`
domain: t
rules: [{id: search, match: [{key: route}], limit: 100, period: 1s, adaptive: {floor: 0.5}}]
`))
	if err != nil {
		t.Fatal(err)
	}
	var lim *enforcer.Limiter
	join, err := sidecar.NewStatusJoin(&recorder{}, sidecar.StatusJoinOptions{Wait: time.Hour,
		Observe: func(now time.Time, status int, latency time.Duration) { lim.ObserveResponse(now, status, latency) }})
	if err != nil {
		t.Fatal(err)
	}
	lim, err = enforcer.New(redistest.Server(t), set, enforcer.Options{Budget: time.Second, Sink: join,
		Adaptive: enforcer.AdaptiveOptions{Interval: 20 * time.Millisecond, MinSamples: 5}})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := sidecar.New(lim, sidecar.Options{Registry: prometheus.NewRegistry(), StatusJoin: join})
	if err != nil {
		t.Fatal(err)
	}
	conn := serveGRPC(t, srv)
	rls := rlsv3.NewRateLimitServiceClient(conn)
	limit := func() uint32 {
		resp, err := rls.ShouldRateLimit(context.Background(), rlReq("t", desc("route", "/v1/search")))
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
	}
	if got := limit(); got != 100 {
		t.Fatalf("limit before any status: %d", got)
	}
	stream, err := alsv3.NewAccessLogServiceClient(conn).StreamAccessLogs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	send := func(code uint32) {
		es := make([]*accesslogv3.HTTPAccessLogEntry, 10)
		for i := range es {
			es[i] = entry("", code)
		}
		if err := stream.Send(httpLog(es...)); err != nil {
			t.Fatal(err)
		}
	}
	// Statuses are read by the server as they come: drive until the limit
	// moves (each interval of 20 ms with 5 or more statuses is one step).
	lowest := uint32(100)
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline) && lowest > 50; {
		send(503)
		lowest = min(lowest, limit())
	}
	if lowest != 50 {
		t.Fatalf("under 503s the limit fell to %d, want its floor, 50", lowest)
	}
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline) && limit() < 100; {
		send(200)
	}
	if got := limit(); got != 100 {
		t.Fatalf("after healthy answers the limit is %d, want 100", got)
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
}
