package main

import (
	"context"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/syncbuf"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

func TestTracingWanted(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want bool
	}{
		{nil, false},
		{map[string]string{"OTEL_SERVICE_NAME": "x"}, false},
		{map[string]string{"OTEL_TRACES_EXPORTER": "none"}, false},
		{map[string]string{"OTEL_TRACES_EXPORTER": "console"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_TRACES_EXPORTER": "none"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "true"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "false"}, true},
	} {
		if got := tracingWanted(func(k string) string { return c.env[k] }); got != c.want {
			t.Errorf("%v: tracing %v, want %v", c.env, got, c.want)
		}
	}
}

// otlpSink is an OTLP/HTTP trace receiver (POST /v1/traces, protobuf):
// what a collector would get.
type otlpSink struct {
	mu       sync.Mutex
	spans    []*tracepb.Span
	services []string
	posts    int
}

func (s *otlpSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	var req coltrace.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(body, &req)
	}
	if r.URL.Path != "/v1/traces" || err != nil {
		http.Error(w, "bad export", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	s.posts++
	for _, rs := range req.ResourceSpans {
		for _, a := range rs.GetResource().GetAttributes() {
			if a.Key == "service.name" {
				s.services = append(s.services, a.GetValue().GetStringValue())
			}
		}
		for _, ss := range rs.ScopeSpans {
			s.spans = append(s.spans, ss.Spans...)
		}
	}
	s.mu.Unlock()
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// serveOnce runs sluice serve (embedded Redis, example rules) with the
// process's environment, sends a gRPC check carrying traceparent and an
// HTTP check, and stops it.
func serveOnce(t *testing.T, traceparent string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	a, done := mustServe(t, ctx, serveConfig{})
	conn, err := grpc.NewClient(a[0].String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	rctx := metadata.AppendToOutgoingContext(ctx, "traceparent", traceparent)
	if _, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(rctx, rlReq("sluice", "remote_address", "192.0.2.7")); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	resp, err := http.Post("http://"+a[1].String()+"/v1/check", "application/json",
		strings.NewReader(`{"domain":"sluice","descriptors":[{"entries":[{"key":"remote_address","value":"192.0.2.8"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve after cancel: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not stop within 20 s")
	}
}

// TestServeTracing: sluice serve exports spans over OTLP when the standard
// environment asks for it, in the caller's trace, flushed when it stops;
// with no OTEL_* variable it exports nothing.
func TestServeTracing(t *testing.T) {
	sink := &otlpSink{}
	col := httptest.NewServer(sink)
	defer col.Close()
	const traceID = "5bf92f3577b34da6a3ce929d0e0e4736"

	// Off: the collector's address is known, but nothing asks for traces.
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	serveOnce(t, "00-"+traceID+"-00f067aa0ba902b7-01")
	sink.mu.Lock()
	if sink.posts != 0 {
		t.Errorf("tracing off: the collector got %d exports", sink.posts)
	}
	sink.mu.Unlock()

	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", col.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_TRACES_SAMPLER", "parentbased_always_on")
	serveOnce(t, "00-"+traceID+"-00f067aa0ba902b7-01")
	sink.mu.Lock()
	defer sink.mu.Unlock()
	names := map[string]int{}
	inTrace := map[string]int{}
	for _, s := range sink.spans {
		names[s.Name]++
		if hex.EncodeToString(s.TraceId) == traceID {
			inTrace[s.Name]++
		}
	}
	for _, n := range []string{"sluice.check", "sluice.decide", "EVALSHA"} {
		if names[n] != 2 || inTrace[n] != 1 {
			t.Errorf("span %s: %d exported, %d in the caller's trace; want 2 (gRPC and HTTP) and 1 (gRPC's)", n, names[n], inTrace[n])
		}
	}
	if len(sink.services) == 0 || sink.services[0] != "sluice" {
		t.Errorf("service.name %v, want sluice", sink.services)
	}
}

// TestCheckTracingEnv: variables the SDK would refuse, or that would send
// spans to its default address, are named; case does not matter.
func TestCheckTracingEnv(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		bad  string // a part of the error; "" for none
		want tracingEnv
	}{
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, want: tracingEnv{exporter: "otlp", protocol: "http/protobuf", endpoint: "http://c:4318"}},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "Console"}, want: tracingEnv{exporter: "console"}},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "OTLP", "OTEL_EXPORTER_OTLP_PROTOCOL": "GRPC", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://c:4317"},
			want: tracingEnv{exporter: "otlp", protocol: "grpc", endpoint: "https://c:4317"}},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "bogus"}, bad: `OTEL_TRACES_EXPORTER="bogus"`},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "console,otlp"}, bad: `OTEL_TRACES_EXPORTER="console,otlp"`},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "bogus", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, bad: `OTEL_EXPORTER_OTLP_PROTOCOL="bogus"`},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, bad: `"http/json"`},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "127.0.0.1:4319"}, bad: `OTEL_EXPORTER_OTLP_ENDPOINT="127.0.0.1:4319"`},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "ftp://c"}, bad: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="ftp://c"`},
	} {
		got, err := checkTracingEnv(func(k string) string { return c.env[k] })
		switch {
		case c.bad != "" && (err == nil || !strings.Contains(err.Error(), c.bad)):
			t.Errorf("%v: error %v, want one naming %s", c.env, err, c.bad)
		case c.bad == "" && err != nil:
			t.Errorf("%v: %v", c.env, err)
		case c.bad == "" && (got.exporter != c.want.exporter || got.protocol != c.want.protocol || got.endpoint != c.want.endpoint):
			t.Errorf("%v: %+v, want %+v", c.env, got, c.want)
		}
	}
}

// TestServeRunsWithoutTracingOnABadVariable: a tracing variable sluice
// cannot use is a warning, never a sidecar that does not start.
func TestServeRunsWithoutTracingOnABadVariable(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "bogus")
	var logs syncbuf.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	a, done := mustServe(t, ctx, serveConfig{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	resp, err := http.Get("http://" + a[1].String() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), `tracing off`) || !strings.Contains(logs.String(), `bogus`) {
		t.Errorf("no warning naming the variable in:\n%s", logs.String())
	}
}
