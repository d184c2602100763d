package pipeline

import (
	"context"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestTracing: a traced pipeline makes a consume span per partition batch,
// and a merge span per poll with a span per finished window of each stage
// and one for the write, nested under it; every window the writer got has
// its stage span.
func TestTracing(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	recs, exact := decisions(3, 2000, 30*time.Second, 5*time.Second)
	brokers := newKafka(t)
	w := &memWriter{}
	o := testOptions(brokers, w)
	o.Tracer = tp.Tracer("pipeline")
	startMerger(t, o)
	startConsumer(t, o)
	produce(t, brokers, recs)
	if _, err := Punctuate(context.Background(), brokers, DefaultTopic, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	want := wantWindows(exact)
	waitFor(t, "every window", 60*time.Second, func() bool { return w.count() >= want })

	byID := map[string]sdktrace.ReadOnlySpan{}
	count := map[string]int{}
	var consumed int64
	waitFor(t, "the spans of every window", 10*time.Second, func() bool {
		clear(byID)
		clear(count)
		consumed = 0
		for _, s := range rec.Ended() {
			byID[s.SpanContext().SpanID().String()] = s
			count[s.Name()]++
			if s.Name() == SpanConsume {
				for _, a := range s.Attributes() {
					if a.Key == "messaging.batch.message_count" {
						consumed += a.Value.AsInt64()
					}
				}
			}
		}
		return count[SpanStage] >= want && consumed >= int64(len(recs))
	})
	if count[SpanStage] != want {
		t.Errorf("%d stage spans, want one per written window (%d)", count[SpanStage], want)
	}
	if count[SpanMerge] == 0 || count[SpanWrite] == 0 {
		t.Errorf("spans %v: want merge and write spans", count)
	}
	for _, s := range rec.Ended() {
		switch s.Name() {
		case SpanStage, SpanWrite:
			if p := byID[s.Parent().SpanID().String()]; p == nil || p.Name() != SpanMerge {
				t.Fatalf("%s span's parent is %v, want a %s span", s.Name(), p, SpanMerge)
			}
			if s.EndTime().Before(s.StartTime()) {
				t.Errorf("%s span ends before it starts", s.Name())
			}
		}
	}
	// Every record arrives in a consume span once (the records and the
	// punctuations: at least len(recs)).
	if consumed < int64(len(recs)) {
		t.Errorf("consume spans count %d records, want at least %d", consumed, len(recs))
	}
}
