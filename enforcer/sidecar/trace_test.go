package sidecar_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc/metadata"

	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/enforcer/sidecar"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// TestTracing: a check over gRPC or HTTP that carries a W3C traceparent (as
// Envoy sends it) is a server span in the caller's trace, with the
// limiter's decision and script spans below it; a refused request's span is
// an error; a check without a traceparent starts a trace of its own.
func TestTracing(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	set, err := rules.Parse("test.yaml", []byte(testRules))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := enforcer.New(redistest.Server(t), set, enforcer.Options{Budget: time.Second, Tracer: tp.Tracer("enforcer")})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := sidecar.New(lim, sidecar.Options{Tracer: tp.Tracer("sidecar")})
	if err != nil {
		t.Fatal(err)
	}
	rls := rlsv3.NewRateLimitServiceClient(serveGRPC(t, srv))
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)

	const (
		traceID  = "4bf92f3577b34da6a3ce929d0e0e4736"
		parentID = "00f067aa0ba902b7"
	)
	traceparent := "00-" + traceID + "-" + parentID + "-01"
	// spansOf returns the ended spans of trace id, by name.
	spansOf := func(id string) map[string]sdktrace.ReadOnlySpan {
		out := map[string]sdktrace.ReadOnlySpan{}
		for _, s := range rec.Ended() {
			if s.SpanContext().TraceID().String() == id {
				out[s.Name()] = s
			}
		}
		return out
	}
	checkChain := func(api string, id, parent string) {
		t.Helper()
		got := spansOf(id)
		c, d, sc := got[sidecar.SpanCheck], got[enforcer.SpanDecide], got[enforcer.SpanScript]
		if c == nil || d == nil || sc == nil {
			t.Fatalf("%s: trace %s has spans %v; want %s, %s and %s", api, id, got, sidecar.SpanCheck, enforcer.SpanDecide, enforcer.SpanScript)
		}
		if parent != "" && c.Parent().SpanID().String() != parent {
			t.Errorf("%s: check span's parent %s, want the caller's %s", api, c.Parent().SpanID(), parent)
		}
		if !c.Parent().IsRemote() && parent != "" {
			t.Errorf("%s: check span's parent is not the remote caller's", api)
		}
		if d.Parent().SpanID() != c.SpanContext().SpanID() || sc.Parent().SpanID() != d.SpanContext().SpanID() {
			t.Errorf("%s: spans not nested check > decide > script", api)
		}
		if v, ok := spanAttr(c, "rpc.system"); !ok || v.AsString() != api {
			t.Errorf("%s: rpc.system %q", api, v.AsString())
		}
		if v, ok := spanAttr(c, "sluice.overall_code"); !ok || v.AsString() != "OK" {
			t.Errorf("%s: sluice.overall_code %q, want OK", api, v.AsString())
		}
	}

	// gRPC, traceparent in the metadata.
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", traceparent)
	if _, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "t", Descriptors: descs(desc("user_id", "a"))}); err != nil {
		t.Fatal(err)
	}
	checkChain("grpc", traceID, parentID)

	// HTTP, traceparent as a header: another trace.
	const httpTrace = "0af7651916cd43dd8448eb211c80319c"
	req, _ := http.NewRequest("POST", hs.URL+"/v1/check", strings.NewReader(`{"domain":"t","descriptors":[{"entries":[{"key":"user_id","value":"b"}]}]}`))
	req.Header.Set("traceparent", "00-"+httpTrace+"-b7ad6b7169203331-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("HTTP check: %d", resp.StatusCode)
	}
	checkChain("http", httpTrace, "b7ad6b7169203331")

	// No traceparent: a root span of a new trace.
	n := len(rec.Ended())
	if _, err := rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "t", Descriptors: descs(desc("user_id", "c"))}); err != nil {
		t.Fatal(err)
	}
	var root sdktrace.ReadOnlySpan
	for _, s := range rec.Ended()[n:] {
		if s.Name() == sidecar.SpanCheck {
			root = s
		}
	}
	if root == nil || root.Parent().IsValid() {
		t.Fatalf("check without a traceparent: span %v, want a root span", root)
	}
	checkChain("grpc", root.SpanContext().TraceID().String(), "")

	// A refused request (no domain): the check span is an error.
	n = len(rec.Ended())
	if _, err := rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Descriptors: descs(desc("user_id", "d"))}); err == nil {
		t.Fatal("a request without a domain was answered")
	}
	var bad sdktrace.ReadOnlySpan
	for _, s := range rec.Ended()[n:] {
		if s.Name() == sidecar.SpanCheck {
			bad = s
		}
	}
	if bad == nil || bad.Status().Code != codes.Error {
		t.Fatalf("refused check's span %v, want an error status", bad)
	}
}

func descs(d ...*ratelimitv3.RateLimitDescriptor) []*ratelimitv3.RateLimitDescriptor { return d }

// spanAttr returns span s's attribute k, and whether it has it.
func spanAttr(s sdktrace.ReadOnlySpan, k string) (attribute.Value, bool) {
	for _, a := range s.Attributes() {
		if string(a.Key) == k {
			return a.Value, true
		}
	}
	return attribute.Value{}, false
}
