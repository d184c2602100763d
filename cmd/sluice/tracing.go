package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
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
func openTracing(ctx context.Context, log *slog.Logger, attrs ...attribute.KeyValue) (*tracing, error) {
	if !tracingWanted(os.Getenv) {
		return &tracing{}, nil
	}
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing (OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_*): %w", err)
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
	// The SDK reports export failures through the global handler only.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("tracing", "err", err) }))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	log.Info("tracing on", "exporter", exporterName(os.Getenv))
	return &tracing{tp: tp}, nil
}

func exporterName(getenv func(string) string) string {
	if e := getenv("OTEL_TRACES_EXPORTER"); e != "" {
		return e
	}
	return "otlp"
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
