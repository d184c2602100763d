package backoff

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	retry "github.com/cenkalti/backoff/v5"
)

// Transport is an http.RoundTripper that retries throttled requests with
// decorrelated jitter, never sooner than the server asked, and holds back
// requests to a host whose quota an earlier response said was spent. See
// the package doc for the policy.
//
// Make one with New; the zero value is not usable. A Transport is safe for
// concurrent use, and should be shared by the requests of one identity (API
// key, user) to a host: its throttle is kept per host. RoundTrip is the
// method most callers want, through an http.Client.
type Transport struct {
	inner http.RoundTripper
	cfg   config

	randMu sync.Mutex // guards cfg.rand

	mu    sync.Mutex       // guards hosts
	hosts map[string]*gate // throttled hosts only: an entry is dropped once it holds nothing back
}

// gate is one host's throttle.
type gate struct {
	until    time.Time     // no request is sent before this
	interval time.Duration // when pacing: the least time between sends
	paceEnd  time.Time     // pacing stops here (the reset)
	next     time.Time     // when pacing: the next free send slot
}

// New returns a Transport that sends requests through inner
// (http.DefaultTransport when nil), with the options' defaults for what
// opts do not set. It fails only on an invalid option.
func New(inner http.RoundTripper, opts ...Opt) (*Transport, error) {
	c := defaults()
	for _, o := range opts {
		o(&c)
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	if inner == nil {
		inner = http.DefaultTransport
	}
	return &Transport{inner: inner, cfg: c, hosts: make(map[string]*gate)}, nil
}

// Idempotent reports whether a request may be sent twice with the effect of
// once: its method is idempotent (GET, HEAD, OPTIONS, TRACE, PUT, DELETE;
// RFC 9110 §9.2.2), or it carries an Idempotency-Key or X-Idempotency-Key
// header, as net/http's Transport also counts it. It is the default
// WithRetryable.
func Idempotent(r *http.Request) bool {
	switch r.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	_, key := r.Header["Idempotency-Key"]
	_, xkey := r.Header["X-Idempotency-Key"]
	return key || xkey
}

// replayable reports whether r's body can be sent again.
func replayable(r *http.Request) bool {
	return r.Body == nil || r.Body == http.NoBody || r.GetBody != nil
}

// HostKey is the key of the throttle a request waits on: its URL's host,
// lower-cased, with the scheme's default port made explicit
// ("api.example.com:443"). A limiter's real partition (an API key, an
// address, a tenant) is not visible to a client; one client normally calls
// one API per host as one identity, so the host is the narrowest key that
// never lets a throttled partition through. It holds back all of a host's
// routes when only one route's rule is spent: conservative, never a 429.
func HostKey(u *url.URL) string {
	host, port := strings.ToLower(u.Hostname()), u.Port()
	if port == "" {
		switch strings.ToLower(u.Scheme) {
		case "http", "ws":
			port = "80"
		case "https", "wss":
			port = "443"
		}
	}
	return net.JoinHostPort(host, port)
}

// errRetryableStatus marks a response with a retryable status for the
// retry loop; RoundTrip returns such a response, not this error.
var errRetryableStatus = errors.New("backoff: retryable status")

// RoundTrip sends req, waiting first if its host is throttled, and sends it
// again after a retryable status while attempts remain, the request is
// retryable and its body replayable, and the server's wait is within the
// cap. It returns the last response (possibly a 429 or 503) or the first
// transport error, or the context's error (context.Cause) as soon as
// req's context is done while waiting. It implements http.RoundTripper:
// req is not modified, and its body is closed.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	a := &attempts{t: t, req: req, host: HostKey(req.URL),
		jitter: Decorrelated{Base: t.cfg.base, Cap: t.cfg.cap, Rand: lockedSource{t}}}
	tries := uint(1)
	if t.cfg.retryable(req) && replayable(req) {
		tries = uint(t.cfg.attempts)
	}
	resp, err := retry.Retry(req.Context(), a.send,
		retry.WithBackOff(a), retry.WithMaxTries(tries), retry.WithMaxElapsedTime(0))
	switch {
	case errors.Is(err, errRetryableStatus):
		return resp, nil // the last response; no more retries
	case err != nil:
		if resp != nil {
			drainClose(resp) // the loop stopped on the context before a retry
		}
		if !a.sent && req.Body != nil {
			req.Body.Close() // the RoundTripper contract, when the inner transport never saw it
		}
		return nil, err
	}
	return resp, nil
}

// CloseIdleConnections closes the inner transport's idle connections, if it
// has such a method (http.Client.CloseIdleConnections calls this).
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.inner.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// attempts is one RoundTrip's state. It is the operation of
// github.com/cenkalti/backoff/v5's Retry and its BackOff: the library runs
// the loop (attempt count, permanent errors, the context between attempts)
// and asks for each delay; the delay is slept at the start of the next
// attempt on the transport's Clock, since v5 has no injectable timer, so the
// library's own wait is 0.
type attempts struct {
	t      *Transport
	req    *http.Request
	host   string
	jitter Decorrelated
	n      int            // attempts sent
	sent   bool           // req (and its body) reached the inner transport
	last   *http.Response // the retryable response, until the next attempt
	floor  time.Duration  // the least wait the last response asked for
	wait   time.Duration  // the delay before the next attempt
}

// NextBackOff chooses the delay before the next attempt: decorrelated
// jitter above the server's floor, or Stop when the floor passes the cap.
// It implements backoff.BackOff.
func (a *attempts) NextBackOff() time.Duration {
	d := a.jitter.NextAfter(a.floor)
	if d == retry.Stop {
		return retry.Stop
	}
	a.wait = d
	return 0
}

// Reset implements backoff.BackOff.
func (a *attempts) Reset() { a.jitter.Reset() }

// send is one attempt: the delay, the host's throttle, then the request.
// Errors that end the loop are wrapped in backoff.Permanent.
func (a *attempts) send() (*http.Response, error) {
	t, ctx, r := a.t, a.req.Context(), a.req
	clk := t.cfg.clock
	if a.n > 0 {
		drainClose(a.last) // frees the connection while we wait
		a.last = nil
		if err := clk.Sleep(ctx, a.wait); err != nil {
			return nil, retry.Permanent(err)
		}
		r = a.req.Clone(ctx)
		if a.req.Body != nil && a.req.Body != http.NoBody {
			body, err := a.req.GetBody()
			if err != nil {
				return nil, retry.Permanent(fmt.Errorf("backoff: replaying the request body: %w", err))
			}
			r.Body = body
		}
	}
	if t.cfg.throttle {
		if d := t.reserve(a.host, clk.Now()); d > 0 {
			if err := clk.Sleep(ctx, d); err != nil {
				if r != a.req && r.Body != nil {
					r.Body.Close()
				}
				return nil, retry.Permanent(err)
			}
		}
	}
	a.n++
	a.sent = true
	resp, err := t.inner.RoundTrip(r)
	if err != nil {
		return nil, retry.Permanent(err)
	}
	now := clk.Now()
	sig := ParseHeaders(resp.Header, now)
	throttled := slices.Contains(t.cfg.statuses, resp.StatusCode)
	if t.cfg.throttle {
		t.observe(a.host, sig, throttled, now)
	}
	if !throttled || sig.Blocked && sig.RetryAfter < 0 {
		// Not throttled, or by a quota of 0 that no wait helps (no
		// Retry-After either): the caller gets the response.
		return resp, nil
	}
	a.last, a.floor = resp, floor(sig)
	return resp, errRetryableStatus
}

// floor is the least wait a throttled response asks for: Retry-After, which
// takes precedence (draft-ietf-httpapi-ratelimit-headers-10 §7), else the
// reset when no quota remains, else 0.
func floor(s Signal) time.Duration {
	switch {
	case s.RetryAfter >= 0:
		return s.RetryAfter
	case s.Remaining == 0 && s.Reset >= 0:
		return s.Reset
	}
	return 0
}

// observe updates host's throttle from a response received at now. The
// latest response's word holds: a wait (Retry-After on a throttled
// response, else remaining 0 until the reset), pacing (remaining low), or,
// when remaining is above the low mark, no throttle. A response that says
// nothing changes nothing.
func (t *Transport) observe(host string, s Signal, throttled bool, now time.Time) {
	var until time.Time
	var interval, reset time.Duration
	switch {
	case throttled && s.RetryAfter >= 0:
		until = now.Add(s.RetryAfter)
	case s.Remaining == 0 && s.Reset >= 0:
		until = now.Add(s.Reset)
	case s.Remaining > 0 && s.Remaining <= t.cfg.low && s.Reset > 0:
		interval, reset = s.Reset/time.Duration(s.Remaining), s.Reset
	case s.Remaining > t.cfg.low:
		// quota is left: no throttle
	default:
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	g := t.hosts[host]
	if until.IsZero() && interval == 0 {
		delete(t.hosts, host)
		return
	}
	if g == nil {
		g = new(gate)
		t.hosts[host] = g
	}
	g.until = until
	g.interval, g.paceEnd = interval, now.Add(reset)
	if interval == 0 {
		g.next = time.Time{}
	}
}

// reserve returns how long a request to host must wait at now, at most the
// cap, and takes its send slot when the host is paced.
func (t *Transport) reserve(host string, now time.Time) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	g := t.hosts[host]
	if g == nil {
		return 0
	}
	at := now
	if g.until.After(at) {
		at = g.until
	}
	if g.interval > 0 && at.Before(g.paceEnd) {
		if g.next.After(at) {
			at = g.next
		}
		g.next = at.Add(g.interval)
	}
	if !g.until.After(now) && !g.paceEnd.After(now) {
		delete(t.hosts, host) // holds nothing back any more
	}
	return min(at.Sub(now), t.cfg.cap)
}

// lockedSource serializes draws from the transport's source.
type lockedSource struct{ t *Transport }

func (l lockedSource) Uint64() uint64 {
	l.t.randMu.Lock()
	defer l.t.randMu.Unlock()
	return l.t.cfg.rand.Uint64()
}

var _ rand.Source = lockedSource{}

// drainClose reads a little of a discarded response's body, so that its
// connection can be reused, and closes it.
func drainClose(resp *http.Response) {
	if resp == nil || resp.Body == nil {
		return
	}
	io.CopyN(io.Discard, resp.Body, 4<<10)
	resp.Body.Close()
}
