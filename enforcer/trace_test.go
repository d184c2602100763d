package enforcer_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// spanAttr returns span s's attribute k, and whether it has it.
func spanAttr(s sdktrace.ReadOnlySpan, k string) (attribute.Value, bool) {
	for _, a := range s.Attributes() {
		if string(a.Key) == k {
			return a.Value, true
		}
	}
	return attribute.Value{}, false
}

// TestTracing: with a Tracer, each decision is a span under the caller's,
// with the script round below it; a deny and a degraded decision say so;
// without one, no span is made (the recorder of a provider the limiter was
// not given sees nothing).
func TestTracing(t *testing.T) {
	const yaml = `
domain: t
rules: [{id: r, match: [{key: user}], limit: 1, period: 1m}]`
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tracer := tp.Tracer("test")

	decide := func(l *enforcer.Limiter, user string) (enforcer.Decision, sdktrace.ReadOnlySpan) {
		t.Helper()
		ctx, parent := tracer.Start(context.Background(), "request")
		req := &enforcer.Request{Domain: "t", Now: at(0)}
		req.Descriptors[rules.KeyUser] = user
		d, err := l.Check(ctx, req)
		parent.End()
		if err != nil {
			t.Fatal(err)
		}
		return d, parent.(sdktrace.ReadOnlySpan)
	}
	children := func(of sdktrace.ReadOnlySpan) []sdktrace.ReadOnlySpan {
		var out []sdktrace.ReadOnlySpan
		for _, s := range rec.Ended() {
			if s.Parent().SpanID() == of.SpanContext().SpanID() {
				out = append(out, s)
			}
		}
		return out
	}
	one := func(of sdktrace.ReadOnlySpan, name string) sdktrace.ReadOnlySpan {
		t.Helper()
		kids := children(of)
		if len(kids) != 1 || kids[0].Name() != name {
			var names []string
			for _, k := range kids {
				names = append(names, k.Name())
			}
			t.Fatalf("children of %s: %v, want one %s", of.Name(), names, name)
		}
		return kids[0]
	}
	wantAttr := func(s sdktrace.ReadOnlySpan, k, want string) {
		t.Helper()
		if v, ok := spanAttr(s, k); !ok || v.Emit() != want {
			t.Errorf("span %s: %s = %q (present %v), want %q", s.Name(), k, v.Emit(), ok, want)
		}
	}

	rdb := redistest.Server(t)
	l, err := enforcer.New(rdb, mustSet(t, yaml), enforcer.Options{Budget: time.Second, Tracer: tracer, HotKeys: enforcer.HotKeyOptions{Table: -1}})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []decision.Outcome{decision.Allowed, decision.Denied} {
		d, parent := decide(l, "u")
		if d.Outcome != want {
			t.Fatalf("decision %d: %v, want %v", i, d.Outcome, want)
		}
		ds := one(parent, enforcer.SpanDecide)
		wantAttr(ds, "sluice.outcome", want.String())
		wantAttr(ds, "sluice.rules", "1")
		wantAttr(ds, "sluice.path", decision.PathRedis.String())
		wantAttr(ds, "sluice.rule", "r") // denying, or binding
		ss := one(ds, enforcer.SpanScript)
		wantAttr(ss, "db.system.name", "redis")
		wantAttr(ss, "sluice.script", "decide")
		wantAttr(ss, "sluice.keys", "1")
		if ss.Status().Code == codes.Error {
			t.Errorf("script span of a healthy Redis: %v", ss.Status())
		}
	}

	// A Redis that refuses: the decision is degraded, not an error; its
	// script span failed.
	ld, err := enforcer.New(deadRedis(t), mustSet(t, yaml), enforcer.Options{Budget: time.Second, Tracer: tracer, HotKeys: enforcer.HotKeyOptions{Table: -1}})
	if err != nil {
		t.Fatal(err)
	}
	d, parent := decide(ld, "v")
	if d.Outcome != decision.DegradedOpen {
		t.Fatalf("dead Redis: %v, want degraded-open", d.Outcome)
	}
	ds := one(parent, enforcer.SpanDecide)
	if _, ok := spanAttr(ds, "sluice.degraded"); !ok || ds.Status().Code == codes.Error {
		t.Errorf("degraded decision's span: status %v, attributes %v; want sluice.degraded and no error", ds.Status(), ds.Attributes())
	}
	if ss := one(ds, enforcer.SpanScript); ss.Status().Code != codes.Error {
		t.Errorf("script span of a dead Redis: status %v, want an error", ss.Status())
	}

	// No Tracer: no span at all.
	before := len(rec.Ended())
	plain, err := enforcer.New(rdb, mustSet(t, yaml), enforcer.Options{Budget: time.Second, HotKeys: enforcer.HotKeyOptions{Table: -1}})
	if err != nil {
		t.Fatal(err)
	}
	_, parent = decide(plain, "w")
	if kids := children(parent); len(kids) != 0 || len(rec.Ended()) != before+1 {
		t.Errorf("without a Tracer: %d spans under the request, %d new spans; want 0 and 1 (the test's own)", len(kids), len(rec.Ended())-before)
	}
}
