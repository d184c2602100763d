package enforcer

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/rules"
)

// MiddlewareOptions configure Limiter.Middleware. The zero value is usable.
type MiddlewareOptions struct {
	// Describe fills the limiter request for an HTTP request. The default
	// sets client_ip from RemoteAddr (the limiter drops the port), method,
	// and route and path from the URL path; it suits a service that is not
	// behind a proxy. Behind one, take the client address from the header
	// the proxy sets, and the route from the router.
	Describe func(r *http.Request, req *Request)
	// Headers is the set of rate-limit headers written on every response;
	// default AllHeaders.
	Headers HeaderSet
	// UnavailableStatus answers a request that a fail-closed rule denies
	// because Redis is unavailable: 429 (the default) or 503.
	UnavailableStatus int
}

// DescribeHTTP is the default MiddlewareOptions.Describe.
func DescribeHTTP(r *http.Request, req *Request) {
	req.Descriptors[rules.KeyClientIP] = r.RemoteAddr
	req.Descriptors[rules.KeyMethod] = r.Method
	req.Descriptors[rules.KeyRoute] = r.URL.Path
	req.Descriptors[rules.KeyPath] = r.URL.Path
}

// Middleware limits the requests next serves: each is decided first, gets
// the rate-limit headers of its decision, and is answered 429 Too Many
// Requests (or UnavailableStatus when a fail-closed rule denies because
// Redis is unavailable) without reaching next when denied. Concurrency slots
// are released when next returns. A request the limiter cannot decide
// (ErrBadRequest) is served, and counted by the limiter; one shed because
// the limiter is saturated is decided by its rules' failure modes
// (Decision.Err ErrOverloaded) like any degraded request.
//
// The decision record is logged once the response is written, with its
// status (the first final status next writes, else 200 as net/http
// answers; 0 if next panics before writing one), because the detector's scan and
// new-identity signals count 404s and failed logins. next sees a
// ResponseWriter that passes Flush through and unwraps (Unwrap, for
// http.ResponseController) to the original.
func (l *Limiter) Middleware(next http.Handler, o MiddlewareOptions) http.Handler {
	return NewMiddleware(l, next, o)
}

// Gatekeeper is what the HTTP middleware needs of a limiter; *Limiter is one.
type Gatekeeper interface {
	Decide(ctx context.Context, req *Request, d *Decision) error
	Release(ctx context.Context, d *Decision) error
	LogStatus(d *Decision, status int)
	ObserveResponse(now time.Time, status int, latency time.Duration)
	BeginWork()
	EndWork()
}

// NewMiddleware is Limiter.Middleware for any Gatekeeper.
func NewMiddleware(l Gatekeeper, next http.Handler, o MiddlewareOptions) http.Handler {
	if o.Describe == nil {
		o.Describe = DescribeHTTP
	}
	if o.Headers == 0 {
		o.Headers = AllHeaders
	}
	if o.UnavailableStatus == 0 {
		o.UnavailableStatus = http.StatusTooManyRequests
	}
	type scratch struct {
		req Request
		d   Decision
		sw  statusWriter
	}
	pool := sync.Pool{New: func() any { return new(scratch) }}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := pool.Get().(*scratch)
		defer pool.Put(s)
		// The user agent travels in the decision record, for the detector's
		// signals; a Describe may replace it.
		s.req = Request{UserAgent: r.UserAgent(), LogLater: true}
		o.Describe(r, &s.req)
		if err := l.Decide(r.Context(), &s.req, &s.d); err != nil {
			next.ServeHTTP(w, r)
			return
		}
		d := &s.d
		d.WriteHeaders(w.Header(), o.Headers)
		if !d.Outcome.Allow() {
			status := http.StatusTooManyRequests
			switch d.Reason {
			case decision.ReasonLimiterUnavailable:
				status = o.UnavailableStatus
			case decision.ReasonShed:
				status = http.StatusServiceUnavailable // the backend is overloaded, not the client over a quota
			}
			http.Error(w, http.StatusText(status), status)
			l.LogStatus(d, status)
			return
		}
		s.sw = statusWriter{ResponseWriter: w}
		l.BeginWork()
		served := time.Now()
		// Deferred, so that a handler that panics (http.Server recovers)
		// still releases its slots and logs its record.
		defer func() {
			l.EndWork()
			status := s.sw.status
			if status == 0 {
				status = http.StatusInternalServerError // next panicked before writing: the backend failed
			}
			now := time.Now()
			l.ObserveResponse(now, status, now.Sub(served))
			if len(d.Leases) > 0 {
				l.Release(context.WithoutCancel(r.Context()), d)
			}
			l.LogStatus(d, s.sw.status)
			s.sw = statusWriter{}
		}()
		next.ServeHTTP(&s.sw, r)
		if s.sw.status == 0 {
			s.sw.status = http.StatusOK // what net/http answers for it
		}
	})
}

// statusWriter remembers the status a handler answers with.
type statusWriter struct {
	http.ResponseWriter
	status int
}

// WriteHeader records the first final (non-1xx) status.
func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write answers 200 when no status was written, as net/http does.
func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Flush sends buffered data, when the underlying writer can.
func (w *statusWriter) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap returns the original writer, for http.ResponseController.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
