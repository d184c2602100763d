package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer/sidecar"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/internal/syncbuf"
	"github.com/sluice-rl/sluice/pipeline"
)

// serveAsync runs sluice serve with c in the background until ctx ends, on
// free loopback ports with a silent logger unless c sets them, and returns
// its gRPC and HTTP addresses once it listens, with where its error will
// go; or the error it returned before listening.
func serveAsync(t *testing.T, ctx context.Context, c serveConfig) ([2]net.Addr, chan error, error) {
	t.Helper()
	if c.GRPCAddr == "" {
		c.GRPCAddr = "127.0.0.1:0"
	}
	if c.HTTPAddr == "" {
		c.HTTPAddr = "127.0.0.1:0"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	addrs := make(chan [2]net.Addr, 1)
	c.Listening = func(g, h net.Addr) { addrs <- [2]net.Addr{g, h} }
	done := make(chan error, 1)
	go func() { done <- runServe(ctx, c) }()
	select {
	case a := <-addrs:
		return a, done, nil
	case err := <-done:
		return [2]net.Addr{}, nil, err
	case <-time.After(30 * time.Second):
		t.Fatal("runServe neither listened nor failed within 30 s")
		return [2]net.Addr{}, nil, nil
	}
}

// mustServe is serveAsync that fails the test if serve does not listen.
func mustServe(t *testing.T, ctx context.Context, c serveConfig) ([2]net.Addr, chan error) {
	t.Helper()
	a, done, err := serveAsync(t, ctx, c)
	if err != nil {
		t.Fatalf("serve: %v", err)
	}
	return a, done
}

// TestPortInUseSaidFirst: found by a fresh user. A listener's address in
// use was said only after the Redis checks and the warm-up: with Redis down
// the user learned of Redis first (or, with --redis-start-degraded, of the
// port seconds later). The listeners are bound first: with Redis refusing
// connections and each listener's address taken in turn, serve returns the
// listener's error having logged nothing of Redis (it did not get that
// far), and leaves no listener of its own open.
func TestPortInUseSaidFirst(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	refused, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := refused.Addr().String()
	refused.Close() // nothing listens there: Redis refuses connections
	free := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().String()
	}
	for _, tc := range []struct {
		name string
		c    serveConfig
		want string
	}{
		{"grpc", serveConfig{GRPCAddr: taken.Addr().String()}, "gRPC listener"},
		{"http", serveConfig{GRPCAddr: free(), HTTPAddr: taken.Addr().String()}, "HTTP listener"},
		{"admin", serveConfig{GRPCAddr: free(), HTTPAddr: free(), AdminAddr: taken.Addr().String()}, "admin HTTP listener"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logged syncbuf.Buffer
			tc.c.Redis = []string{dead}
			tc.c.Logger = slog.New(slog.NewTextHandler(&logged, nil))
			_, _, err := serveAsync(t, context.Background(), tc.c)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "address already in use") {
				t.Fatalf("serve with %s's address in use and Redis refusing: %v; want the %s's error", tc.name, err, tc.want)
			}
			if strings.Contains(strings.ToLower(logged.String()), "redis") {
				t.Errorf("serve spoke of Redis before finding its address in use:\n%s", logged.String())
			}
			// Its own listeners are closed: the addresses it bound are free again.
			for _, a := range []string{tc.c.GRPCAddr, tc.c.HTTPAddr} {
				if a == taken.Addr().String() {
					continue
				}
				l, err := net.Listen("tcp", a)
				if err != nil {
					t.Errorf("%s still bound after serve failed: %v", a, err)
					continue
				}
				l.Close()
			}
		})
	}
}

// TestRunStopsCleanly: Run serves both APIs and, once its context ends,
// drains, returns nil and leaves no goroutine behind.
func TestRunStopsCleanly(t *testing.T) {
	before := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	a, done := mustServe(t, ctx, serveConfig{Refresh: 20 * time.Millisecond})
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
	a, done := mustServe(t, ctx, serveConfig{Brokers: kc.ListenAddrs()})
	addr := a[0]
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

// TestServeDrainSequence (issue 20, item 10): on shutdown the sidecar is
// unready (/readyz 503, gRPC health NOT_SERVING) for DrainDelay while it
// still answers checks on both APIs; then its listeners close, a check in
// flight at that moment still finishes, and runServe returns nil. Before,
// the listeners closed at once: a probe saw 200, then a refused connection.
func TestServeDrainSequence(t *testing.T) {
	proxy := redistest.NewProxy(t, redistest.Addr(t))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addrs := make(chan [2]net.Addr, 1)
	done := make(chan error, 1)
	const delay = 1500 * time.Millisecond
	c := serveConfig{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Redis: []string{proxy.Addr()},
		DrainDelay: delay, DrainTimeout: 5 * time.Second,
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		Listening: func(g, h net.Addr) { addrs <- [2]net.Addr{g, h} },
	}
	c.Limiter.Budget = 3 * time.Second // the slow check below is decided by Redis
	go func() { done <- runServe(ctx, c) }()
	var a [2]net.Addr
	select {
	case a = <-addrs:
	case err := <-done:
		t.Fatalf("runServe: %v", err)
	}
	conn, err := grpc.NewClient(a[0].String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls, health := rlsv3.NewRateLimitServiceClient(conn), healthpb.NewHealthClient(conn)
	hc := &http.Client{Timeout: 10 * time.Second}
	get := func(path string) (int, error) {
		r, err := hc.Get("http://" + a[1].String() + path)
		if err != nil {
			return 0, err
		}
		r.Body.Close()
		return r.StatusCode, nil
	}
	check := func(c *http.Client) (int, error) {
		r, err := c.Post("http://"+a[1].String()+"/v1/check", "application/json",
			strings.NewReader(`{"domain":"sluice","descriptors":[{"entries":[{"key":"tenant_id","value":"t1"}]}]}`))
		if err != nil {
			return 0, err
		}
		r.Body.Close()
		return r.StatusCode, nil
	}
	if code, err := get("/readyz"); code != http.StatusOK {
		t.Fatalf("readyz before shutdown: %d %v", code, err)
	}
	stop := time.Now()
	cancel()
	// Unready, still answering.
	for time.Since(stop) < delay/3 {
		if code, err := get("/readyz"); code != http.StatusServiceUnavailable {
			t.Fatalf("readyz %v after shutdown began: %d %v, want 503", time.Since(stop), code, err)
		}
		h, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{})
		if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("gRPC health %v after shutdown began: %v %v, want NOT_SERVING", time.Since(stop), h, err)
		}
		if resp, err := rls.ShouldRateLimit(context.Background(), rlReq("sluice", "tenant_id", "t1")); err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("gRPC check while unready: %v %v", resp, err)
		}
		if code, err := check(hc); code != http.StatusOK {
			t.Fatalf("HTTP check while unready: %d %v", code, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := ctxErr(done); err != nil {
		t.Fatalf("runServe returned during the delay: %v", err)
	}
	// A check that is in flight when the listeners close: Redis's replies
	// now take 1 s.
	proxy.Inject(redistest.Delay, time.Second)
	time.Sleep(delay - time.Since(stop) - 200*time.Millisecond)
	inflight := make(chan error, 1)
	go func() {
		code, err := check(&http.Client{Timeout: 10 * time.Second})
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("status %d", code)
		}
		inflight <- err
	}()
	// Then the listeners close: new connections are refused.
	for {
		if _, err := net.DialTimeout("tcp", a[1].String(), time.Second); err != nil {
			break
		}
		if time.Since(stop) > delay+2*time.Second {
			t.Fatal("the HTTP listener still accepts 2 s after the drain delay")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if closed := time.Since(stop); closed < delay {
		t.Errorf("the listener closed %v after shutdown began, before the %v delay", closed, delay)
	}
	if err := ctxErr(done); err != nil {
		t.Fatalf("runServe returned with a check in flight: %v", err)
	}
	if err := <-inflight; err != nil {
		t.Errorf("the check in flight when the listeners closed: %v", err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("runServe after the drain: %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("runServe did not return within 10 s of the drain")
	}
}

// ctxErr returns what done holds without waiting, or nil.
func ctxErr(done chan error) error {
	select {
	case err := <-done:
		if err == nil {
			return errors.New("returned nil")
		}
		return err
	default:
		return nil
	}
}

// TestServeListensOnLoopbackForGRPC (issue 20, item 9; issue 35): `sluice
// serve`'s gRPC and HTTP APIs listen on loopback by default, for the
// gateway on its host; the probes and metrics on every interface, on the
// admin listener (TestOutsiderCannotReach dials them from outside).
func TestServeListensOnLoopbackForGRPC(t *testing.T) {
	f := serveCmd().Flags()
	for flag, want := range map[string]string{"grpc": "127.0.0.1:8081", "http": "127.0.0.1:8080", "admin-http": ":8082"} {
		if got := f.Lookup(flag).DefValue; got != want {
			t.Errorf("--%s default %q, want %s", flag, got, want)
		}
	}
}
