package backoff

import (
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/dunglas/httpsfv"
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
	// Blocked: the same-named RateLimit-Policy item has a quota (q) of 0,
	// which admits nothing however long one waits (sluice's limit of 0):
	// its Reset is then unknown, not its w.
	Blocked bool
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
// List (RFC 9651 §4.2, parsed by github.com/dunglas/httpsfv) of Strings with
// a non-negative Integer r (and t, if present) is ignored whole. The
// RateLimit fields of a response from a cache (a positive Age) are stale and
// ignored (draft §7.3); Retry-After is still read.
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
		if b, ok := parseRateLimit(rl); ok {
			s.Policy, s.Remaining, s.Reset = b.name, b.r, b.t
			w, q := policyItem(h.Values("RateLimit-Policy"), b.name)
			s.Blocked = q == 0
			if s.Reset < 0 && !s.Blocked {
				s.Reset = w
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
	if s == "" || s[0] < '0' || s[0] > '9' { // strconv would take a sign
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	switch {
	case err == nil:
		return n, true
	case errors.Is(err, strconv.ErrRange): // all digits, too many of them
		return math.MaxInt64, true
	}
	return 0, false
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

// parseRateLimit returns the binding item of the RateLimit field lines: the
// least r, ties broken by the longest t. ok is false when the field is
// malformed or lists nothing.
func parseRateLimit(lines []string) (bind limit, ok bool) {
	l, err := httpsfv.UnmarshalList(lines) // joins the lines with ", "
	if err != nil {
		return limit{}, false
	}
	bind.r = -1
	for _, m := range l {
		name, params, isString := stringItem(m)
		if !isString {
			return limit{}, false // §4.1: the item is a String naming the policy
		}
		r, hasR, okR := intParam(params, "r", 0) // §4.1.1, §4.1.2:
		t, hasT, okT := intParam(params, "t", 0) // non-negative Integers
		if !okR || !okT || !hasR {
			return limit{}, false // r is required
		}
		it := limit{name: name, r: r, t: -1}
		if hasT {
			it.t = seconds(t)
		}
		if bind.r < 0 || it.r < bind.r || (it.r == bind.r && it.t > bind.t) {
			bind = it
		}
	}
	return bind, bind.r >= 0
}

// policyItem returns the w, in seconds, and the q of the RateLimit-Policy
// item named name; -1 for each when there is none or the field is
// malformed, and for w when the item has none.
func policyItem(lines []string, name string) (w time.Duration, q int64) {
	l, err := httpsfv.UnmarshalList(lines)
	if err != nil {
		return -1, -1
	}
	w, q = -1, -1
	for _, m := range l {
		n, params, isString := stringItem(m)
		if !isString {
			return -1, -1 // §3: the item is a String
		}
		nq, hasQ, okQ := intParam(params, "q", 0) // §3.1.1
		d, hasW, okW := intParam(params, "w", 1)  // §3.1.3: a positive Integer
		if !okQ || !okW || !hasQ {
			return -1, -1 // q is required
		}
		if n == name {
			q = nq
			if hasW {
				w = seconds(d)
			}
		}
	}
	return w, q
}

// stringItem returns the value and parameters of a List member that is an
// Item whose bare item is a String (not a Token, nor an Inner List).
func stringItem(m httpsfv.Member) (s string, params *httpsfv.Params, ok bool) {
	it, ok := m.(httpsfv.Item)
	if !ok {
		return "", nil, false
	}
	s, ok = it.Value.(string)
	return s, it.Params, ok
}

// intParam returns the parameter key of params: has is whether it is there,
// ok whether it is absent or an Integer ≥ least. A repeated key has its last
// value (RFC 9651 §4.2.3.2).
func intParam(params *httpsfv.Params, key string, least int64) (n int64, has, ok bool) {
	if params == nil {
		return 0, false, true
	}
	v, has := params.Get(key)
	if !has {
		return 0, false, true
	}
	n, isInt := v.(int64)
	return n, true, isInt && n >= least
}
