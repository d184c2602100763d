package enforcer

import (
	"time"

	"github.com/sluice-rl/sluice/rules"
)

// Outcome is what the limiter decided for one request.
type Outcome uint8

const (
	// Allowed: every matching enforced rule had tokens.
	Allowed Outcome = iota + 1
	// Denied: an enforced rule had too few tokens; nothing was consumed.
	Denied
	// ShadowDenied: allowed, but a shadow-mode rule would have denied.
	ShadowDenied
	// DegradedOpen: storage failed and every matching rule fails open.
	DegradedOpen
	// DegradedClosed: storage failed and a matching rule fails closed.
	DegradedClosed
)

var outcomeNames = [...]string{"", "allowed", "denied", "shadow_denied", "degraded_open", "degraded_closed"}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) && o > 0 {
		return outcomeNames[o]
	}
	return "unknown"
}

// Allow reports whether the request may proceed.
func (o Outcome) Allow() bool { return o == Allowed || o == ShadowDenied || o == DegradedOpen }

// Reason is why a request was denied.
type Reason uint8

const (
	ReasonNone Reason = iota
	// ReasonOverLimit: the rule's bucket holds fewer tokens than the cost.
	ReasonOverLimit
	// ReasonCostExceedsCapacity: the cost is larger than the rule's burst, so
	// waiting can never satisfy it; there is no Retry-After.
	ReasonCostExceedsCapacity
	// ReasonLimiterUnavailable: storage failed and the rule fails closed.
	ReasonLimiterUnavailable
)

var reasonNames = [...]string{"", "over_limit", "cost exceeds capacity", "limiter_unavailable"}

func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return "unknown"
}

// Decision is the limiter's answer for one request.
type Decision struct {
	Outcome Outcome
	Reason  Reason
	// Rule is the enforced rule that denied, or on ShadowDenied the shadow
	// rule that would have; nil otherwise.
	Rule *rules.Rule
	// Limit is the burst of the rule that Remaining describes (after any
	// share scaling); 0 when no rule matched.
	Limit int64
	// Remaining is the whole tokens left: in the denying rule on a deny, else
	// the least over the matched enforced rules. -1 when unknown (degraded).
	Remaining int64
	// Wait is the exact time until the denying rule holds enough tokens.
	// RetryAfter is Wait rounded up to whole seconds, at least 1 s on a deny
	// that waiting can satisfy; both are 0 otherwise.
	Wait, RetryAfter time.Duration
	// Now is the time the decision was taken at (Redis TIME or the caller's).
	Now time.Time
	// Matched are the IDs of every rule that matched, static then dynamic.
	Matched []string
	// Shared is true when a global rule was scaled by a share from the
	// aggregator rather than the static split.
	Shared bool
	// Err is the storage error behind a degraded outcome.
	Err error
}

// Record is what the limiter hands its Sink for every decision: the decision
// record's fields in memory. Package pipeline encodes it.
type Record struct {
	Time        time.Time
	Region      string
	Instance    string
	RequestID   string
	Domain      string
	Descriptors rules.Descriptors
	UserAgent   string
	Matched     []string
	Outcome     Outcome
	DenyingRule string
	Cost        uint32
	Remaining   int64
	Latency     time.Duration
	Status      uint32
}

// Sink receives every decision record. Log must not block: a sink that cannot
// keep up drops and counts (see pipeline.Producer).
type Sink interface {
	Log(rec Record)
}
