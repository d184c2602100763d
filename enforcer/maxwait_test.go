package enforcer_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// TestLongWaitsInHeaders: rules at rules.MaxWait (a token bucket that takes
// 98 years to refill, a sliding window of 50 years) report resets and waits
// that are positive and no shorter than the true wait, in every header; a
// limit override past the bound is refused naming it (traefik #8235).
func TestLongWaitsInHeaders(t *testing.T) {
	l := newLimiter(t, redistest.Server(t), `
domain: d
rules:
  - {id: tb, match: [{key: user}], limit: 1, period: 24h, burst: 36000}
  - {id: sw, match: [{key: tenant}], limit: 1, period: 438000h, algorithm: sliding_window}
`)
	check := func(req *enforcer.Request) (enforcer.Decision, http.Header) {
		t.Helper()
		d, err := l.Check(context.Background(), req)
		if err != nil || d.Err != nil {
			t.Fatal(err, d.Err)
		}
		h := http.Header{}
		d.WriteHeaders(h, enforcer.AllHeaders)
		return d, h
	}
	secs := func(h http.Header, name string) int64 {
		t.Helper()
		v := h.Get(name)
		if name == "RateLimit" {
			_, v, _ = strings.Cut(v, ";t=")
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("%s: %q: %v", name, h.Get(name), err)
		}
		return n
	}
	tb := &enforcer.Request{Now: at(0), Cost: 36000}
	tb.Descriptors[rules.KeyUser] = "u"
	if d, h := check(tb); d.Outcome != decision.Allowed || secs(h, "X-RateLimit-Reset") != 36000*86400 || secs(h, "RateLimit") != 36000*86400 {
		t.Errorf("the whole burst: %v, headers %v; want a reset of 36000 days", d.Outcome, h)
	}
	tb.Cost, tb.Now = 1, at(1)
	d, h := check(tb)
	if d.Outcome != decision.Denied || d.Wait < 24*time.Hour-time.Second || d.RetryAfter < d.Wait || secs(h, "Retry-After") < 86399 || secs(h, "X-RateLimit-Reset") <= 0 {
		t.Errorf("token bucket deny: %v wait %v retry %v, headers %v", d.Outcome, d.Wait, d.RetryAfter, h)
	}
	sw := &enforcer.Request{Now: at(0)}
	sw.Descriptors[rules.KeyTenant] = "t"
	check(sw)
	sw.Now = at(1000)
	d, h = check(sw)
	if d.Outcome != decision.Denied || d.RetryAfter < d.Wait || d.Wait <= 0 || secs(h, "Retry-After") < int64(d.Wait/time.Second) || secs(h, "X-RateLimit-Reset") <= 0 || secs(h, "RateLimit") <= 0 {
		t.Errorf("sliding window deny: %v wait %v retry %v, headers %v", d.Outcome, d.Wait, d.RetryAfter, h)
	}
	over := &enforcer.Request{Parts: []enforcer.Part{{Override: &enforcer.Override{Limit: 1, Period: 200 * 365 * 24 * time.Hour, Entity: "e"}}}}
	if _, err := l.Check(context.Background(), over); !errors.Is(err, enforcer.ErrBadRequest) || !strings.Contains(err.Error(), "rules.MaxWait") {
		t.Errorf("an override of 1 per 200 years: %v, want ErrBadRequest naming rules.MaxWait", err)
	}
}
