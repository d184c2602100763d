package backoff

import (
	"math"
	"net/http"
	"strings"
	"time"
)

// maxDuration is the longest time.Duration; parsed waits saturate at it.
const maxDuration = time.Duration(math.MaxInt64)

// epochResetFrom: an X-RateLimit-Reset of at least this many seconds is a
// Unix time (GitHub's and Twitter's form), not a delay (sluice's and
// envoyproxy/ratelimit's form): 10^9 s is 2001-09-09, while 31 years is no
// reset a server means.
const epochResetFrom = 1_000_000_000

// Signal is what one response's headers say about when to send the next
// request. Negative fields are unknown: the header was absent or malformed
// (malformed fields are ignored, as draft-ietf-httpapi-ratelimit-headers-10
// §7 requires, never guessed at).
type Signal struct {
	// RetryAfter is the wait Retry-After asks for (RFC 9110 §10.2.3): its
	// delta-seconds, or its HTTP-date minus the response's Date (minus the
	// receipt time when there is no valid Date), 0 when that date has
	// passed; -1 when absent or malformed. Saturates at the longest
	// time.Duration.
	RetryAfter time.Duration
	// Remaining is the quota units left in the binding policy: the r of the
	// RateLimit field, else X-RateLimit-Remaining; -1 when unknown.
	Remaining int64
	// Reset is the wait until more quota is made available: RateLimit's t,
	// else the w of the same-named RateLimit-Policy item, else
	// X-RateLimit-Reset (seconds, or a Unix time when at least 10^9); -1
	// when unknown.
	Reset time.Duration
	// Policy names the binding RateLimit item (e.g. "per-ip"); empty for the
	// legacy headers.
	Policy string
}

// ParseHeaders reads the rate-limit fields of a response received at now:
// Retry-After, then the RateLimit and RateLimit-Policy fields of
// draft-ietf-httpapi-ratelimit-headers-10, else the legacy X-RateLimit-Remaining
// and X-RateLimit-Reset. It never fails and never panics: what it cannot
// read is unknown (-1).
//
// RateLimit may list several service limits (and be split over several
// field lines): the binding one is the one with the least remaining, ties
// broken by the longest reset. A field that is not a valid Structured Field
// List (RFC 9651 §4.2) of Strings with a non-negative Integer r (and t, if
// present) is ignored whole. The RateLimit fields of a response from a cache
// (a positive Age) are stale and ignored (draft §7.3); Retry-After is still
// read.
func ParseHeaders(h http.Header, now time.Time) Signal {
	s := Signal{RetryAfter: -1, Remaining: -1, Reset: -1}
	ref := now
	if d, err := http.ParseTime(h.Get("Date")); err == nil {
		ref = d // the server's clock: no skew between its reset and ours
	}
	if v := h.Get("Retry-After"); v != "" {
		s.RetryAfter = parseRetryAfter(v, ref)
	}
	if age, ok := parseSeconds(strings.TrimSpace(h.Get("Age"))); ok && age > 0 {
		return s
	}
	if rl := h.Values("RateLimit"); len(rl) > 0 {
		if b, ok := parseRateLimit(strings.Join(rl, ", ")); ok {
			s.Policy, s.Remaining, s.Reset = b.name, b.r, b.t
			if s.Reset < 0 {
				s.Reset = policyWindow(strings.Join(h.Values("RateLimit-Policy"), ", "), b.name)
			}
			return s
		}
	}
	if r, ok := parseInt(strings.TrimSpace(h.Get("X-RateLimit-Remaining"))); ok {
		s.Remaining = r
		if v := strings.TrimSpace(h.Get("X-RateLimit-Reset")); v != "" {
			s.Reset = parseReset(v, ref)
		}
	}
	return s
}

// parseRetryAfter reads delay-seconds or an HTTP-date (IMF-fixdate, and the
// obsolete RFC 850 and asctime forms RFC 9110 §5.6.7 asks recipients to
// accept), relative to ref; -1 when it is neither.
func parseRetryAfter(v string, ref time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if d, ok := parseSeconds(v); ok {
		return d
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return -1
	}
	return max(t.Sub(ref), 0) // Sub saturates
}

// parseReset reads X-RateLimit-Reset: delay seconds, or a Unix time in
// seconds when at least epochResetFrom; -1 when malformed.
func parseReset(v string, ref time.Time) time.Duration {
	n, ok := parseInt(v)
	if !ok {
		return -1
	}
	if n >= epochResetFrom {
		return max(time.Unix(n, 0).Sub(ref), 0)
	}
	return time.Duration(n) * time.Second // n < 10^9: no overflow
}

// parseInt reads 1*DIGIT as a non-negative int64, saturating at MaxInt64.
func parseInt(s string) (int64, bool) {
	if s == "" {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		if n > (math.MaxInt64-int64(c-'0'))/10 {
			n = math.MaxInt64
		} else if n != math.MaxInt64 {
			n = n*10 + int64(c-'0')
		}
	}
	return n, true
}

// parseSeconds reads delay-seconds (1*DIGIT) as a duration, saturating at
// maxDuration.
func parseSeconds(s string) (time.Duration, bool) {
	n, ok := parseInt(s)
	if !ok {
		return 0, false
	}
	return seconds(n), true
}

// seconds is n ≥ 0 seconds, saturating at maxDuration.
func seconds(n int64) time.Duration {
	if n > int64(maxDuration/time.Second) {
		return maxDuration
	}
	return time.Duration(n) * time.Second
}

// limit is one RateLimit service limit item.
type limit struct {
	name string
	r    int64
	t    time.Duration // -1 when absent
}

// parseRateLimit returns the binding item of a RateLimit field value: the
// least r, ties broken by the longest t. ok is false when the value is
// malformed or lists nothing.
func parseRateLimit(v string) (bind limit, ok bool) {
	bind.r = -1
	valid := parseList(v, func(name string, isString bool, params []sfParam) bool {
		if !isString {
			return false // §4.1: the item is a String naming the policy
		}
		it := limit{name: name, r: -1, t: -1}
		for _, p := range params {
			switch p.key {
			case "r", "t":
				if p.kind != sfInteger || p.n < 0 {
					return false // §4.1.1, §4.1.2: non-negative Integers
				}
				if p.key == "r" {
					it.r = p.n
				} else {
					it.t = seconds(p.n)
				}
			}
		}
		if it.r < 0 {
			return false // r is required
		}
		if bind.r < 0 || it.r < bind.r || (it.r == bind.r && it.t > bind.t) {
			bind = it
		}
		return true
	})
	return bind, valid && bind.r >= 0
}

// policyWindow returns the w, in seconds, of the RateLimit-Policy item
// named name; -1 when there is none or the field is malformed.
func policyWindow(v, name string) time.Duration {
	w := time.Duration(-1)
	valid := parseList(v, func(n string, isString bool, params []sfParam) bool {
		if !isString {
			return false // §3: the item is a String
		}
		var q, win bool
		var d time.Duration
		for _, p := range params {
			switch p.key {
			case "q":
				if p.kind != sfInteger || p.n < 0 {
					return false // §3.1.1
				}
				q = true
			case "w":
				if p.kind != sfInteger || p.n <= 0 {
					return false // §3.1.3: a positive Integer
				}
				win, d = true, seconds(p.n)
			}
		}
		if !q {
			return false // q is required
		}
		if n == name && win {
			w = d
		}
		return true
	})
	if !valid {
		return -1
	}
	return w
}
