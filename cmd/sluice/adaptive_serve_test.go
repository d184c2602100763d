package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/twmb/franz-go/pkg/kfake"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/pipeline"
)

// TestServeAdaptiveLimitsFollowAccessLog: through `sluice serve` (with
// Kafka, so that it runs the status join), response statuses reported on
// Envoy's AccessLogService move an adaptive rule: 503s make the limit in
// the check's answer fall to its floor, 200s make it rise back; the log
// carries the evidence of each change.
func TestServeAdaptiveLimitsFollowAccessLog(t *testing.T) {
	t.Parallel() // its own kfake and redis-server; it waits on the controller's 1 s intervals
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, pipeline.DefaultTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	file := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(file, []byte(`
domain: api
rules: [{id: search, match: [{key: route}], limit: 100, period: 1s, adaptive: {floor: 0.5}}]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	grpcAddr, _, log := serve(t, "--redis", redistest.Addr(t), "--rules", file, "--brokers", kc.ListenAddrs()[0])
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlsv3.NewRateLimitServiceClient(conn)
	limit := func() uint32 {
		resp, err := rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "route", Value: "/v1/search"}}}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
	}
	if got := limit(); got != 100 {
		t.Fatalf("before any status: limit %d", got)
	}
	stream, err := alsv3.NewAccessLogServiceClient(conn).StreamAccessLogs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	send := func(code uint32) {
		es := make([]*accesslogv3.HTTPAccessLogEntry, 20)
		for i := range es {
			es[i] = &accesslogv3.HTTPAccessLogEntry{Response: &accesslogv3.HTTPResponseProperties{ResponseCode: wrapperspb.UInt32(code)}}
		}
		msg := &alsv3.StreamAccessLogsMessage{LogEntries: &alsv3.StreamAccessLogsMessage_HttpLogs{
			HttpLogs: &alsv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: es}}}
		if err := stream.Send(msg); err != nil {
			t.Fatal(err)
		}
	}
	// The controller judges a second of statuses at a time (the default
	// interval): report a batch every 100 ms until the limit moves.
	fell := false
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && !fell; time.Sleep(100 * time.Millisecond) {
		send(503)
		fell = limit() == 50
	}
	if !fell {
		t.Fatalf("under 503s the limit is %d, want its floor, 50\n%s", limit(), log)
	}
	rose := false
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline) && !rose; time.Sleep(100 * time.Millisecond) {
		send(200)
		rose = limit() == 100
	}
	if !rose {
		t.Fatalf("after 200s the limit is %d, want 100", limit())
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`why="error rate above target"`, `why=healthy`} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("no factor change %s in the log", want)
		}
	}
}
