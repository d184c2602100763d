package sidecar

import (
	"context"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
)

// SpanCheck is the name of a traced check's span (Options.Tracer): one
// request over either API, the parent of the limiter's spans.
const SpanCheck = "sluice.check"

// SpanUsage is the name of a traced GET /v1/usage's span: the endpoint's
// own rule's decision and the key's reads are below it.
const SpanUsage = "sluice.usage"

// checkTraced is check with a span around it, a child of the caller's trace
// when the request carries one (W3C traceparent in gRPC metadata or an
// HTTP header, as Envoy sends it with tracing on). check takes this path
// only when Options.Tracer is set.
func (s *Server) checkTraced(ctx context.Context, in *rlsv3.RateLimitRequest, sc *scratch, r *reply, api int) error {
	if api == apiGRPC {
		if md, ok := metadata.FromIncomingContext(ctx); ok {
			ctx = s.opts.Propagator.Extract(ctx, mdCarrier(md))
		}
	}
	attrs := [...]attribute.KeyValue{
		attribute.String("rpc.system", apiNames[api]),
		attribute.String("sluice.domain", in.GetDomain()),
		attribute.Int("sluice.descriptors", len(in.GetDescriptors())),
	}
	ctx, span := s.opts.Tracer.Start(ctx, SpanCheck, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs[:]...))
	err := s.checkRequest(ctx, in, sc, r, api)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(otelcodes.Error, err.Error())
	} else {
		span.SetAttributes(attribute.String("sluice.overall_code", r.OverallCode.String()))
	}
	span.End()
	return err
}

// mdCarrier reads gRPC metadata for a propagation.TextMapPropagator.
type mdCarrier metadata.MD

func (c mdCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c mdCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c mdCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

var _ propagation.TextMapCarrier = mdCarrier{}
