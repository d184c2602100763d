package enforcer_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// TestMiddlewareNormalizesPaths: the Go middleware is one of the ways in
// that share the path normalization: respellings of /v1/login count against
// its exact rule, in one bucket.
func TestMiddlewareNormalizesPaths(t *testing.T) {
	l := newLimiter(t, redistest.Server(t), `
domain: m
rules: [{id: login, match: [{key: path, value: /v1/login}], limit: 3, period: 1h}]`)
	served := 0
	h := l.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served++ }), enforcer.MiddlewareOptions{})
	for i, target := range []string{"/v1/login?x=1", "//v1/./login", "/v1/%6Cogin", "/v1/login/"} {
		r := httptest.NewRequest("GET", target, nil)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if want := map[bool]int{true: 200, false: 429}[i < 3]; w.Code != want {
			t.Errorf("%s: %d, want %d", target, w.Code, want)
		}
	}
	if served != 3 {
		t.Errorf("served %d, want 3", served)
	}
}

// TestQueryKeyFromPath: a rule on query:page keeps a bucket per page, read
// from the path's query for any way in; the same parameter twice with
// different values is refused, since origins differ on which they read.
func TestQueryKeyFromPath(t *testing.T) {
	l := newLimiter(t, redistest.Server(t), `
domain: q
custom_keys: ["query:page"]
rules: [{id: pages, match: [{key: path, value: /search}, {key: "query:page"}], limit: 1, period: 1h}]`)
	check := func(path string) (decision.Outcome, error) {
		req := &enforcer.Request{}
		req.Descriptors[rules.KeyPath] = path
		d, err := l.Check(context.Background(), req)
		return d.Outcome, err
	}
	for _, c := range []struct {
		path string
		want decision.Outcome
	}{
		{"/search?page=1", decision.Allowed},
		{"/search?page=2", decision.Allowed},
		{"/search/?x=y&pag%65=1", decision.Denied}, // page 1's bucket
		{"/search?page=3", decision.Allowed},
		{"/search", decision.Allowed}, // no page: no rule
	} {
		if got, err := check(c.path); err != nil || got != c.want {
			t.Errorf("%s: %v %v, want %v", c.path, got, err, c.want)
		}
	}
	if _, err := check("/search?page=1&page=9"); !errors.Is(err, enforcer.ErrBadRequest) || !strings.Contains(err.Error(), `parameter "page" twice`) {
		t.Errorf("a parameter twice: %v, want ErrBadRequest", err)
	}
}

// TestRecordsHashLongValues: a value longer than MaxValue is decided whole,
// and replaced in the decision record by its HMAC under the limiter's key:
// the same value gives the same text, another key another text, and
// shorter values stay as they are.
func TestRecordsHashLongValues(t *testing.T) {
	var mu sync.Mutex
	var got []decision.Record
	sink := sinkFunc(func(r decision.Record) { mu.Lock(); got = append(got, r); mu.Unlock() })
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true, DialerRetries: 1})
	set := mustSet(t, "domain: t\nrules: [{id: r, match: [{key: user}], limit: 2, period: 1m}]")
	l, err := enforcer.New(rdb, set, enforcer.Options{Budget: time.Second, Sink: sink, ValueHashKey: []byte("a secret of 16+ bytes")})
	if err != nil {
		t.Fatal(err)
	}
	other, err := enforcer.New(rdb, set, enforcer.Options{Budget: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("j", 10<<10)
	for i, v := range []string{long, long, long, "short"} {
		req := &enforcer.Request{UserAgent: strings.Repeat("a", enforcer.MaxValue+1)}
		req.Descriptors[rules.KeyUser] = v
		d, err := l.Check(context.Background(), req)
		if want := map[bool]decision.Outcome{true: decision.Allowed, false: decision.Denied}[i != 2]; err != nil || d.Outcome != want {
			t.Fatalf("request %d: %v %v, want %v", i+1, d.Outcome, err, want)
		}
	}
	h := l.HashValue(long)
	if !strings.HasPrefix(h, "hmac-sha256:") || len(h) != enforcer.HashedValueLen || h == other.HashValue(long) || l.HashValue("short") != "short" {
		t.Fatalf("HashValue: %q (other key %q)", h, other.HashValue(long))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 4 {
		t.Fatalf("%d records", len(got))
	}
	for i, r := range got[:3] {
		if r.Descriptors[rules.KeyUser] != h || len(r.UserAgent) != enforcer.HashedValueLen {
			t.Errorf("record %d: user %.40q, user agent %.40q: want the hash", i+1, r.Descriptors[rules.KeyUser], r.UserAgent)
		}
	}
	if got[3].Descriptors[rules.KeyUser] != "short" {
		t.Errorf("a short value in the record: %q", got[3].Descriptors[rules.KeyUser])
	}
}
