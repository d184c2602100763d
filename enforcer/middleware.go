package enforcer

import (
	"context"
	"net/http"
	"sync"

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
// (ErrBadRequest) is served, and counted by the limiter.
func (l *Limiter) Middleware(next http.Handler, o MiddlewareOptions) http.Handler {
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
	}
	pool := sync.Pool{New: func() any { return new(scratch) }}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := pool.Get().(*scratch)
		defer pool.Put(s)
		// The user agent travels in the decision record, for the detector's
		// signals; a Describe may replace it.
		s.req = Request{UserAgent: r.UserAgent()}
		o.Describe(r, &s.req)
		if err := l.Decide(r.Context(), &s.req, &s.d); err != nil {
			next.ServeHTTP(w, r)
			return
		}
		d := &s.d
		d.WriteHeaders(w.Header(), o.Headers)
		if !d.Outcome.Allow() {
			status := http.StatusTooManyRequests
			if d.Reason == ReasonLimiterUnavailable {
				status = o.UnavailableStatus
			}
			http.Error(w, http.StatusText(status), status)
			return
		}
		if len(d.Leases) > 0 {
			defer l.Release(context.WithoutCancel(r.Context()), d)
		}
		next.ServeHTTP(w, r)
	})
}
