package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer/sidecar"
	"github.com/sluice-rl/sluice/pipeline"
)

// TestRunStopsCleanly: Run serves both APIs and, once its context ends,
// drains, returns nil and leaves no goroutine behind.
func TestRunStopsCleanly(t *testing.T) {
	before := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan [2]net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- runServe(ctx, serveConfig{
			GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Refresh: 20 * time.Millisecond,
			Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
			Listening: func(g, h net.Addr) { addrs <- [2]net.Addr{g, h} },
		})
	}()
	var a [2]net.Addr
	select {
	case a = <-addrs:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	}
	conn, err := grpc.NewClient(a[0].String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, rlReq("sluice", "tenant_id", "t1"))
	if err != nil || resp.GetStatuses()[0].GetCurrentLimit().GetName() != "tenant-daily" {
		t.Errorf("gRPC: %v %v", resp, err)
	}
	conn.Close()
	hc := &http.Client{}
	r, err := hc.Get("http://" + a[1].String() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	hc.CloseIdleConnections()
	time.Sleep(50 * time.Millisecond) // a few refreshes
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after cancel: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return within 15 s of its context's end")
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		var buf bytes.Buffer
		_ = pprof.Lookup("goroutine").WriteTo(&buf, 1)
		t.Errorf("%d goroutines after Run returned, %d before:\n%s", n, before, buf.String())
	}
}

// TestRunLogsDecisionRecords: with brokers, every check's decision record
// reaches Kafka, flushed at shutdown.
func TestRunLogsDecisionRecords(t *testing.T) {
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, pipeline.DefaultTopic))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- runServe(ctx, serveConfig{
			GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Brokers: kc.ListenAddrs(),
			Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
			Listening: func(g, _ net.Addr) { addrs <- g },
		})
	}()
	var addr net.Addr
	select {
	case addr = <-addrs:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	}
	conn, err := grpc.NewClient(addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	cl := rlsv3.NewRateLimitServiceClient(conn)
	for _, ip := range []string{"192.0.2.1", "192.0.2.2"} {
		if _, err := cl.ShouldRateLimit(ctx, rlReq("sluice", "remote_address", ip)); err != nil {
			t.Fatal(err)
		}
	}
	conn.Close()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	cons, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...), kgo.ConsumeTopics(pipeline.DefaultTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	var ips []string
	deadline := time.Now().Add(10 * time.Second)
	for len(ips) < 2 && time.Now().Before(deadline) {
		pctx, pcancel := context.WithTimeout(context.Background(), time.Second)
		cons.PollFetches(pctx).EachRecord(func(r *kgo.Record) {
			d, err := decision.Decode(r.Value)
			if err != nil {
				t.Errorf("record: %v", err)
				return
			}
			ips = append(ips, d.GetDescriptors().GetClientIp())
			if d.GetDomain() != "sluice" || len(d.GetMatchedRules()) != 1 {
				t.Errorf("record %v", d)
			}
		})
		pcancel()
	}
	if strings.Join(ips, ",") != "192.0.2.1,192.0.2.2" {
		t.Errorf("records for %v, want the two checks' client IPs", ips)
	}
}

func TestExampleRules(t *testing.T) {
	s := sidecar.ExampleRules()
	if s.Domain != "sluice" || len(s.Rules) != 4 || !strings.Contains(s.Rules[0].ID, "-") {
		t.Errorf("example rules: domain %q, %d rules", s.Domain, len(s.Rules))
	}
}

// rlReq is a rate limit request of one descriptor of one entry.
func rlReq(domain, key, value string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: key, Value: value}}}}}
}
