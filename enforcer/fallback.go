package enforcer

import (
	"math"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/time/rate"

	"github.com/sluice-rl/sluice/rules"
)

// fallback holds the in-process token buckets that decide FailOpen rules
// while Redis is unavailable: one per rule and entity (keyed like its Redis
// state), at most Options.LocalBuckets of them, the least recently used
// evicted first (an evicted entity starts again with a full bucket).
//
// A bucket is this enforcer's part of the rule in this region: capacity
// burst × Headroom ÷ Instances, refilled at limit × Headroom ÷ Instances per
// period (burst and limit already scaled by the region's share). Sliding and
// fixed windows fall back to a token bucket of the same rate; pinned and
// G-Counter rules, whose limit is global, to 1/Regions of it; concurrency
// limits are not enforced locally; shadow rules are counted, and report
// the denial they would have made.
type fallback struct {
	buckets   *lru.Cache[string, *rate.Limiter]
	headroom  float64
	instances float64
	// pinShare is 1/Regions: a pinned or G-Counter rule holds its whole
	// limit in Redis, and each region's bucket a static split of it.
	pinShare float64
}

func newFallback(o *Options) (*fallback, error) {
	c, err := lru.New[string, *rate.Limiter](o.LocalBuckets)
	if err != nil {
		return nil, err
	}
	return &fallback{buckets: c, headroom: o.Headroom, instances: float64(o.Instances), pinShare: 1}, nil
}

// bucket returns the local bucket for key, created or resized for the
// rule's current limit and burst over period.
func (f *fallback) bucket(key string, limit, burst int64, period time.Duration, now time.Time) *rate.Limiter {
	every := rate.Limit(float64(limit) * f.headroom / f.instances / period.Seconds())
	size := max(1, int(math.Floor(float64(burst)*f.headroom/f.instances)))
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

// decide applies the FailOpen rules' local buckets to a degraded request:
// all enforced ones must allow their costs, or none is charged. It returns
// the index of the rule that denies (the longest wait; -1 if none) and the
// wait, or a negative wait when the cost exceeds a bucket; and the first
// shadow rule whose bucket would have denied (-1 if none), which consumes
// nothing.
func (f *fallback) decide(c *call, matched []*rules.Rule, now time.Time) (deny int, wait time.Duration, shadow int) {
	var held [MaxRules]*rate.Reservation
	deny, shadow = -1, -1
	for i, r := range matched {
		if r.FailureMode != rules.FailOpen || r.Algorithm == rules.Concurrency || c.rc[i].alias != 0 {
			continue
		}
		rc := &c.rc[i]
		limit, burst := rc.limit, rc.burst
		if r.Pinned || r.GCounter {
			limit, burst = scale(limit, f.pinShare), scale(burst, f.pinShare)
		}
		b := f.bucket(string(rc.key.b), limit, burst, time.Duration(rc.period)*time.Millisecond, now)
		rv := b.ReserveN(now, int(min(rc.charge, math.MaxInt32)))
		if rc.shadow { // shadow: counted when it allows, never denies
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
	if deny >= 0 {
		for _, rv := range held {
			if rv != nil {
				rv.CancelAt(now)
			}
		}
	}
	return deny, wait, shadow
}
