package decision

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
	// DegradedClosed: storage failed and a matching rule fails closed, or a
	// fail-open rule's local fallback bucket is empty.
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
	// ReasonLocalOverLimit: storage failed, and the rule's local fallback
	// bucket (its failure mode "open") holds fewer tokens than the cost.
	ReasonLocalOverLimit
	// ReasonBlocked: a blocking rule (limit 0) matched; waiting never
	// helps, so there is no Retry-After.
	ReasonBlocked
	// ReasonNoShare: a global rule's fresh share for this region is 0 (the
	// aggregator gave the whole limit to other regions), so this region
	// admits nothing for the key until a new share arrives. The record's
	// path is PathNoShare.
	ReasonNoShare
	// ReasonShed: priority load shedding refused the request (the backend's
	// load passed its priority's threshold) before any rule was checked;
	// nothing was charged. Answered 503 with Retry-After, not 429. The
	// record's path is PathShed.
	ReasonShed
)

var reasonNames = [...]string{"", "over_limit", "cost exceeds capacity", "limiter_unavailable", "local_over_limit", "blocked", "no_share", "shed"}

func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return "unknown"
}

// Path is where a decision was taken.
type Path uint8

const (
	// PathNone: no rule matched.
	PathNone Path = iota
	// PathRedis: the decision script ran in Redis.
	PathRedis
	// PathDenyCache: a rule's key was known to be empty until a time still
	// ahead, so the request was denied (or, for a shadow rule, would have
	// been) without a Redis call.
	PathDenyCache
	// PathLease: every matched rule had tokens leased from Redis in a block
	// (a hot key), so the request was served without a Redis call.
	PathLease
	// PathFallback: Redis failed and the failure modes decided (local
	// fallback buckets, fail-closed rules).
	PathFallback
	// PathBlocked: a blocking rule (limit 0) denied, or in shadow mode
	// would have, without a Redis call.
	PathBlocked
	// PathNoShare: a global rule whose fresh share is 0 in this region
	// denied, or in shadow mode would have, without a Redis call
	// (ReasonNoShare).
	PathNoShare
	// PathLocal: only local-scope rules matched (rules.ScopeLocal), or one
	// of them denied: decided in the enforcer's memory, without a Redis call.
	PathLocal
	// PathShed: priority load shedding refused the request before any rule
	// was checked (ReasonShed).
	PathShed
)

var pathNames = [...]string{"none", "redis", "deny_cache", "lease", "fallback", "blocked", "no_share", "local", "shed"}

func (p Path) String() string {
	if int(p) < len(pathNames) {
		return pathNames[p]
	}
	return "unknown"
}

// Record is what the limiter hands its Sink for every decision: the decision
// record's fields in memory. ToProto encodes it.
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
	// ShadowRule is the shadow-mode rule that would have denied ("would
	// deny"), on any path; empty if none.
	ShadowRule string
	Path       Path
	Cost       uint32
	Remaining  int64
	Latency    time.Duration
	Status     uint32
	// AdaptiveFactor is the factor the request's adaptive rules were scaled
	// by (see enforcer's adaptive rules), in (0, 1]; 1 (or 0 in a record
	// from an older producer) when none was scaled.
	AdaptiveFactor float64
}

// Sink receives every decision record. Log must not block: a sink that cannot
// keep up drops and counts (see pipeline.Producer).
type Sink interface {
	Log(rec Record)
}

// NumOutcomes and NumPaths size arrays indexed by an Outcome or a Path (the
// zero values included).
const (
	NumOutcomes = int(DegradedClosed) + 1
	NumPaths    = int(PathShed) + 1
)
