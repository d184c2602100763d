package pipeline

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-rl/sluice/pipeline/stage"
)

// Span names of a traced pipeline (Options.Tracer).
const (
	// SpanConsume is one partition's batch in the Consumer: records
	// observed by every stage, partials and the marker sent.
	SpanConsume = "sluice.pipeline.consume"
	// SpanMerge is one poll of the Merger's partials: partials merged,
	// windows finished and their output written.
	SpanMerge = "sluice.pipeline.merge"
	// SpanStage is one window of one stage finished in the merge tier (its
	// partials merged and Finish called), a child of SpanMerge; its name
	// attribute is sluice.stage.
	SpanStage = "sluice.pipeline.stage"
	// SpanWrite is the delivery of a poll's output (rules and shares) to the
	// Writer, retries included, a child of SpanMerge.
	SpanWrite = "sluice.pipeline.write"
)

// traceMerge starts the span of one Merger poll that began at start (nil
// when tracing is off, or the poll took nothing), with one child span per
// finished window.
func (mg *Merger) traceMerge(ctx context.Context, start time.Time, records int, done []stage.FinishedWindow) (context.Context, trace.Span) {
	if mg.o.Tracer == nil || records == 0 && len(done) == 0 {
		return ctx, nil
	}
	ctx, span := mg.o.Tracer.Start(ctx, SpanMerge, trace.WithTimestamp(start),
		trace.WithAttributes(attribute.Int("sluice.records", records), attribute.Int("sluice.windows", len(done))))
	for _, f := range done {
		_, ws := mg.o.Tracer.Start(ctx, SpanStage, trace.WithTimestamp(f.Began), trace.WithAttributes(
			attribute.String("sluice.stage", f.Stage),
			attribute.Int64("sluice.window_start_ms", f.Window.Start.UnixMilli()),
			attribute.Int64("sluice.window_end_ms", f.Window.End.UnixMilli()),
			attribute.Int("sluice.partials", f.Partials),
			attribute.Int("sluice.rules", len(f.Out.Rules)),
			attribute.Int("sluice.shares", len(f.Out.Shares)),
		))
		for _, err := range f.Errs {
			ws.RecordError(err)
		}
		ws.End(trace.WithTimestamp(f.Began.Add(f.Took)))
	}
	return ctx, span
}

// traceWrite starts the span of one output's delivery; nil when tracing is off.
func (mg *Merger) traceWrite(ctx context.Context, out stage.Output) trace.Span {
	if mg.o.Tracer == nil {
		return nil
	}
	_, span := mg.o.Tracer.Start(ctx, SpanWrite, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
		attribute.Int("sluice.rules", len(out.Rules)), attribute.Int("sluice.shares", len(out.Shares))))
	return span
}

// endSpan ends span (if any), marking it failed with err (if any).
func endSpan(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// traceConsume records the span of one partition's batch that began at
// start; nothing when tracing is off.
func (t *task) traceConsume(start time.Time, records, partials int, late int64, err error) {
	tr := t.c.o.Tracer
	if tr == nil || records == 0 {
		return
	}
	_, span := tr.Start(t.ctx, SpanConsume, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithTimestamp(start), trace.WithAttributes(
		attribute.String("messaging.system", "kafka"),
		attribute.String("messaging.destination.name", t.c.o.Topic),
		attribute.Int("messaging.destination.partition.id", int(t.p)),
		attribute.Int("messaging.batch.message_count", records),
		attribute.Int("sluice.partials", partials),
		attribute.Int64("sluice.late", late),
	))
	endSpan(span, err)
}
