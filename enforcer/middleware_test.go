package enforcer_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

func serve(h http.Handler, remote string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "/v1/items", nil)
	r.RemoteAddr = remote
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestMiddleware: allowed requests reach the handler with the rate-limit
// headers; a denied one gets 429 and Retry-After without reaching it; the
// client's port does not make a new bucket.
func TestMiddleware(t *testing.T) {
	l := newLimiter(t, redistest.Server(t), `
domain: m
rules: [{id: per-ip, match: [{key: client_ip}], limit: 2, period: 1m}]`)
	served := 0
	h := l.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served++ }), enforcer.MiddlewareOptions{})
	for i, port := range []string{"1111", "2222"} {
		w := serve(h, "192.0.2.1:"+port)
		if w.Code != 200 || w.Header().Get("RateLimit-Policy") != `"per-ip";q=2;w=60` || w.Header().Get("X-RateLimit-Remaining") == "" {
			t.Fatalf("request %d: %d %v", i, w.Code, w.Header())
		}
	}
	w := serve(h, "192.0.2.1:3333")
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" || w.Header().Get("X-RateLimit-Remaining") != "0" || served != 2 {
		t.Errorf("third: %d %v, served %d; want 429 with Retry-After, remaining 0, the handler not called", w.Code, w.Header(), served)
	}
}

// TestMiddlewareReleasesSlots: a concurrency slot is held while the handler
// runs and released when it returns.
func TestMiddlewareReleasesSlots(t *testing.T) {
	l := newLimiter(t, redistest.Server(t), `
domain: m
rules: [{id: one, algorithm: concurrency, match: [{key: client_ip}], limit: 1, lease: 30s}]`)
	inside, release := make(chan struct{}), make(chan struct{})
	h := l.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Block") != "" {
			close(inside)
			<-release
		}
	}), enforcer.MiddlewareOptions{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r := httptest.NewRequest("GET", "/slow", nil)
		r.RemoteAddr, r.Header = "192.0.2.9:1", http.Header{"X-Block": {"1"}}
		h.ServeHTTP(httptest.NewRecorder(), r)
	}()
	<-inside
	if w := serve(h, "192.0.2.9:2"); w.Code != http.StatusTooManyRequests {
		t.Errorf("while the slot is held: %d, want 429", w.Code)
	}
	close(release)
	wg.Wait()
	if w := serve(h, "192.0.2.9:3"); w.Code != 200 {
		t.Errorf("after the handler returned: %d, want 200: the slot was released", w.Code)
	}
}

// TestMiddlewareUnavailable: a fail-closed rule answers UnavailableStatus
// with Retry-After: 1 while Redis is unavailable, and no remaining count.
func TestMiddlewareUnavailable(t *testing.T) {
	dead := deadRedis(t)
	l, err := enforcer.New(dead, mustSet(t, "domain: m\nrules: [{id: login, failure_mode: closed, match: [{key: client_ip}], limit: 5, period: 1m}]"),
		enforcer.Options{Budget: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	h := l.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("the handler was called") }),
		enforcer.MiddlewareOptions{UnavailableStatus: http.StatusServiceUnavailable})
	w := serve(h, "192.0.2.1:1")
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" || w.Header().Get("X-RateLimit-Remaining") != "" {
		t.Errorf("%d %v; want 503, Retry-After 1, no remaining", w.Code, w.Header())
	}
}

// recordingLimiter returns a limiter of 5 requests a minute per client IP
// that keeps its decision records, and a function returning them.
func recordingLimiter(t *testing.T) (*enforcer.Limiter, func() []decision.Record) {
	var mu sync.Mutex
	var recs []decision.Record
	l, err := enforcer.New(redistest.Server(t), mustSet(t, `
domain: m
rules: [{id: per-ip, match: [{key: client_ip}], limit: 5, period: 1m}]`), enforcer.Options{Budget: time.Second,
		Sink: sinkFunc(func(r decision.Record) { mu.Lock(); recs = append(recs, r); mu.Unlock() })})
	if err != nil {
		t.Fatal(err)
	}
	return l, func() []decision.Record { mu.Lock(); defer mu.Unlock(); return append([]decision.Record(nil), recs...) }
}

// The middleware's decision records carry the request's user agent, which
// the detector's signals need.
func TestMiddlewareRecordsUserAgent(t *testing.T) {
	l, records := recordingLimiter(t)
	h := l.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), enforcer.MiddlewareOptions{})
	r := httptest.NewRequest("GET", "/v1/items", nil)
	r.RemoteAddr = "192.0.2.1:1111"
	r.Header.Set("User-Agent", "curl/8.4.0")
	h.ServeHTTP(httptest.NewRecorder(), r)
	if recs := records(); len(recs) != 1 || recs[0].UserAgent != "curl/8.4.0" {
		t.Fatalf("records %+v: want one with the user agent", recs)
	}
}

// The decision record carries the status the request was answered with:
// the handler's (404, an implicit 200, a 200 from a flush), the 429 of a
// deny, and none when the handler panics before answering.
func TestMiddlewareRecordsStatus(t *testing.T) {
	l, records := recordingLimiter(t)
	h := l.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/missing":
			http.NotFound(w, r)
		case "/hint":
			w.WriteHeader(http.StatusEarlyHints) // informational: not the status
			w.WriteHeader(http.StatusCreated)
		case "/flush":
			f, ok := w.(http.Flusher)
			if !ok {
				t.Error("the middleware's writer is not an http.Flusher")
				return
			}
			f.Flush()
		case "/panic":
			panic(http.ErrAbortHandler)
		}
	}), enforcer.MiddlewareOptions{})
	paths := []string{"/missing", "/empty", "/hint", "/flush", "/panic", "/denied"}
	for _, p := range paths {
		r := httptest.NewRequest("GET", p, nil)
		r.RemoteAddr = "192.0.2.1:1111"
		func() {
			defer func() { _ = recover() }()
			h.ServeHTTP(httptest.NewRecorder(), r)
		}()
	}
	want := []uint32{404, 200, 201, 200, 0, 429}
	recs := records()
	if len(recs) != len(want) {
		t.Fatalf("%d records, want %d", len(recs), len(want))
	}
	for i, rec := range recs {
		if rec.Status != want[i] || rec.Descriptors[rules.KeyPath] != paths[i] {
			t.Errorf("record %d: path %q status %d, want %q %d", i, rec.Descriptors[rules.KeyPath], rec.Status, paths[i], want[i])
		}
	}
}
