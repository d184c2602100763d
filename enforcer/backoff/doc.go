// Package backoff is an http.RoundTripper for the callers of an API that
// sluice (or any limiter that speaks the rate-limit headers) protects: it
// retries throttled requests with decorrelated jitter, never sooner than the
// server asked, and holds requests back while an earlier response said the
// quota was spent, so that they are not sent only to be refused.
//
// # Usage
//
//	tr, err := backoff.New(http.DefaultTransport) // defaults: 4 attempts, 100 ms base, 20 s cap
//	if err != nil { ... }
//	client := &http.Client{Transport: tr}
//	resp, err := client.Get("https://api.example.com/v1/items")
//	// resp may still be a 429 or 503: when attempts ran out, the request was not
//	// retryable, or the server asked for a wait longer than the cap.
//
// # Reading the server
//
// ParseHeaders reads, from every response: Retry-After (RFC 9110 §10.2.3;
// delta-seconds or an HTTP-date, taken relative to the response's Date); the
// RateLimit and RateLimit-Policy fields of draft-ietf-httpapi-ratelimit-headers-10
// (RateLimit: "per-ip";r=0;t=58, a Structured Field List, RFC 9651); else the
// legacy X-RateLimit-Remaining and X-RateLimit-Reset (seconds, as sluice and
// envoyproxy/ratelimit send it, or a Unix time when at least 10^9, as GitHub
// sends it). sluice's own headers are in enforcer/headers.go. Malformed
// fields are ignored, never guessed at; nothing a header says can panic the
// parser or make a wait longer than the cap.
//
// # Retries
//
// A response whose status is retryable (429 and 503 by default,
// WithStatuses) is retried when the request is (idempotent by default,
// WithRetryable, see Idempotent) and its body can be replayed (no body, or
// GetBody, which http.NewRequest sets for in-memory bodies), up to 4
// attempts in all (WithMaxAttempts). The wait before a retry is
//
//	sleep = min(cap, random_between(max(base, floor), 3 × max(previous sleep, base, floor)))
//
// the decorrelated jitter of the AWS Architecture Blog's "Exponential Backoff
// And Jitter" (Brooker, 2015), whose lower bound is raised to the floor the
// server gave: Retry-After, which takes precedence (draft §7), else the
// RateLimit (or X-RateLimit) reset when no quota remains. A thousand clients
// told "Retry-After: 1" at once thus come back spread over [1 s, 3 s), not
// at 1 s; a floor above the cap is not waited for (the response is
// returned). A transport error is returned at once (http.Transport already
// retries idempotent requests on connections that failed before the response).
// A done context stops any wait at once, with context.Cause.
//
// # Self-throttling
//
// Each response also updates its host's throttle (the key is HostKey: the
// URL's host and port; see there for why): after a throttled response with
// Retry-After, or any response with remaining 0 and a reset t, requests to
// that host wait until then before they are sent; with WithLowRemaining(n),
// a remaining 0 < r ≤ n paces them t/r apart until the reset. The newest
// response's word holds, and remaining above n lifts the throttle. No wait
// is longer than the cap: a request held that long is then sent, and the
// server decides.
//
// # The retry loop
//
// The loop is github.com/cenkalti/backoff/v5's Retry (attempt count,
// permanent errors, the context between attempts); the delay policy is
// Decorrelated, which implements that package's BackOff. Two parts of the
// library are not used. Its wait: v5 sleeps on an internal time.Timer that
// cannot be replaced (v5.0.0 removed the Clock and Timer options), so the
// library is given zero delays and each attempt first sleeps the policy's
// delay on the transport's Clock (WithClock), which lets tests run on a fake
// clock. And its RetryAfter errors: they make the next wait exactly the
// server's figure (and reset the policy), which sends every client told
// "Retry-After: 1" back in the same instant, the herd this package exists to
// spread.
package backoff
