package backoff

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// sluiceServer serves 200 behind sluice's own middleware (a real Limiter on
// a real redis-server) with a token bucket of 2 per client, refilled 1 per
// 2 s, deciding on clk, and counts the statuses it answers.
func sluiceServer(t *testing.T, clk *fakeClock) (url string, statuses func() map[int]int) {
	t.Helper()
	set, err := rules.Parse("test.yaml", []byte(`
domain: api
rules: [{id: per-ip, match: [{key: client_ip}], limit: 1, period: 2s, burst: 2}]`))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := enforcer.New(redistest.Server(t), set, enforcer.Options{Budget: time.Second, Clock: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	h := lim.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), enforcer.MiddlewareOptions{
		Describe: func(r *http.Request, req *enforcer.Request) {
			enforcer.DescribeHTTP(r, req)
			req.Now = clk.Now()
		},
	})
	var mu sync.Mutex
	counts := map[int]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, code: 200}
		h.ServeHTTP(rec, r)
		mu.Lock()
		counts[rec.code]++
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	return srv.URL, func() map[int]int {
		mu.Lock()
		defer mu.Unlock()
		return map[int]int{200: counts[200], 429: counts[429]}
	}
}

type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.code = code
	r.ResponseWriter.WriteHeader(code)
}

// TestAgainstSluice: the transport reads the headers sluice's middleware
// writes (enforcer/headers.go). Self-throttled, six requests against a
// bucket of 2 never meet a 429: after remaining 0 and t=4 (the time until
// the bucket is full) the next two wait 4 s. Without self-throttling, every
// 429 is retried no sooner than its Retry-After and every request ends in
// a 200.
func TestAgainstSluice(t *testing.T) {
	t.Run("self-throttled", func(t *testing.T) {
		clk := newFakeClock()
		url, statuses := sluiceServer(t, clk)
		tr := newTransport(t, nil, WithClock(clk))
		for i := range 6 {
			if resp := get(t, tr, url+"/v1/items"); resp.StatusCode != 200 {
				t.Fatalf("request %d: %d", i, resp.StatusCode)
			}
		}
		if got := statuses(); got[429] != 0 || got[200] != 6 {
			t.Errorf("the server answered %v, want six 200s and no 429", got)
		}
		if s := clk.slept(); !equal(s, []time.Duration{4 * time.Second, 4 * time.Second}) {
			t.Errorf("slept %v, want 4 s twice", s)
		}
	})

	t.Run("retries only", func(t *testing.T) {
		clk := newFakeClock()
		url, statuses := sluiceServer(t, clk)
		var mu sync.Mutex
		var retryAfter []time.Duration
		tr := newTransport(t, roundTripFunc(func(r *http.Request) (*http.Response, error) {
			resp, err := http.DefaultTransport.RoundTrip(r)
			if err == nil && resp.StatusCode == 429 {
				n, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
				mu.Lock()
				retryAfter = append(retryAfter, time.Duration(n)*time.Second)
				mu.Unlock()
			}
			return resp, err
		}), WithClock(clk), WithoutSelfThrottle(), WithRand(zeroSource{}))
		for i := range 6 {
			if resp := get(t, tr, url+"/v1/items"); resp.StatusCode != 200 {
				t.Fatalf("request %d: %d", i, resp.StatusCode)
			}
		}
		got, sleeps := statuses(), clk.slept()
		if got[200] != 6 || got[429] == 0 || len(sleeps) != got[429] {
			t.Fatalf("the server answered %v and the transport slept %v; want six 200s, some 429s, a sleep per 429", got, sleeps)
		}
		t.Logf("server answered %v; Retry-After %v; slept %v", got, retryAfter, sleeps)
		for i, ra := range retryAfter {
			if ra < time.Second || sleeps[i] < ra {
				t.Errorf("429 %d: Retry-After %v, slept %v", i, ra, sleeps[i])
			}
		}
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
