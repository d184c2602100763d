package backoff

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// fakeClock is a Clock whose Sleep returns at once, moving the time on and
// recording the wait. For one goroutine; under concurrency tests use
// testing/synctest and the system clock instead.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
}

func newFakeClock() *fakeClock { return &fakeClock{now: t0} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := context.Cause(ctx); err != nil {
		return err
	}
	if d <= 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sleeps = append(c.sleeps, d)
	c.now = c.now.Add(d)
	return nil
}

func (c *fakeClock) slept() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.sleeps...)
}

// sent is one request as the server saw it.
type sent struct {
	at   time.Time
	host string
	body string
}

// server is a fake inner RoundTripper: reply(n) answers the n-th request (0
// first). It records what it was sent and whether each response body was
// closed.
type server struct {
	now   func() time.Time
	reply func(n int, r *http.Request) *http.Response
	err   error // returned instead of a response, when set

	mu     sync.Mutex
	sent   []sent
	bodies []*body
}

func (s *server) RoundTrip(r *http.Request) (*http.Response, error) {
	var b []byte
	if r.Body != nil {
		b, _ = io.ReadAll(r.Body)
		r.Body.Close()
	}
	s.mu.Lock()
	n := len(s.sent)
	s.sent = append(s.sent, sent{at: s.now(), host: r.URL.Host, body: string(b)})
	s.mu.Unlock()
	if s.err != nil {
		return nil, s.err
	}
	resp := s.reply(n, r)
	bd := &body{Reader: strings.NewReader(http.StatusText(resp.StatusCode))}
	resp.Body, resp.Request = bd, r
	s.mu.Lock()
	s.bodies = append(s.bodies, bd)
	s.mu.Unlock()
	return resp, nil
}

func (s *server) requests() []sent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sent(nil), s.sent...)
}

type body struct {
	io.Reader
	mu     sync.Mutex
	closed bool
}

func (b *body) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	return nil
}

func (b *body) isClosed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

// response is a response with status and "Name: value" header lines.
func response(status int, lines ...string) *http.Response {
	return &http.Response{StatusCode: status, Header: hdr(lines...)}
}

// script replies with rs in turn, then with the last one.
func script(rs ...func() *http.Response) func(int, *http.Request) *http.Response {
	return func(n int, _ *http.Request) *http.Response { return rs[min(n, len(rs)-1)]() }
}

func status(code int, lines ...string) func() *http.Response {
	return func() *http.Response { return response(code, lines...) }
}

func newTransport(t *testing.T, inner http.RoundTripper, opts ...Opt) *Transport {
	t.Helper()
	tr, err := New(inner, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func get(t *testing.T, tr http.RoundTripper, url string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp
}

// TestRetryWaitsForTheServer: after a 429 the retry's recorded sleep is at
// least what the server asked for, in each of the forms it may ask, and at
// most 3× that (the jitter's spread); without a usable figure it is the
// jitter from the base.
func TestRetryWaitsForTheServer(t *testing.T) {
	const base = 100 * time.Millisecond
	cases := []struct {
		name   string
		lines  []string
		lo, hi time.Duration
	}{
		{"Retry-After seconds", []string{"Retry-After: 3"}, 3 * time.Second, 9 * time.Second},
		{"Retry-After date", []string{"Date: " + t0.Format(http.TimeFormat), "Retry-After: " + t0.Add(7*time.Second).Format(http.TimeFormat)}, 7 * time.Second, 21 * time.Second},
		{"Retry-After over reset", []string{"Retry-After: 2", `RateLimit: "p";r=0;t=10`}, 2 * time.Second, 6 * time.Second},
		{"RateLimit reset", []string{`RateLimit: "p";r=0;t=5`}, 5 * time.Second, 15 * time.Second},
		{"RateLimit-Policy window", []string{`RateLimit-Policy: "p";q=10;w=4`, `RateLimit: "p";r=0`}, 4 * time.Second, 12 * time.Second},
		{"legacy reset", []string{"X-RateLimit-Remaining: 0", "X-RateLimit-Reset: 4"}, 4 * time.Second, 12 * time.Second},
		{"sluice's deny", []string{"Retry-After: 1", `RateLimit-Policy: "per-ip";q=60;w=60`, `RateLimit: "per-ip";r=0;t=58`,
			"X-RateLimit-Limit: 60", "X-RateLimit-Remaining: 0", "X-RateLimit-Reset: 58"}, time.Second, 3 * time.Second},
		{"garbage", []string{"Retry-After: soon", `RateLimit: "p";r=-1`, "X-RateLimit-Reset: -3"}, base, 3 * base},
		{"nothing", nil, base, 3 * base},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for seed := range uint64(50) {
				clk := newFakeClock()
				srv := &server{now: clk.Now, reply: script(status(429, c.lines...), status(200))}
				tr := newTransport(t, srv, WithClock(clk), WithRand(rand.NewPCG(seed, 0)))
				if resp := get(t, tr, "http://api.test/x"); resp.StatusCode != 200 {
					t.Fatalf("status %d", resp.StatusCode)
				}
				sleeps, reqs := clk.slept(), srv.requests()
				if len(sleeps) != 1 || sleeps[0] < c.lo || sleeps[0] > c.hi || len(reqs) != 2 {
					t.Fatalf("seed %d: slept %v and sent %d requests; want one sleep in [%v, %v] and 2", seed, sleeps, len(reqs), c.lo, c.hi)
				}
				if got := reqs[1].at.Sub(reqs[0].at); got < c.lo {
					t.Fatalf("seed %d: retried after %v, before the server's %v", seed, got, c.lo)
				}
				if !srv.bodies[0].isClosed() {
					t.Errorf("the retried response's body was not closed")
				}
			}
		})
	}
}

// TestRetryAfterAboveCap: a wait longer than the cap is not made; the 429 is
// the answer, its body unread.
func TestRetryAfterAboveCap(t *testing.T) {
	for _, ra := range []string{"21", "99999999999999999999", "Fri, 31 Dec 9999 23:59:59 GMT"} {
		clk := newFakeClock()
		srv := &server{now: clk.Now, reply: script(status(429, "Retry-After: "+ra), status(200))}
		tr := newTransport(t, srv, WithClock(clk), WithCap(20*time.Second))
		resp := get(t, tr, "http://api.test/x")
		if resp.StatusCode != 429 || len(srv.requests()) != 1 || len(clk.slept()) != 0 || srv.bodies[0].isClosed() {
			t.Errorf("Retry-After %s: status %d after %d requests and sleeps %v, body closed %v; want the 429 at once, open",
				ra, resp.StatusCode, len(srv.requests()), clk.slept(), srv.bodies[0].isClosed())
		}
	}
}

// TestBlockedIsNotRetried: a 429 from a quota of 0 (sluice's limit of 0:
// RateLimit-Policy q=0, no reset, no Retry-After) is the answer at once, as
// no wait makes room; with a Retry-After (a region's share of 0, which the
// next share may raise) it is retried after it.
func TestBlockedIsNotRetried(t *testing.T) {
	blocked := []string{`RateLimit-Policy: "blocked-net";q=0;w=1`, `RateLimit: "blocked-net";r=0`, "Sluice-Reason: blocked"}
	for _, c := range []struct {
		name    string
		headers []string
		want    int
	}{
		{"blocked", blocked, 1},
		{"share of 0", append(blocked[:2:2], "Retry-After: 1"), 2},
	} {
		clk := newFakeClock()
		srv := &server{now: clk.Now, reply: script(status(429, c.headers...), status(200))}
		tr := newTransport(t, srv, WithClock(clk))
		get(t, tr, "http://api.test/x")
		if n := len(srv.requests()); n != c.want {
			t.Errorf("%s: %d requests, want %d", c.name, n, c.want)
		}
	}
}

// TestAttempts: a server that keeps answering 503 gets 4 attempts, the last
// response is returned open and the others closed; other statuses, and
// transport errors, are not retried.
func TestAttempts(t *testing.T) {
	clk := newFakeClock()
	srv := &server{now: clk.Now, reply: script(status(503))}
	tr := newTransport(t, srv, WithClock(clk))
	resp := get(t, tr, "http://api.test/x")
	if n := len(srv.requests()); resp.StatusCode != 503 || n != 4 {
		t.Fatalf("%d after %d attempts, want 503 after 4", resp.StatusCode, n)
	}
	for i, b := range srv.bodies {
		if b.isClosed() != (i < 3) {
			t.Errorf("body %d closed %v", i, b.isClosed())
		}
	}
	if got, _ := io.ReadAll(resp.Body); string(got) != "Service Unavailable" {
		t.Errorf("last body %q", got)
	}

	for _, c := range []struct {
		name   string
		status int
		opts   []Opt
		want   int
	}{
		{"500 by default", 500, nil, 1},
		{"500 when configured", 500, []Opt{WithStatuses(500)}, 4},
		{"429 when not configured", 429, []Opt{WithStatuses(503)}, 1},
		{"one attempt", 429, []Opt{WithMaxAttempts(1)}, 1},
		{"two attempts", 429, []Opt{WithMaxAttempts(2)}, 2},
	} {
		clk := newFakeClock()
		srv := &server{now: clk.Now, reply: script(status(c.status))}
		tr := newTransport(t, srv, append(c.opts, WithClock(clk))...)
		if resp := get(t, tr, "http://api.test/x"); resp.StatusCode != c.status || len(srv.requests()) != c.want {
			t.Errorf("%s: %d after %d attempts, want %d attempts", c.name, resp.StatusCode, len(srv.requests()), c.want)
		}
	}

	clk = newFakeClock()
	srv = &server{now: clk.Now, err: errors.New("connection refused")}
	tr = newTransport(t, srv, WithClock(clk))
	req, _ := http.NewRequest(http.MethodGet, "http://api.test/x", nil)
	if resp, err := tr.RoundTrip(req); resp != nil || err == nil || len(srv.requests()) != 1 {
		t.Errorf("transport error: %v, %v after %d attempts; want the error after 1", resp, err, len(srv.requests()))
	}
}

// TestBodyReplay: a retried request sends the same body each time; one whose
// body cannot be replayed, or whose method is not idempotent, is sent once.
func TestBodyReplay(t *testing.T) {
	always := func(*http.Request) bool { return true }
	cases := []struct {
		name  string
		req   func() *http.Request
		opts  []Opt
		sends int
	}{
		{"PUT, bytes body", func() *http.Request { return newReq(t, "PUT", bytes.NewReader([]byte("hello"))) }, nil, 3},
		{"POST with WithRetryable", func() *http.Request { return newReq(t, "POST", strings.NewReader("hello")) }, []Opt{WithRetryable(always)}, 3},
		{"POST with Idempotency-Key", func() *http.Request {
			r := newReq(t, "POST", strings.NewReader("hello"))
			r.Header.Set("Idempotency-Key", "k-1")
			return r
		}, nil, 3},
		{"POST", func() *http.Request { return newReq(t, "POST", strings.NewReader("hello")) }, nil, 1},
		{"PATCH", func() *http.Request { return newReq(t, "PATCH", strings.NewReader("hello")) }, nil, 1},
		{"PUT, a body without GetBody", func() *http.Request {
			return newReq(t, "PUT", io.MultiReader(strings.NewReader("hello")))
		}, []Opt{WithRetryable(always)}, 1},
	}
	for _, c := range cases {
		clk := newFakeClock()
		srv := &server{now: clk.Now, reply: script(status(503), status(429), status(201))}
		tr := newTransport(t, srv, append(c.opts, WithClock(clk))...)
		resp, err := tr.RoundTrip(c.req())
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		reqs := srv.requests()
		if len(reqs) != c.sends {
			t.Errorf("%s: %d sends (status %d), want %d", c.name, len(reqs), resp.StatusCode, c.sends)
		}
		for i, r := range reqs {
			if r.body != "hello" {
				t.Errorf("%s: send %d had body %q", c.name, i, r.body)
			}
		}
	}
}

func newReq(t *testing.T, method string, body io.Reader) *http.Request {
	t.Helper()
	r, err := http.NewRequest(method, "http://api.test/x", body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestSelfThrottle: after a response says remaining 0 with reset N, the next
// request to that host is held N on the clock and not sent before; another
// host is not held; a response with quota left lifts the throttle.
func TestSelfThrottle(t *testing.T) {
	for _, c := range []struct {
		name  string
		lines []string
		wait  time.Duration
	}{
		{"RateLimit", []string{`RateLimit: "p";r=0;t=5`}, 5 * time.Second},
		{"legacy", []string{"X-RateLimit-Remaining: 0", "X-RateLimit-Reset: 7"}, 7 * time.Second},
		{"legacy epoch", []string{"X-RateLimit-Remaining: 0", "X-RateLimit-Reset: " + strconv.FormatInt(t0.Unix()+3, 10)}, 3 * time.Second},
		{"reset beyond the cap", []string{`RateLimit: "p";r=0;t=3600`}, 20 * time.Second},
		{"from a cache", []string{"Age: 10", `RateLimit: "p";r=0;t=5`}, 0},
		{"quota left", []string{`RateLimit: "p";r=1;t=5`}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			clk := newFakeClock()
			srv := &server{now: clk.Now, reply: script(status(200, c.lines...), status(200))}
			tr := newTransport(t, srv, WithClock(clk))
			get(t, tr, "http://api.test/a")
			get(t, tr, "http://other.test/a") // another host: not held
			get(t, tr, "http://API.test:80/b")
			reqs := srv.requests()
			if reqs[1].at != t0 {
				t.Errorf("another host's request was held until %v", reqs[1].at.Sub(t0))
			}
			if got := reqs[2].at.Sub(t0); got != c.wait {
				t.Errorf("the next request was sent after %v, want %v (sleeps %v)", got, c.wait, clk.slept())
			}
		})
	}

	t.Run("off", func(t *testing.T) {
		clk := newFakeClock()
		srv := &server{now: clk.Now, reply: script(status(200, `RateLimit: "p";r=0;t=5`))}
		tr := newTransport(t, srv, WithClock(clk), WithoutSelfThrottle())
		get(t, tr, "http://api.test/a")
		get(t, tr, "http://api.test/a")
		if reqs := srv.requests(); reqs[1].at != t0 {
			t.Errorf("WithoutSelfThrottle: held %v", reqs[1].at.Sub(t0))
		}
	})

	t.Run("lifted", func(t *testing.T) {
		clk := newFakeClock()
		srv := &server{now: clk.Now, reply: script(status(200, `RateLimit: "p";r=0;t=5`), status(200, `RateLimit: "p";r=9;t=5`), status(200))}
		tr := newTransport(t, srv, WithClock(clk))
		get(t, tr, "http://api.test/a")
		get(t, tr, "http://api.test/a") // held 5 s; its response says 9 left
		get(t, tr, "http://api.test/a")
		if reqs := srv.requests(); reqs[2].at != reqs[1].at {
			t.Errorf("remaining 9 did not lift the throttle: held %v", reqs[2].at.Sub(reqs[1].at))
		}
	})
}

// TestPacing: with WithLowRemaining(5), remaining 4 and reset 8 s send the
// next requests 2 s apart until the reset.
func TestPacing(t *testing.T) {
	clk := newFakeClock()
	srv := &server{now: clk.Now, reply: script(status(200, `RateLimit: "p";r=4;t=8`), status(200))}
	tr := newTransport(t, srv, WithClock(clk), WithLowRemaining(5))
	for range 7 {
		get(t, tr, "http://api.test/a")
	}
	var got []time.Duration
	for _, r := range srv.requests() {
		got = append(got, r.at.Sub(t0))
	}
	want := []time.Duration{0, 0, 2 * time.Second, 4 * time.Second, 6 * time.Second, 8 * time.Second, 8 * time.Second}
	if !equal(got, want) {
		t.Errorf("sends at %v, want %v", got, want)
	}

	// Without WithLowRemaining there is no pacing.
	clk = newFakeClock()
	srv = &server{now: clk.Now, reply: script(status(200, `RateLimit: "p";r=4;t=8`), status(200))}
	tr = newTransport(t, srv, WithClock(clk))
	for range 3 {
		get(t, tr, "http://api.test/a")
	}
	if s := clk.slept(); len(s) != 0 {
		t.Errorf("paced by default: %v", s)
	}
}

func equal(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestContextStopsWaiting: a context done while the transport waits (for a
// retry, or for the host's throttle) ends RoundTrip at once with its cause,
// and nothing more is sent. On the system clock inside a synctest bubble, so
// "at once" is exact virtual time.
func TestContextStopsWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		srv := &server{now: time.Now, reply: script(status(429, "Retry-After: 10"), status(200))}
		tr := newTransport(t, srv)
		stop := errors.New("caller gave up")
		ctx, cancel := context.WithCancelCause(context.Background())
		time.AfterFunc(time.Second, func() { cancel(stop) })
		req := newReq(t, "PUT", strings.NewReader("x")).WithContext(ctx)
		resp, err := tr.RoundTrip(req)
		if resp != nil || !errors.Is(err, stop) || time.Since(start) != time.Second || len(srv.requests()) != 1 {
			t.Errorf("retry wait: %v, %v after %v and %d requests; want the cause after 1 s and 1 request", resp, err, time.Since(start), len(srv.requests()))
		}
		if !srv.bodies[0].isClosed() {
			t.Errorf("the 429's body was not closed")
		}

		// The host is now throttled for 9 s more: a request whose context ends
		// after 2 s is never sent, and its body is closed.
		ctx, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel2()
		b := &body{Reader: strings.NewReader("y")}
		req, _ = http.NewRequestWithContext(ctx, "POST", "http://api.test/x", b)
		start = time.Now()
		resp, err = tr.RoundTrip(req)
		if resp != nil || !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != 2*time.Second || len(srv.requests()) != 1 {
			t.Errorf("throttle wait: %v, %v after %v and %d requests; want DeadlineExceeded after 2 s, nothing sent", resp, err, time.Since(start), len(srv.requests()))
		}
		if !b.isClosed() {
			t.Errorf("the unsent request's body was not closed")
		}
	})

	// A fake clock: a context cancelled during the first attempt stops the
	// retry's sleep before it starts.
	clk := newFakeClock()
	ctx, cancel := context.WithCancel(context.Background())
	srv := &server{now: clk.Now, reply: func(int, *http.Request) *http.Response { cancel(); return response(429, "Retry-After: 1") }}
	tr := newTransport(t, srv, WithClock(clk))
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://api.test/x", nil)
	if _, err := tr.RoundTrip(req); !errors.Is(err, context.Canceled) || len(clk.slept()) != 0 || len(srv.requests()) != 1 {
		t.Errorf("%v after sleeps %v and %d requests", err, clk.slept(), len(srv.requests()))
	}
}

// TestConcurrentRequestsHeld: a Transport shared by 100 goroutines holds them
// all, once a response said the quota is spent, until its reset, and none of
// them is sent before it. Under -race this also checks the locking.
func TestConcurrentRequestsHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		srv := &server{now: time.Now, reply: script(status(200, `RateLimit: "p";r=0;t=2`), status(200))}
		tr := newTransport(t, srv, WithRand(rand.NewPCG(7, 7)))
		get(t, tr, "http://api.test/first")
		var wg sync.WaitGroup
		for range 100 {
			wg.Go(func() {
				resp := get(t, tr, "http://api.test/x")
				resp.Body.Close()
			})
		}
		wg.Wait()
		reqs := srv.requests()
		if len(reqs) != 101 {
			t.Fatalf("%d requests, want 101", len(reqs))
		}
		for _, r := range reqs[1:] {
			if d := r.at.Sub(start); d != 2*time.Second {
				t.Fatalf("a request was sent at %v, want at the reset, 2 s", d)
			}
		}
	})
}

func TestNewValidates(t *testing.T) {
	for _, opts := range [][]Opt{
		{WithBase(0)},
		{WithBase(time.Second), WithCap(time.Millisecond)},
		{WithMaxAttempts(0)},
		{WithLowRemaining(-1)},
		{WithStatuses(429, 99)},
		{WithRetryable(nil)},
		{WithClock(nil)},
		{WithRand(nil)},
	} {
		if _, err := New(nil, opts...); err == nil {
			t.Errorf("New accepted %d options that should fail", len(opts))
		}
	}
	if tr, err := New(nil); err != nil || tr.inner != http.DefaultTransport {
		t.Errorf("New(nil) = %v, %v", tr, err)
	}
}

func TestHostKey(t *testing.T) {
	for in, want := range map[string]string{
		"https://API.example.com/v1":     "api.example.com:443",
		"https://api.example.com:443/v1": "api.example.com:443",
		"http://api.example.com/v1":      "api.example.com:80",
		"http://api.example.com:8080/":   "api.example.com:8080",
		"http://[2001:db8::1]/":          "[2001:db8::1]:80",
	} {
		req, _ := http.NewRequest("GET", in, nil)
		if got := HostKey(req.URL); got != want {
			t.Errorf("HostKey(%s) = %s, want %s", in, got, want)
		}
	}
}
