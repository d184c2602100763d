package enforcer

import (
	"time"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/rules"
)

// Decision is the limiter's answer for one request.
type Decision struct {
	Outcome decision.Outcome
	Reason  decision.Reason
	// Rule is the enforced rule that denied (of several, the one that blocks
	// longest: a cost beyond its capacity, else the longest wait), or on
	// ShadowDenied the shadow rule that would have; nil otherwise.
	Rule *rules.Rule
	// Limit, Remaining and Reset describe the binding rule: the one that
	// denied, else the enforced rate rule with the least remaining. Limit is
	// its capacity after any share scaling (0 when no rule matched);
	// Remaining its whole units left (-1 when unknown: degraded, or no rule
	// matched); Reset the time until it is back to full capacity or its
	// window resets.
	Limit, Remaining int64
	Reset            time.Duration
	// Wait is the exact time until the denying rule can take the request's
	// cost. RetryAfter is Wait rounded up to whole seconds, at least 1 s on a
	// deny that waiting can satisfy; both are 0 otherwise (and always 0 for
	// ReasonCostExceedsCapacity).
	Wait, RetryAfter time.Duration
	// Now is the time the decision was taken at (Redis TIME or the caller's).
	Now time.Time
	// Statuses has one entry per matched rule, static then dynamic, in
	// match order.
	Statuses []Status
	// Leases are the concurrency slots this request holds; give them back
	// with Limiter.Release when the request ends.
	Leases []Lease
	// Shared is true when a global rule was scaled by a share from the
	// aggregator rather than the static split.
	Shared bool
	// Err is the storage error behind a degraded outcome.
	Err error
	// Path is where the decision was taken: Redis, the deny cache, a
	// lease, or the fallback after a storage failure.
	Path decision.Path
	// Shadow is the shadow-mode rule that would have denied the request, on
	// whatever Path; nil if none. (On ShadowDenied it is also Rule.)
	Shadow *rules.Rule
	// Priority is the request's priority when load shedding refused it
	// (ReasonShed); else unset.
	Priority rules.Priority
	// Factor is the adaptive factor applied to the matched adaptive rules
	// (the least, if they differ by their floors), in (0, 1]; 1 when none
	// matched or none was scaled.
	Factor float64

	bind int // 1 + index in Statuses of the binding rule; 0 if none
	// later is the record of a decision taken with Request.LogLater, until
	// Limiter.LogStatus logs it.
	later    decision.Record
	logLater bool
}

// Status is one matched rule's state after a decision.
type Status struct {
	Rule *rules.Rule
	// Limit is the rule's capacity in this region (burst for a token
	// bucket, else the limit), after any share scaling.
	Limit int64
	// Remaining is the whole units left after the decision; -1 if unknown.
	Remaining int64
	// Reset is the time until the rule is back to full capacity (token
	// bucket, sliding window), its window ends (fixed window), or a slot
	// frees (concurrency; 0 while one is free).
	Reset time.Duration
	// Window is the policy's time window, for the RateLimit-Policy header:
	// the time to refill from empty (token bucket), the window (sliding,
	// fixed; a calendar window's actual length), 0 for concurrency.
	Window time.Duration
	// Denied is true when this rule denied, or, in shadow mode, would have;
	// several rules can deny one request (Decision.Rule is the one that
	// blocks longest).
	Denied bool
	// Part is the index in Request.Parts of the part that matched the rule
	// (0 for a request without Parts).
	Part int
	// Shadow is true when the rule was evaluated in shadow mode (its own
	// mode, or the limiter's Options.Shadow): it never denies.
	Shadow bool
}

// Part is one descriptor set of a multi-part Request (one Envoy descriptor).
type Part struct {
	Descriptors rules.Descriptors
	// Cost (hits_addend) of this part: 0 means the request's Cost, else the
	// route's default, else 1.
	Cost uint32
	// CheckOnly decides the part without consuming (Envoy's per-descriptor
	// hits_addend of 0): the rules are checked and reported, nothing is
	// taken. A concurrency rule still takes its slot.
	CheckOnly bool
	// Override, when set, replaces the rules this part would match with one
	// fixed-window limit, as Envoy's per-descriptor limit override does.
	Override *Override
}

// Override is a limit given with the request rather than by a rule
// (Envoy's RateLimitDescriptor.limit): Limit requests per Period, counted in
// epoch-aligned fixed windows, as envoyproxy/ratelimit counts them, for the
// entity named by Entity.
type Override struct {
	Limit  int64
	Period time.Duration
	// Entity names what is counted, e.g. the domain and the descriptor's
	// entries; only its SHA-256 reaches a Redis key.
	Entity string
}

// Lease is a concurrency slot held by a request.
type Lease struct {
	Key, ID string
	// TTL is the rule's lease: the slot frees itself at most this long
	// after it was taken.
	TTL time.Duration
}

// reset clears d for a new decision, keeping its slices' memory.
func (d *Decision) reset(now time.Time) {
	*d = Decision{Outcome: decision.Allowed, Remaining: -1, Now: now, Statuses: d.Statuses[:0], Leases: d.Leases[:0], Factor: 1}
}

// PartBinding returns the status that speaks for part pi of a multi-part
// request (an Envoy descriptor): the enforced rule of the part that denied
// (the decision's denying rule when it is one of the part's), or on a
// fail-closed outage the part's rule that failed closed; else the part's
// enforced rate rule with the least remaining; else its enforced
// concurrency rule. nil when the part matched no enforced rule: shadow-mode
// rules (Status.Shadow) are invisible to clients, as in the headers.
func (d *Decision) PartBinding(pi int) *Status {
	var denied, rate, conc *Status
	for i := range d.Statuses {
		st := &d.Statuses[i]
		if st.Part != pi || st.Shadow {
			continue
		}
		failed := d.Reason == decision.ReasonLimiterUnavailable && st.Rule == d.Rule
		if (st.Denied || failed) && (denied == nil || st.Rule == d.Rule) {
			denied = st
		}
		switch {
		case st.Rule.Algorithm == rules.Concurrency:
			if conc == nil {
				conc = st
			}
		case rate == nil || st.Remaining < rate.Remaining:
			rate = st
		}
	}
	switch {
	case denied != nil:
		return denied
	case rate != nil:
		return rate
	}
	return conc
}

// Matched returns the IDs of the matched rules (allocates; for tests and logs).
func (d *Decision) Matched() []string {
	ids := make([]string, len(d.Statuses))
	for i := range d.Statuses {
		ids[i] = d.Statuses[i].Rule.ID
	}
	return ids
}
