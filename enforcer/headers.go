package enforcer

import (
	"net/http"
	"strconv"
	"time"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/rules"
)

// HeaderSet selects the rate-limit response headers a decision emits.
type HeaderSet uint8

const (
	// HeadersDraft: RateLimit-Policy and RateLimit, as in the IETF draft
	// "RateLimit header fields for HTTP" (draft-ietf-httpapi-ratelimit-headers-10):
	//
	//	RateLimit-Policy: "per-ip";q=60;w=60, "per-key";q=40;w=2
	//	RateLimit: "per-ip";r=0;t=58
	//
	// The policy lists every enforced rate rule that matched, by rule id, with
	// q its capacity in this region and w its window in seconds (a token
	// bucket's w is the time to refill from empty), and a concurrency limit
	// when it is the binding rule (q only: it has no window). RateLimit names the
	// binding rule: the one that denied, else the one with the least
	// remaining; r is its remaining and t the seconds until it is full again
	// or its window resets (none for a limit of 0, which never resets, nor
	// for a cost beyond the capacity, which no wait admits).
	HeadersDraft HeaderSet = 1 << iota
	// HeadersLegacy: X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset (seconds until reset, not a timestamp) of the
	// binding rule, as envoyproxy/ratelimit and most APIs send them; no
	// X-RateLimit-Reset for a limit of 0 (Sluice-Reason: blocked instead) nor
	// for a cost beyond the capacity (Sluice-Reason: cost_exceeds_capacity).
	HeadersLegacy
	// HeaderRetryAfter: Retry-After in whole seconds on a deny that waiting
	// can satisfy (RFC 9110, section 10.2.3); never on a cost that exceeds
	// the capacity.
	HeaderRetryAfter

	// AllHeaders is the default: all of the above.
	AllHeaders = HeadersDraft | HeadersLegacy | HeaderRetryAfter
)

// Header is one response header.
type Header struct{ Name, Value string }

// ceilSeconds is d in whole seconds, rounded up.
func ceilSeconds(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }

// AppendHeaders appends the headers of set for d to dst and returns it. All
// values are whole seconds computed from the decision's own timestamp. A
// degraded decision has no counts to report: it gets only Retry-After: 1
// when it fails closed.
func (d *Decision) AppendHeaders(dst []Header, set HeaderSet) []Header {
	if set&HeaderRetryAfter != 0 && d.RetryAfter > 0 {
		dst = append(dst, Header{"Retry-After", FormatRetryAfter(d.RetryAfter)})
	}
	switch d.Reason {
	case decision.ReasonNoShare:
		dst = append(dst, Header{"Sluice-Reason", "no_share"})
	case decision.ReasonShed:
		dst = append(dst, Header{"Sluice-Reason", "shed"})
	case decision.ReasonBlocked:
		dst = append(dst, Header{"Sluice-Reason", "blocked"})
	case decision.ReasonCostExceedsCapacity:
		dst = append(dst, Header{"Sluice-Reason", "cost_exceeds_capacity"})
	}
	if d.bind == 0 || d.Remaining < 0 {
		return dst
	}
	bind := &d.Statuses[d.bind-1]
	if bind.Shadow {
		return dst // shadow rules are invisible to clients
	}
	reset := ceilSeconds(bind.Reset)
	// A limit of 0 never admits a request, nor does a rule admit a cost
	// beyond its capacity: no reset is announced, since waiting never helps
	// (Sluice-Reason: blocked, or cost_exceeds_capacity, says why).
	never := bind.Rule.Blocks() || (d.Reason == decision.ReasonCostExceedsCapacity && d.Rule == bind.Rule)
	if set&HeadersDraft != 0 {
		var b []byte
		for i := range d.Statuses {
			st := &d.Statuses[i]
			if st.Shadow || (st.Rule.Algorithm == rules.Concurrency && i != d.bind-1) {
				continue // the policy lists rate rules, and the binding rule, which RateLimit names
			}
			if len(b) > 0 {
				b = append(b, ", "...)
			}
			b = append(b, '"')
			b = append(b, st.Rule.ID...) // ids are [A-Za-z0-9_.-]: a valid sf-string
			b = append(b, `";q=`...)
			b = strconv.AppendInt(b, st.Limit, 10)
			if st.Window > 0 {
				b = append(b, ";w="...)
				b = strconv.AppendInt(b, ceilSeconds(st.Window), 10)
			}
		}
		if len(b) > 0 {
			dst = append(dst, Header{"RateLimit-Policy", string(b)})
		}
		b = append(b[:0], '"')
		b = append(b, bind.Rule.ID...)
		b = append(b, `";r=`...)
		b = strconv.AppendInt(b, bind.Remaining, 10)
		if !never {
			b = append(b, ";t="...)
			b = strconv.AppendInt(b, reset, 10)
		}
		dst = append(dst, Header{"RateLimit", string(b)})
	}
	if set&HeadersLegacy != 0 {
		dst = append(dst,
			Header{"X-RateLimit-Limit", strconv.FormatInt(bind.Limit, 10)},
			Header{"X-RateLimit-Remaining", strconv.FormatInt(bind.Remaining, 10)})
		if !never {
			dst = append(dst, Header{"X-RateLimit-Reset", strconv.FormatInt(reset, 10)})
		}
	}
	return dst
}

// WriteHeaders sets the headers of set for d on h.
func (d *Decision) WriteHeaders(h http.Header, set HeaderSet) {
	var buf [8]Header
	for _, x := range d.AppendHeaders(buf[:0], set) {
		h.Set(x.Name, x.Value)
	}
}

// FormatRetryAfter writes a Retry-After value in whole seconds.
func FormatRetryAfter(d time.Duration) string { return strconv.FormatInt(ceilSeconds(d), 10) }
