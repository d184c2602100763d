package enforcer

import (
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/rules"
)

// localRules holds the state of local-scope rules (rules.ScopeLocal): one
// token bucket per rule and entity, in this process only, at most
// Options.LocalEntities of them, the least recently used forgotten first (a
// forgotten entity starts again with a full bucket). No Redis call is ever
// made for them.
//
// Buckets are keyed by a 64-bit hash (hash/maphash, a per-process seed) of
// the rule id and the entity tag (rules.AppendEntityTag), so that looking
// one up allocates nothing; two entities share a bucket only if their
// hashes collide, with a chance of about n²/2⁶⁵ for n entities (3 × 10⁻⁸ for
// a million).
type localRules struct {
	buckets *lru.Cache[uint64, *localBucket]
	seed    maphash.Seed
	evicted atomic.Uint64
	free    sync.Pool // of *localBucket, evicted ones for reuse
}

// localBucket is a token bucket refilled lazily from its last update: a
// GCRA-equivalent continuous bucket (the token bucket of RFC 2697 / ITU-T
// I.371's virtual scheduling, in float64 tokens).
type localBucket struct {
	mu     sync.Mutex
	tokens float64 // at last
	last   int64   // Unix ns of the last update; never moves backwards
}

func newLocalRules(size int) (*localRules, error) {
	lr := &localRules{seed: maphash.MakeSeed()}
	c, err := lru.NewWithEvict[uint64, *localBucket](size, func(_ uint64, b *localBucket) {
		lr.evicted.Add(1)
		lr.free.Put(b)
	})
	if err != nil {
		return nil, err
	}
	lr.buckets = c
	return lr, nil
}

// register adds the local rules' metrics to reg.
func (lr *localRules) register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_enforcer_local_entities",
			Help: "Entities (rule and key) whose local-scope rule state this enforcer holds in memory, at most Options.LocalEntities.",
		}, func() float64 { return float64(lr.buckets.Len()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_enforcer_local_evictions_total",
			Help: "Local-scope rule states forgotten to stay within Options.LocalEntities (least recently used first); a forgotten entity starts again with a full bucket.",
		}, func() float64 { return float64(lr.evicted.Load()) }),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// bucket returns the bucket of key, a new full one at now if there is none.
func (lr *localRules) bucket(key uint64, burst int64, now int64) *localBucket {
	if b, ok := lr.buckets.Get(key); ok {
		return b
	}
	nb, _ := lr.free.Get().(*localBucket)
	if nb == nil {
		nb = new(localBucket)
	}
	nb.tokens, nb.last = float64(burst), now
	if prev, ok, _ := lr.buckets.PeekOrAdd(key, nb); ok {
		lr.free.Put(nb)
		return prev
	}
	return nb
}

// localEps absorbs float64 rounding in refills: a bucket that should hold
// exactly n tokens may hold n - 1e-12.
const localEps = 1e-9

// take refills b to now and takes cost tokens if it holds them (take false:
// only looks). It returns whether the bucket holds them, its whole tokens
// left, the wait until it would (-1: cost exceeds burst, waiting never
// helps), and the time until it is full again.
func (b *localBucket) take(now int64, limit, burst int64, period time.Duration, cost int64, take bool) (ok bool, remaining int64, wait, reset time.Duration) {
	perNs := float64(limit) / float64(period)
	b.mu.Lock()
	if now > b.last {
		b.tokens = min(float64(burst), b.tokens+float64(now-b.last)*perNs)
		b.last = now
	}
	b.tokens = min(b.tokens, float64(burst)) // the rule's burst may have shrunk
	switch {
	case cost > burst:
		wait = -1
	case b.tokens+localEps >= float64(cost):
		ok = true
		if take {
			b.tokens = max(0, b.tokens-float64(cost))
		}
	default:
		wait = time.Duration(math.Ceil((float64(cost) - b.tokens) / perNs))
	}
	t := b.tokens
	b.mu.Unlock()
	remaining = int64(math.Floor(t + localEps))
	if d := float64(burst) - t; d > localEps {
		reset = (time.Duration(math.Ceil(d/perNs)) + time.Millisecond - 1).Truncate(time.Millisecond)
	}
	if wait > 0 {
		wait = (wait + time.Millisecond - 1).Truncate(time.Millisecond)
	}
	return ok, remaining, wait, reset
}

// giveBack returns cost tokens taken by take, up to burst.
func (b *localBucket) giveBack(cost, burst int64) {
	b.mu.Lock()
	b.tokens = min(float64(burst), b.tokens+float64(cost))
	b.mu.Unlock()
}

// localCall is a decision's scratch memory for its local-scope rules,
// embedded in call.
type localCall struct {
	nloc     int
	loc      [MaxRules]*rules.Rule
	locPart  [MaxRules]uint8
	locCost  [MaxRules]int64
	locTaken [MaxRules]*localBucket // the bucket a cost was taken from, to give back; nil if none
	locBurst [MaxRules]int64        // the burst applied (an adaptive rule's scaled one)
	locSt    [MaxRules]Status
	locDeny  int       // 1 + the index of the local rule that denied; 0 if none
	locAt    time.Time // the time the local rules were decided at
	locKey   []byte
}

// decide sets the local-scope rules of matched aside and decides them
// in memory: each takes its cost from its bucket, unless an enforced one
// cannot, in which case nothing is taken, the request is denied (PathLocal)
// and no rule is left to decide. Otherwise it returns the rules left for
// Redis; localCall.settle then gives the local costs back if those deny. A shadow
// rule (its own mode or Options.Shadow) that cannot take its cost takes
// nothing and reports that it would have denied.
func (lr *localRules) decide(c *call, matched []*rules.Rule, clock func() time.Time, d *Decision, ad *adaptive, shadowAll bool) []*rules.Rule {
	c.nloc, c.locDeny = 0, 0
	any := false
	for _, r := range matched {
		if r.Scope == rules.ScopeLocal {
			any = true
			break
		}
	}
	if !any {
		return matched
	}
	for i, r := range matched {
		c.rc[i].drop = r.Scope == rules.ScopeLocal
		if c.rc[i].drop {
			n := c.nloc
			c.loc[n], c.locPart[n], c.locCost[n], c.locTaken[n] = r, c.rc[i].part, c.rc[i].cost, nil
			c.nloc++
		}
	}
	matched = c.compact(matched)
	now := clock()
	c.locAt = now
	ns := now.UnixNano()
	var wait time.Duration
	for i, r := range c.loc[:c.nloc] {
		k := append(append(c.locKey[:0], r.ID...), 0)
		k, c.hashIn = rules.AppendEntityTagScratch(k, c.hashIn, r, &c.descs[c.locPart[i]])
		c.locKey = k
		b := lr.bucket(maphash.Bytes(lr.seed, k), r.Burst, ns) // a new bucket is full; take clamps it to a scaled burst
		shadow := r.Mode == rules.Shadow || shadowAll
		cost := c.locCost[i]
		limit, burst := r.Limit, r.Burst
		if r.AdaptiveFloor > 0 {
			f := ad.forRule(r)
			limit, burst = scale(limit, f), scale(burst, f)
			d.Factor = min(d.Factor, f)
		}
		c.locBurst[i] = burst
		ok, rem, w, reset := b.take(ns, limit, burst, r.Period, cost, true)
		window := time.Duration((burst*r.Period.Milliseconds()+limit-1)/limit) * time.Millisecond
		c.locSt[i] = Status{Rule: r, Limit: burst, Remaining: rem, Reset: reset, Window: window, Part: int(c.locPart[i]), Shadow: shadow, Denied: !ok}
		if ok {
			if cost > 0 {
				c.locTaken[i] = b
			}
			continue
		}
		if !shadow && (c.locDeny == 0 || blocksLonger(w, wait)) {
			c.locDeny, wait = i+1, w
		}
	}
	if c.locDeny == 0 {
		return matched
	}
	c.giveBack()
	i := c.locDeny - 1
	st := &c.locSt[i]
	d.Now = now
	d.Outcome, d.Rule, d.Path = decision.Denied, c.loc[i], decision.PathLocal
	d.Limit, d.Remaining, d.Reset = st.Limit, st.Remaining, st.Reset
	if wait < 0 {
		d.Reason = decision.ReasonCostExceedsCapacity
	} else {
		d.Reason, d.Wait, d.RetryAfter = decision.ReasonOverLimit, wait, retryAfter(wait)
	}
	return matched[:0]
}

// giveBack returns every local cost taken by localRules.decide.
func (c *localCall) giveBack() {
	for i, b := range c.locTaken[:c.nloc] {
		if b != nil {
			b.giveBack(c.locCost[i], c.locBurst[i])
			c.locTaken[i] = nil
			c.locSt[i].Remaining = min(c.locSt[i].Remaining+c.locCost[i], c.locBurst[i])
		}
	}
}

// settle completes d with the local-scope rules decided by
// localRules.decide, after the other rules were: their statuses follow the
// others'; their costs are given back when the decision denies (every rule
// must allow for any to be charged); a shadow local rule that would have
// denied an allowed request makes it shadow-denied; and a request that
// matched only local rules took PathLocal.
func (c *localCall) settle(d *Decision) {
	if c.nloc == 0 {
		return
	}
	if d.Outcome == decision.Denied || d.Outcome == decision.DegradedClosed {
		c.giveBack() // nothing taken when a local rule denied; else the others denied
	}
	base := len(d.Statuses)
	d.Statuses = append(d.Statuses, c.locSt[:c.nloc]...)
	if c.locDeny > 0 {
		d.bind = base + c.locDeny
		return
	}
	if d.Path == decision.PathNone {
		d.Path = decision.PathLocal
	}
	if d.Now.IsZero() {
		d.Now = c.locAt
	}
	for i := range c.locSt[:c.nloc] {
		st := &c.locSt[i]
		if !st.Shadow || !st.Denied {
			continue
		}
		if d.Shadow == nil {
			d.Shadow = st.Rule
		}
		if d.Outcome == decision.Allowed {
			d.Outcome, d.Rule = decision.ShadowDenied, st.Rule
		}
	}
	if d.Outcome == decision.Allowed || d.Outcome == decision.ShadowDenied {
		d.bindLeast()
	}
}
