package sidecar_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/enforcer/sidecar"
	"github.com/sluice-rl/sluice/internal/benchrls"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// benchRequest is what Envoy sends for 4 rate-limit actions: 4 descriptors
// of one entry each.
func benchRequest() *rlsv3.RateLimitRequest {
	return benchrls.Request("u", "192.0.2.1", "t", "k")
}

const benchJSON = `{"domain":"b","descriptors":[{"entries":[{"key":"user_id","value":"u"}]},{"entries":[{"key":"remote_address","value":"192.0.2.1"}]},{"entries":[{"key":"tenant_id","value":"t"}]},{"entries":[{"key":"x-api-key","value":"k"}]}]}`

// benchServer is a sidecar over a local redis-server with benchrls's rules;
// with tracer, both the sidecar and the limiter trace every check.
func benchServer(b *testing.B, tracer ...trace.Tracer) (*enforcer.Limiter, *sidecar.Server) {
	b.Helper()
	var tr trace.Tracer
	if len(tracer) > 0 {
		tr = tracer[0]
	}
	set, err := rules.Parse("bench.yaml", []byte(benchrls.Rules))
	if err != nil {
		b.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	// HotKeys.Table -1: every check goes to Redis (one key, checked back to back, would
	// otherwise be served from leases).
	lim, err := enforcer.New(redistest.Server(b), set, enforcer.Options{Budget: time.Second, Registerer: reg, HotKeys: enforcer.HotKeyOptions{Table: -1}, Tracer: tr})
	if err != nil {
		b.Fatal(err)
	}
	srv, err := sidecar.New(lim, sidecar.Options{Registry: reg, Tracer: tr})
	if err != nil {
		b.Fatal(err)
	}
	return lim, srv
}

// reportCPU, called after the timer's reset, reports the process's CPU time
// (user and system, every thread: the server, go-redis, and a loopback
// client) per operation as cpu-ns/op when the returned func runs: on a
// busy machine it moves less than the wall time does.
func reportCPU(b *testing.B) func() {
	var r0 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &r0)
	return func() {
		var r1 syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &r1)
		ns := (r1.Utime.Nano() + r1.Stime.Nano()) - (r0.Utime.Nano() + r0.Stime.Nano())
		b.ReportMetric(float64(ns)/float64(b.N), "cpu-ns/op")
	}
}

func grpcClient(b *testing.B, srv *sidecar.Server) rlsv3.RateLimitServiceClient {
	b.Helper()
	return rlsv3.NewRateLimitServiceClient(serveGRPC(b, srv))
}

// BenchmarkGRPC measures one check of 4 descriptors against 4 rules on a
// local redis-server: "direct" calls ShouldRateLimit as a Go method (a
// fresh response per call), "loopback" goes through a gRPC client and
// server over loopback TCP in this process (client allocations included),
// one call at a time or from parallel goroutines.
func BenchmarkGRPC(b *testing.B) {
	ctx := context.Background()
	b.Run("direct", func(b *testing.B) {
		_, srv := benchServer(b)
		req := benchRequest()
		if _, err := srv.ShouldRateLimit(ctx, req); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		defer reportCPU(b)()
		for range b.N {
			if _, err := srv.ShouldRateLimit(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("loopback", func(b *testing.B) {
		_, srv := benchServer(b)
		cl := grpcClient(b, srv)
		req := benchRequest()
		if _, err := cl.ShouldRateLimit(ctx, req); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			if _, err := cl.ShouldRateLimit(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
	})
	parallel := func(b *testing.B, tracer ...trace.Tracer) {
		_, srv := benchServer(b, tracer...)
		cl := grpcClient(b, srv)
		if _, err := cl.ShouldRateLimit(ctx, benchRequest()); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		defer reportCPU(b)()
		b.RunParallel(func(pb *testing.PB) {
			req := benchRequest()
			for pb.Next() {
				if _, err := cl.ShouldRateLimit(ctx, req); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	b.Run("loopback-parallel", func(b *testing.B) { parallel(b) })
	// Tracing on, every check sampled: the spans' cost in the sidecar
	// (made, ended and batched; exported to nowhere), for
	// docs/benchmarks.md. With tracing off (above) no span is made.
	b.Run("loopback-parallel-traced", func(b *testing.B) {
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()), sdktrace.WithSampler(sdktrace.AlwaysSample()))
		defer tp.Shutdown(context.Background())
		parallel(b, tp.Tracer("bench"))
	})
}

// BenchmarkHTTP measures /v1/check with the same request: "handler" calls
// the handler with a recorded response, "loopback" posts over loopback TCP.
func BenchmarkHTTP(b *testing.B) {
	b.Run("handler", func(b *testing.B) {
		_, srv := benchServer(b)
		h := srv.Handler()
		body := strings.NewReader(benchJSON)
		req := httptest.NewRequest(http.MethodPost, "/v1/check", body)
		rec := httptest.NewRecorder()
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			body.Reset(benchJSON)
			rec.Body.Reset()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK {
				b.Fatal(rec.Code, rec.Body)
			}
		}
	})
	b.Run("loopback", func(b *testing.B) {
		_, srv := benchServer(b)
		hs := httptest.NewServer(srv.Handler())
		defer hs.Close()
		cl := hs.Client()
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			if _, err := benchrls.HTTPCheck(cl, hs.URL+"/v1/check", benchJSON); err != nil {
				b.Fatal(err)
			}
		}
	})
}
