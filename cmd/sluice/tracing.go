package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"
)

// tracingWanted reports whether the OpenTelemetry environment asks for
// traces: OTEL_TRACES_EXPORTER names an exporter other than "none", or an
// OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT); and OTEL_SDK_DISABLED is not "true".
// Unlike the specification's default exporter (otlp), nothing set means no
// tracing: a sidecar that nobody asked to trace makes no span.
func tracingWanted(getenv func(string) string) bool {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	if e := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); e != "" {
		return e != "none"
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// tracing is a process's tracer provider: nil (no tracing) unless the
// environment asks for it (tracingWanted).
type tracing struct {
	tp *sdktrace.TracerProvider
}

// openTracing sets up tracing as the standard OTEL_* variables say
// (https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/):
// the exporter (OTEL_TRACES_EXPORTER: otlp, console or none;
// OTEL_EXPORTER_OTLP_PROTOCOL and the OTLP endpoint, headers and timeout
// variables), the sampler (OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG), the
// batch span processor (OTEL_BSP_*) and the resource (OTEL_SERVICE_NAME,
// default "sluice"; OTEL_RESOURCE_ATTRIBUTES). The exporter's errors are
// logged on log. Without such variables it returns a tracing whose Tracer is
// nil.
//
// Tracing is never worth a sidecar that does not start: a variable the
// SDK would refuse (an unknown exporter or protocol, an endpoint that is
// not an http or https URL) is logged as a warning naming it, and the
// process runs without tracing.
func openTracing(ctx context.Context, log *slog.Logger, attrs ...attribute.KeyValue) (*tracing, error) {
	if !tracingWanted(os.Getenv) {
		return &tracing{}, nil
	}
	cfg, err := checkTracingEnv(os.Getenv)
	if err != nil {
		log.Warn("tracing off: an OpenTelemetry variable is not one sluice can use", "err", err)
		return &tracing{}, nil
	}
	exp, err := newSpanExporter(ctx, cfg)
	if err != nil {
		log.Warn("tracing off: the exporter could not be set up", "exporter", cfg.exporter, "protocol", cfg.protocol, "endpoint", cfg.endpoint, "err", err)
		return &tracing{}, nil
	}
	bi := readBuildInfo()
	res, err := resource.New(ctx,
		resource.WithAttributes(append([]attribute.KeyValue{
			attribute.String("service.name", "sluice"),
			attribute.String("service.version", bi.Version),
		}, attrs...)...),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
		resource.WithTelemetrySDK())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		_ = exp.Shutdown(ctx)
		return nil, fmt.Errorf("tracing: resource (OTEL_RESOURCE_ATTRIBUTES): %w", err)
	}
	// The SDK reports export failures through the global handler only: one
	// per batch while a collector is down, so at most one line per 10 s,
	// with the number left out.
	var (
		every      = rate.Sometimes{Interval: 10 * time.Second}
		suppressed atomic.Int64
	)
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		logged := false
		every.Do(func() {
			log.Warn("tracing: exporting spans failed", "err", err, "errors_not_logged", suppressed.Swap(0))
			logged = true
		})
		if !logged {
			suppressed.Add(1)
		}
	}))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	log.Info("tracing on", "exporter", cfg.exporter, "protocol", cfg.protocol, "endpoint", cfg.endpoint)
	return &tracing{tp: tp}, nil
}

// newSpanExporter is the exporter cfg names: OTLP over gRPC or HTTP (the
// exporters read the OTEL_EXPORTER_OTLP_* endpoint, headers, timeout and
// certificate variables themselves), or the console. It is what
// go.opentelemetry.io/contrib/exporters/autoexport's NewSpanExporter does
// for traces, without linking that package, whose init also brings in the
// metric and log exporters and SDKs that sluice does not use (some 9% of a
// cold build of the sluice binary).
func newSpanExporter(ctx context.Context, cfg tracingEnv) (sdktrace.SpanExporter, error) {
	switch {
	case cfg.exporter == "console":
		return stdouttrace.New()
	case cfg.protocol == "grpc":
		return otlptracegrpc.New(ctx)
	default:
		return otlptracehttp.New(ctx)
	}
}

// tracingEnv is what the OTEL_* variables ask for, checked, in lower case
// (the specification's values are case-insensitive).
type tracingEnv struct {
	exporter, protocol, endpoint string
}

// checkTracingEnv checks the variables that would stop the SDK or send
// spans elsewhere than meant: OTEL_TRACES_EXPORTER (otlp, console or none),
// the OTLP protocol (grpc or http/protobuf) and endpoint (an http or https
// URL with a host; without a scheme the SDK would fall back to its default
// address). An error names the variable and its value.
func checkTracingEnv(getenv func(string) string) (tracingEnv, error) {
	var e tracingEnv
	lower := func(k string) string { return strings.ToLower(strings.TrimSpace(getenv(k))) }
	e.exporter = lower("OTEL_TRACES_EXPORTER")
	switch e.exporter {
	case "":
		e.exporter = "otlp"
	case "otlp", "console":
	default:
		return e, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: want otlp, console or none (one of them: sluice sends spans to one exporter)", getenv("OTEL_TRACES_EXPORTER"))
	}
	if e.exporter != "otlp" {
		return e, nil
	}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if v := lower(k); v != "" {
			if v != "grpc" && v != "http/protobuf" {
				return e, fmt.Errorf("%s=%q: want grpc or http/protobuf", k, getenv(k))
			}
			if e.protocol == "" {
				e.protocol = v
			}
		}
	}
	if e.protocol == "" {
		e.protocol = "http/protobuf"
	}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		v := strings.TrimSpace(getenv(k))
		if v == "" {
			continue
		}
		u, err := url.Parse(v)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return e, fmt.Errorf("%s=%q: want an http:// or https:// URL with a host, e.g. http://127.0.0.1:4318", k, v)
		}
		if e.endpoint == "" {
			e.endpoint = v
		}
	}
	if e.endpoint == "" {
		e.endpoint = "the SDK's default (localhost, 4318 for http/protobuf, 4317 for grpc)"
	}
	return e, nil
}

// Tracer returns the named tracer, or nil when tracing is off: the
// packages' Options take nil as "trace nothing".
func (t *tracing) Tracer(name string) trace.Tracer {
	if t.tp == nil {
		return nil
	}
	return t.tp.Tracer(name)
}

// Close flushes the spans not yet exported, within 5 s.
func (t *tracing) Close(log *slog.Logger) {
	if t.tp == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := t.tp.Shutdown(ctx); err != nil {
		log.Warn("tracing: flushing spans at exit", "err", err)
	}
}
