package sidecar

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/rules"
)

// KeyFor maps the key of an Envoy descriptor entry to sluice's descriptor
// key; it is rules.KeyFor: sluice's own names, the aliases Envoy
// configurations commonly send, and any other key as a custom key.
//
//	remote_address, masked_remote_address  client_ip (Envoy's remote_address and masked_remote_address actions)
//	user_id                                user
//	tenant_id                              tenant
//	x-api-key, api-key                     api_key (request_headers actions named after the header)
//	:path                                  path
//	:method                                method
//	generic_key, header_match, ...         custom keys, by name
//
// Keys are matched exactly (Envoy's descriptor keys are case-sensitive). ok
// is false for a key that cannot be one (empty, or with spaces).
func KeyFor(entryKey string) (k rules.Key, ok bool) { return rules.KeyFor(entryKey) }

// Unit lengths, as envoyproxy/ratelimit divides time: a month is 30 days
// and a year 365.
const (
	day   = 24 * time.Hour
	week  = 7 * day
	month = 30 * day
	year  = 365 * day
)

// overridePeriod is the window of an Envoy limit override's unit; 0 for an
// unknown unit. WEEK (7) is not in envoy.type.v3.RateLimitUnit yet, but it is
// in the response's unit enum, so a client may send it.
func overridePeriod(u typev3.RateLimitUnit) time.Duration {
	switch u {
	case typev3.RateLimitUnit_SECOND:
		return time.Second
	case typev3.RateLimitUnit_MINUTE:
		return time.Minute
	case typev3.RateLimitUnit_HOUR:
		return time.Hour
	case typev3.RateLimitUnit_DAY:
		return day
	case 7:
		return week
	case typev3.RateLimitUnit_MONTH:
		return month
	case typev3.RateLimitUnit_YEAR:
		return year
	}
	return 0
}

// badRequest wraps enforcer.ErrBadRequest with a message for the caller.
func badRequest(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{enforcer.ErrBadRequest}, a...)...)
}

// toRequest maps an Envoy RateLimitRequest into sc.req: one enforcer.Part
// per descriptor, all decided together. setDomain is the rule set's domain:
// a limit override applies only to it, as envoyproxy/ratelimit ignores
// every descriptor of an unknown domain. It returns the number of
// descriptors with a key sluice cannot map (and no override), which match
// no rule. It allocates only for a limit override's entity.
func toRequest(in *rlsv3.RateLimitRequest, setDomain string, sc *scratch) (unmatched int, err error) {
	domain := in.GetDomain()
	if domain == "" {
		return 0, badRequest("rate limit domain must not be empty")
	}
	descs := in.GetDescriptors()
	if len(descs) == 0 {
		return 0, badRequest("rate limit descriptor list must not be empty")
	}
	if len(descs) > enforcer.MaxParts {
		return 0, badRequest("%d descriptors, more than %d", len(descs), enforcer.MaxParts)
	}
	if in.GetHitsAddend() > rules.MaxCost {
		return 0, badRequest("hits_addend %d is more than %d", in.GetHitsAddend(), rules.MaxCost)
	}
	sc.req = enforcer.Request{Domain: domain, Cost: in.GetHitsAddend(), Parts: sc.parts[:len(descs)]}
	for i, d := range descs {
		p := &sc.req.Parts[i]
		*p = enforcer.Part{}
		if h := d.GetHitsAddend(); h != nil {
			switch v := h.GetValue(); {
			case v > rules.MaxCost:
				return 0, badRequest("descriptor %d: hits_addend %d is more than %d", i+1, v, rules.MaxCost)
			case v == 0:
				p.CheckOnly = true
			default:
				p.Cost = uint32(v)
			}
		}
		if d.GetIsNegativeHits() {
			return 0, badRequest("descriptor %d: is_negative_hits (a refund) is not supported", i+1)
		}
		mapped := true
		for _, e := range d.GetEntries() {
			name := e.GetKey()
			if isUserAgent(name) {
				// Not a descriptor: the decision record carries it for
				// the detector (a request_headers action on user-agent).
				sc.req.UserAgent = e.GetValue()
				continue
			}
			if isRequestID(name) {
				// Not a descriptor either: the decision record's request
				// id, which joins it to Envoy's access log (StatusJoin).
				sc.req.RequestID = e.GetValue()
				continue
			}
			if !mapped {
				continue // the user agent and request id may still follow
			}
			k, ok := rules.KeyFor(name)
			if !ok {
				mapped = false
				continue
			}
			if v := p.Descriptors.Get(k, name); v != "" && v != e.GetValue() {
				if k != rules.KeyCustom {
					// Two API keys, users or client addresses for one
					// request: a gateway that checks one and forwards
					// the other would let a caller spend or read another's
					// tokens. The values are not echoed: they may be secrets.
					return 0, badRequest("descriptor %d: entry %s gives %s a second, different value: a request has one %s", i+1, name, k, k)
				}
				mapped = false // a custom key with two values: no rule can say which
				continue
			}
			if k == rules.KeyCustom {
				if !p.Descriptors.SetCustom(name, e.GetValue()) {
					mapped = false // more custom keys than a descriptor holds
				}
				continue
			}
			p.Descriptors[k] = e.GetValue()
		}
		if !mapped || len(d.GetEntries()) == 0 {
			p.Descriptors = rules.Descriptors{}
		}
		if o := d.GetLimit(); o != nil && domain == setDomain {
			period := overridePeriod(o.GetUnit())
			if period == 0 {
				return 0, badRequest("descriptor %d: limit override with unit %v: want SECOND, MINUTE, HOUR, DAY, MONTH or YEAR (or 7, a week, which envoy.type.v3.RateLimitUnit does not name yet)", i+1, o.GetUnit())
			}
			if m := o.GetUnitMultiplier(); m != nil {
				if m.GetValue() == 0 || period > math.MaxInt64/time.Duration(m.GetValue()) {
					return 0, badRequest("descriptor %d: limit override unit_multiplier %d", i+1, m.GetValue())
				}
				period *= time.Duration(m.GetValue())
			}
			sc.overrides[i] = enforcer.Override{
				Limit: int64(o.GetRequestsPerUnit()), Period: period, Entity: overrideEntity(sc, domain, d),
			}
			p.Override = &sc.overrides[i]
			continue
		}
		if !mapped {
			unmatched++
		}
	}
	return unmatched, nil
}

// overrideEntity names what an override counts: the domain and the
// descriptor's entries, each length-prefixed, so that no two descriptors
// share a counter ("a"="b.c" and "a.b"="c" differ). The user agent and
// request id entries, which toRequest takes out of the descriptor, are not
// part of it: a fresh request id per call must not make a fresh counter.
func overrideEntity(sc *scratch, domain string, d *ratelimitv3.RateLimitDescriptor) string {
	b := binary.AppendUvarint(sc.entity[:0], uint64(len(domain)))
	b = append(b, domain...)
	for _, e := range d.GetEntries() {
		if isUserAgent(e.GetKey()) || isRequestID(e.GetKey()) {
			continue
		}
		b = binary.AppendUvarint(b, uint64(len(e.GetKey())))
		b = append(b, e.GetKey()...)
		b = binary.AppendUvarint(b, uint64(len(e.GetValue())))
		b = append(b, e.GetValue()...)
	}
	sc.entity = b
	return string(b)
}

// fill writes the decision for a request of n descriptors into r: the
// overall code, one status per descriptor and the engine's headers.
func (s *Server) fill(r *reply, d *enforcer.Decision, n int) {
	r.reset(n)
	r.OverallCode = rlsv3.RateLimitResponse_OK
	if !d.Outcome.Allow() {
		r.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	for pi := range n {
		st := &r.statuses[pi]
		st.Code = rlsv3.RateLimitResponse_OK
		if d.Reason == decision.ReasonShed { // refused before any rule: every descriptor
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		b := d.PartBinding(pi)
		if b == nil {
			continue
		}
		if b.Denied || (d.Reason == decision.ReasonLimiterUnavailable && b.Rule == d.Rule) {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if b.Remaining < 0 {
			continue // degraded: no counts to report
		}
		lim := &r.limits[pi]
		lim.Name = b.Rule.ID
		lim.RequestsPerUnit, lim.Unit = currentLimit(b)
		st.CurrentLimit = lim
		st.LimitRemaining = uint32(min(b.Remaining, math.MaxUint32))
		if b.Rule.Blocks() || (d.Reason == decision.ReasonCostExceedsCapacity && b.Rule == d.Rule) {
			continue // a limit of 0, or a cost beyond the capacity: no wait admits it, so no duration
		}
		reset := &r.resets[pi]
		reset.Seconds, reset.Nanos = int64(b.Reset/time.Second), int32(b.Reset%time.Second)
		st.DurationUntilReset = reset
	}
	r.hdrs = d.AppendHeaders(r.hdrs[:0], s.opts.Headers)
	if d.Outcome == decision.DegradedClosed {
		r.hdrs = append(r.hdrs, enforcer.Header{Name: "Sluice-Reason", Value: d.Reason.String()})
	}
	if len(r.hdrs) > 0 {
		r.headerValues(len(r.hdrs))
		for i, h := range r.hdrs {
			r.headers[i].Key, r.headers[i].Value = h.Name, h.Value
		}
	}
}

// units are the response's time units, longest first, with their lengths.
var units = [...]struct {
	unit rlsv3.RateLimitResponse_RateLimit_Unit
	len  time.Duration
}{
	{rlsv3.RateLimitResponse_RateLimit_YEAR, year},
	{rlsv3.RateLimitResponse_RateLimit_MONTH, month},
	{rlsv3.RateLimitResponse_RateLimit_WEEK, week},
	{rlsv3.RateLimitResponse_RateLimit_DAY, day},
	{rlsv3.RateLimitResponse_RateLimit_HOUR, time.Hour},
	{rlsv3.RateLimitResponse_RateLimit_MINUTE, time.Minute},
	{rlsv3.RateLimitResponse_RateLimit_SECOND, time.Second},
}

// currentLimit expresses a rule's rate in this region as requests per
// Envoy unit. A period that is one unit is exact; any other period is
// expressed in the largest unit not longer than it (the second for
// sub-second periods) with the rate scaled and rounded down, or, if that
// rounds to 0, in the first longer unit where it does not (10 per 13 s is
// 46 per minute). Calendar windows are their day, week or month. A
// concurrency limit has no unit (UNKNOWN) and its slots as the count.
//
// The response's unit_multiplier could say "10 per 13 SECOND" exactly, but
// released Envoys ignore it and would read 10 per second.
func currentLimit(st *enforcer.Status) (uint32, rlsv3.RateLimitResponse_RateLimit_Unit) {
	r := st.Rule
	clamp := func(x int64) uint32 { return uint32(min(max(x, 1), math.MaxUint32)) }
	if r.Blocks() || st.Limit == 0 { // 0 per the rule's window (or a share of 0): no request passes
		u := rlsv3.RateLimitResponse_RateLimit_UNKNOWN
		for _, x := range units {
			if x.len == r.Period {
				u = x.unit
			}
		}
		return 0, u
	}
	switch {
	case r.Algorithm == rules.Concurrency:
		return clamp(st.Limit), rlsv3.RateLimitResponse_RateLimit_UNKNOWN
	case r.Calendar == rules.Day:
		return clamp(st.Limit), rlsv3.RateLimitResponse_RateLimit_DAY
	case r.Calendar == rules.Week:
		return clamp(st.Limit), rlsv3.RateLimitResponse_RateLimit_WEEK
	case r.Calendar == rules.Month:
		return clamp(st.Limit), rlsv3.RateLimitResponse_RateLimit_MONTH
	}
	// The rate: a token bucket's capacity is its burst, its rate the limit
	// per period; either is scaled by the region's share, which Status.Limit
	// carries.
	rate := float64(st.Limit)
	if r.Algorithm == rules.TokenBucket && r.Burst > 0 {
		rate = float64(r.Limit) * float64(st.Limit) / float64(r.Burst)
	}
	period := r.Period
	if period <= 0 {
		return clamp(int64(rate)), rlsv3.RateLimitResponse_RateLimit_UNKNOWN
	}
	first := len(units) - 1 // the second
	for i, u := range units {
		if u.len == period {
			return clamp(int64(rate)), u.unit
		}
		if u.len < period {
			first = i
			break
		}
	}
	for i := first; i >= 0; i-- {
		if n := math.Floor(rate * float64(units[i].len) / float64(period)); n >= 1 || i == 0 {
			return clamp(int64(n)), units[i].unit
		}
	}
	return 1, rlsv3.RateLimitResponse_RateLimit_SECOND // not reached
}

// isUserAgent reports whether a descriptor entry's key names the user agent
// (user_agent, user-agent, any case), which the sidecar puts in the decision
// record instead of a descriptor.
func isUserAgent(key string) bool {
	return strings.EqualFold(key, "user_agent") || strings.EqualFold(key, "user-agent")
}

// isRequestID reports whether a descriptor entry's key names the request
// id (request_id, x-request-id, any case), which the sidecar puts in the
// decision record.
func isRequestID(key string) bool {
	return strings.EqualFold(key, "request_id") || strings.EqualFold(key, "x-request-id")
}
