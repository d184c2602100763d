package enforcer

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Span names and attributes of a traced decision (Options.Tracer). The
// attribute names follow OpenTelemetry's semantic conventions for database
// client spans (db.system.name, db.operation.name) where one applies, and
// are sluice.* otherwise.
const (
	SpanDecide = "sluice.decide" // Limiter.Decide: one request, every matching rule
	SpanScript = "EVALSHA"       // one round of script calls: each slot's, in parallel
)

// decideTraced is Decide with a span around it. Decide takes this path only
// when Options.Tracer is set: with tracing off a decision makes no span,
// attribute or context of its own.
func (l *Limiter) decideTraced(ctx context.Context, req *Request, d *Decision) error {
	ctx, span := l.opts.Tracer.Start(ctx, SpanDecide, trace.WithSpanKind(trace.SpanKindInternal))
	err := l.decideRequest(ctx, req, d)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.End()
		return err
	}
	attrs := [...]attribute.KeyValue{
		attribute.String("sluice.domain", req.Domain),
		attribute.Int("sluice.rules", len(d.Statuses)),
		attribute.String("sluice.outcome", d.Outcome.String()),
		attribute.String("sluice.path", d.Path.String()),
		attribute.String("sluice.rule", ruleID(d)),
	}
	span.SetAttributes(attrs[:]...)
	if d.Err != nil {
		// Degraded: the failure modes decided. Not an error of the
		// request's, but the span says why Redis did not.
		span.SetAttributes(attribute.String("sluice.degraded", d.Err.Error()))
	}
	span.End()
	return nil
}

// ruleID is the rule that speaks for d: the denying one, else the binding
// one (the enforced rule with the least remaining), else "".
func ruleID(d *Decision) string {
	switch {
	case d.Rule != nil:
		return d.Rule.ID
	case d.bind > 0 && d.Statuses[d.bind-1].Rule != nil:
		return d.Statuses[d.bind-1].Rule.ID
	}
	return ""
}

// traceScript starts the span of one round of script calls (name: the
// script's, "decide" or "refund"); the caller ends it with endScript. It
// returns ctx unchanged and a nil span when tracing is off.
func (l *Limiter) traceScript(ctx context.Context, name string, c *call) (context.Context, trace.Span) {
	if l.opts.Tracer == nil {
		return ctx, nil
	}
	keys := 0
	for gi := range c.groups {
		keys += int(c.groups[gi].n)
	}
	return l.opts.Tracer.Start(ctx, SpanScript, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			attribute.String("db.system.name", "redis"),
			attribute.String("db.operation.name", "EVALSHA"),
			attribute.String("sluice.script", name),
			attribute.Int("sluice.calls", len(c.groups)),
			attribute.Int("sluice.keys", keys),
		))
}

// endScript ends a span from traceScript with the first group's error, if any.
func endScript(span trace.Span, c *call) {
	if span == nil {
		return
	}
	for gi := range c.groups {
		if err := c.groups[gi].err; err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
			break
		}
	}
	span.End()
}
