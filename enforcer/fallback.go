package enforcer

import (
	"errors"
	"math"
	"slices"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/sluice-rl/sluice/rules"
)

// fallback decides FailOpen rules while Redis is unavailable (a failed
// call, an open breaker, a shed check). A key whose last Redis answer it
// remembers (lastKnown) continues from it; any other key is decided by an
// in-process token bucket per rule and entity (keyed like its Redis state),
// at most Options.Fallback.Buckets of them, the least recently used evicted
// first (an evicted entity starts again with a full bucket). Every unit
// either grants is a debt, charged to Redis when it answers again
// (lastKnown.debts, charge.lua).
//
// A bucket is this enforcer's part of the rule in this region: capacity
// burst × Headroom ÷ instances, refilled at limit × Headroom ÷ instances per
// period (burst and limit already scaled by the region's share), where
// instances is the override (Options.Fallback.Instances) or the count learned
// through Redis (instanceCount). Sliding and fixed windows fall back to a
// token bucket of the same rate; pinned and G-Counter rules, whose limit is
// global, to 1/Regions of it; concurrency limits are not enforced locally;
// shadow rules are counted, and report the denial they would have made.
type fallback struct {
	buckets   *lru.Cache[string, *rate.Limiter]
	headroom  float64
	instances *instanceCount
	known     *lastKnown // nil: off (Options.Fallback.RememberedKeys < 0)
	// Fail-open rules decided from a remembered answer, and from a bucket.
	fromMemory, fromBucket prometheus.Counter
	// pinShare is 1/Regions: a pinned or G-Counter rule holds its whole
	// limit in Redis, and each region's bucket a static split of it.
	pinShare float64
}

func newFallback(o *Options, ic *instanceCount, known *lastKnown) (*fallback, error) {
	c, err := lru.New[string, *rate.Limiter](o.Fallback.Buckets)
	if err != nil {
		return nil, err
	}
	return &fallback{buckets: c, headroom: o.Fallback.Headroom, instances: ic, known: known, pinShare: 1}, nil
}

// bucket returns the local bucket for key, created or resized for the
// rule's current limit and burst over period, divided by n instances.
func (f *fallback) bucket(key string, limit, burst int64, period time.Duration, n float64, now time.Time) *rate.Limiter {
	every := rate.Limit(float64(limit) * f.headroom / n / period.Seconds())
	size := max(1, int(math.Floor(float64(burst)*f.headroom/n)))
	b, ok := f.buckets.Get(key)
	if !ok {
		b = rate.NewLimiter(every, size)
		f.buckets.Add(key, b)
		return b
	}
	if b.Limit() != every {
		b.SetLimitAt(now, every)
	}
	if b.Burst() != size {
		b.SetBurstAt(now, size)
	}
	return b
}

// decide applies the FailOpen rules' remembered state or local buckets to a
// degraded request: all enforced ones must allow their costs, or none is
// charged. It returns the index of the rule that denies (the longest wait;
// -1 if none) and the wait, or a negative wait when the cost exceeds a
// bucket; and the first shadow rule whose bucket would have denied (-1 if
// none), which consumes nothing. What an allowed request took is owed to
// Redis (pinned rules' excepted: their Redis is their home region's).
func (f *fallback) decide(c *call, matched []*rules.Rule, now time.Time) (deny int, wait time.Duration, shadow int) {
	var held [MaxRules]*rate.Reservation
	var took [MaxRules]bool // taken from the remembered state
	deny, shadow = -1, -1
	n := f.instances.get()
	nowMs := now.UnixMilli()
	for i, r := range matched {
		if r.FailureMode != rules.FailOpen || r.Algorithm == rules.Concurrency || c.rc[i].alias != 0 {
			continue
		}
		rc := &c.rc[i]
		limit, burst, share := rc.limit, rc.burst, 1/n
		if r.Pinned || r.GCounter {
			limit, burst = scale(limit, f.pinShare), scale(burst, f.pinShare)
			share *= f.pinShare
		}
		isShadow := rc.shadow
		if f.known != nil {
			known, ok, w := f.known.take(rc.key.b, knownOf(rc), rc.charge, share, f.headroom, nowMs, c.now, debtTTL(rc), owes(c, r, i))
			if known {
				f.fromMemory.Inc()
				switch {
				case ok:
					took[i] = true
				case isShadow: // would have denied; consumes nothing
					if shadow < 0 {
						shadow = i
					}
				case w < 0:
					if deny < 0 || blocksLonger(-1, wait) {
						deny, wait = i, -1
					}
				default:
					if d := time.Duration(w) * time.Millisecond; deny < 0 || blocksLonger(d, wait) {
						deny, wait = i, d
					}
				}
				continue
			}
		}
		f.fromBucket.Inc()
		b := f.bucket(string(rc.key.b), limit, burst, time.Duration(rc.period)*time.Millisecond, n, now)
		rv := b.ReserveN(now, int(min(rc.charge, math.MaxInt32)))
		if isShadow { // shadow: counted when it allows, never denies
			if w := rv.DelayFrom(now); !rv.OK() || w > 0 {
				rv.CancelAt(now)
				if shadow < 0 {
					shadow = i
				}
			} else {
				held[i] = rv
			}
			continue
		}
		switch w := rv.DelayFrom(now); {
		case !rv.OK():
			if deny < 0 || blocksLonger(-1, wait) {
				deny, wait = i, -1
			}
		case w > 0:
			rv.CancelAt(now)
			if deny < 0 || blocksLonger(w, wait) {
				deny, wait = i, w
			}
		default:
			held[i] = rv
		}
	}
	for i := range matched {
		switch {
		case deny >= 0 && held[i] != nil:
			held[i].CancelAt(now)
		case deny >= 0 && took[i]:
			rc := &c.rc[i]
			f.known.giveBack(rc.key.b, knownOf(rc), rc.charge)
		case held[i] != nil && f.known != nil && owes(c, matched[i], i):
			rc := &c.rc[i]
			f.known.owe(rc.key.b, knownOf(rc), rc.charge, nowMs, c.now, debtTTL(rc))
		}
	}
	return deny, wait, shadow
}

// owes reports whether what the fallback grants for matched rule i (r) is
// a debt to this region's Redis: when Redis did not count it. Not for a
// pinned rule (its Redis is its home region's), nor for one whose Redis
// call answered (another group failed: Redis counted it), nor for one whose
// call may have run without its answer reaching us (a broken connection; a
// timeout while this process stalled, which may have left an answer
// unread: ErrStalled). A timeout with no stall is owed (unanswered): the
// wait ran on time for twice the script's deadline, so the script ran past
// that deadline, committing nothing, or not at all (a frozen or blackholed
// Redis); only an answer Redis held back over a budget after running the
// script in time is counted twice. Not owing those let a 4 s freeze of
// Redis add half a fixed window's limit, never charged.
func owes(c *call, r *rules.Rule, i int) bool {
	if r.Pinned {
		return false
	}
	for gi := range c.groups {
		g := &c.groups[gi]
		if slices.Contains(c.order[g.from:g.to], i) {
			return g.err != nil && (!mayHaveRun(g.err) || unanswered(g.err))
		}
	}
	return true // no call was made for it (a shed check)
}

// unanswered reports a timeout of a wait this process did not stall in
// (see owes).
func unanswered(err error) bool {
	return ClassifyRedisError(err) == CauseTimeout && !errors.Is(err, ErrStalled)
}

// knownOf is the rule's script values, as the remembered state keys them.
func knownOf(rc *ruleCall) knownRule {
	return knownRule{alg: rc.alg, limit: rc.limit, burst: rc.burst, period: rc.period}
}

// debtTTL is the TTL a charged debt gives a fixed window's key that Redis
// lost: the ms left in the window (rc.x) and the 60 s decide.lua adds.
func debtTTL(rc *ruleCall) int64 {
	if rc.alg == int64(rules.FixedWindow) {
		return rc.x + gcSlack.Milliseconds()
	}
	return 0
}
