package enforcer

import (
	"math"
	"math/bits"
	"strconv"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

// hotTable is the enforcer's per-key local state: each key's request rate on
// this instance (to find hot keys), its lease (tokens taken from Redis in a
// block and served locally), and its deny-cache entry (the key is known to
// be empty until a time). It is a direct-mapped table of fixed size: bounded
// memory and no allocation per request. A key whose slot is taken by a busier
// key is simply not tracked (its requests go to Redis); a slot is given to a
// new key only when its holder is idle (no lease tokens, no deny entry, not
// hot this second).
type hotTable struct {
	slots    []hotEntry
	mask     uint64
	locks    [256]sync.Mutex
	rate     int64 // requests per second per key that make it hot; 0: local detection off
	maxBlock int64
	ttl      int64 // ms a lease's tokens stay usable
}

type hotEntry struct {
	hash uint64
	rule *rules.Rule
	cap  int64 // the rule's capacity when the entry was made (share scaling)
	// rate detection: requests in the second sec (ms / 1000)
	sec, n, prevN int64
	// lease
	tokens   int64 // leased tokens not yet served
	leaseExp int64 // ms
	rem      int64 // Redis's remaining at the last block, beside our tokens
	reset    int64 // ms after fetched until Redis's bucket is full, at the last block
	fetched  int64 // ms
	fetching bool  // a block is being fetched: others do not ask for one
	// deny cache
	denyUntil int64 // ms
	denyReset int64 // ms: when the rule is back to full capacity, as Redis said
	denyCost  int64
	denyRem   int64 // the remaining Redis said at denyAt (ms)
	denyAt    int64
}

func newHotTable(o *Options) *hotTable {
	n := 1
	for n < o.HotKeys.Table {
		n <<= 1
	}
	return &hotTable{slots: make([]hotEntry, n), mask: uint64(n - 1), rate: max(0, o.HotKeys.Rate),
		maxBlock: int64(o.HotKeys.LeaseBlock), ttl: o.HotKeys.LeaseTTL.Milliseconds()}
}

// hotProbe is what one rule's key showed before the Redis call.
type hotProbe struct {
	hash   uint64
	denied int64 // > 0: the deny cache says wait this many ms
	reset  int64 // with denied: ms until the rule is full again
	// with denied: the remaining Redis said, and ms since it said it
	rem, since int64
	lease      bool  // the lease holds at least the cost
	block      int64 // > 0: ask Redis for this many extra tokens (this call fetches)
	// giveBack > 0: leased tokens this call returns to Redis first
	giveBack int64
	// stale: the key has a deny-cache entry for another cost, which a
	// request that consumes makes too short
	stale bool
}

func (h *hotTable) lock(hash uint64) *sync.Mutex { return &h.locks[hash&255] }

// entry returns the slot for hash, claiming it when idle; nil when a busy
// entry of another key holds it. Called with the lock held.
func (h *hotTable) entry(hash uint64, r *rules.Rule, capacity, now int64, claim bool) *hotEntry {
	e := &h.slots[hash&h.mask]
	if e.hash == hash && e.rule == r && e.cap == capacity {
		return e
	}
	if !claim {
		return nil
	}
	if e.hash != 0 && e.hash != hash && (e.tokens > 0 && now < e.leaseExp || e.denyUntil > now || e.fetching || e.sec == now/1000 && e.n >= h.rate && h.rate > 0) {
		return nil // busy with another key
	}
	*e = hotEntry{hash: hash, rule: r, cap: capacity}
	return e
}

// probe counts one request for a rule's key and reports its local state.
// flagged says the pipeline marked the key hot: it leases at once.
func (h *hotTable) probe(key []byte, r *rules.Rule, capacity, cost, now int64, flagged bool) hotProbe {
	p := hotProbe{hash: xxhash.Sum64(key) | 1} // never 0: 0 marks a free slot
	mu := h.lock(p.hash)
	mu.Lock()
	defer mu.Unlock()
	e := h.entry(p.hash, r, capacity, now, true)
	if e == nil {
		return p
	}
	if s := now / 1000; s != e.sec {
		if s == e.sec+1 {
			e.prevN = e.n
		} else {
			e.prevN = 0
		}
		e.sec, e.n = s, 0
	}
	e.n++
	if now < e.leaseExp && e.tokens >= cost {
		p.lease = true
		return p
	}
	if e.denyUntil > now {
		if cost == e.denyCost {
			p.denied, p.reset = e.denyUntil-now, max(e.denyReset, e.denyUntil)-now
			p.rem, p.since = e.denyRem, now-e.denyAt
			return p
		}
		p.stale = true
	}
	if now < e.leaseExp && e.tokens > 0 {
		// Too few leased tokens for this cost: they go back to Redis with
		// this request's call, which then decides exactly as if they had
		// never been leased.
		p.giveBack, e.tokens = e.tokens, 0
		return p
	}
	hot := flagged || h.rate > 0 && max(e.n, e.prevN) >= h.rate
	// A pinned rule is a hard cap: its tokens are never served ahead of its
	// home region's count.
	if hot && r.Algorithm == rules.TokenBucket && !r.Pinned && !e.fetching && h.maxBlock > 0 {
		// Adaptive block: about 50 ms of this key's traffic here, at most
		// maxBlock and a quarter of the capacity.
		b := max(e.n, e.prevN) / 20
		b = min(max(b, 2), h.maxBlock, max(1, capacity/4))
		e.fetching = true
		p.block = b
	}
	return p
}

// take serves cost from the lease of hash, if it still holds that many.
func (h *hotTable) take(hash uint64, r *rules.Rule, capacity, cost, now int64) (ok bool, rem, reset int64) {
	mu := h.lock(hash)
	mu.Lock()
	defer mu.Unlock()
	e := h.entry(hash, r, capacity, now, false)
	if e == nil || e.tokens < cost || now >= e.leaseExp {
		return false, 0, 0
	}
	e.tokens -= cost
	return true, e.rem + e.tokens, max(0, e.reset-(now-e.fetched))
}

// give returns cost to the lease of hash (a request served from leases
// that another rule's lease could not serve after all).
func (h *hotTable) give(hash uint64, r *rules.Rule, capacity, cost, now int64) {
	mu := h.lock(hash)
	mu.Lock()
	if e := h.entry(hash, r, capacity, now, false); e != nil {
		e.tokens += cost
	}
	mu.Unlock()
}

// fetched ends a block fetch: extra tokens (possibly 0) join the lease, and
// Redis's remaining and reset are kept for the lease's answers.
//
// A block that came back short (the key is at its limit: Redis had fewer
// than block tokens beyond the request's cost) also puts the key in the
// deny cache, for cost, once the lease is spent, until Redis has refilled a
// whole block (limit tokens per period ms): so a hot key at its limit is
// still served in blocks, one Redis call per block, at the same average
// rate, rather than one call per token as it trickles in.
func (h *hotTable) fetched(hash uint64, r *rules.Rule, capacity, block, extra, rem, reset, limit, period, cost, now int64) {
	mu := h.lock(hash)
	mu.Lock()
	if e := h.entry(hash, r, capacity, now, false); e != nil {
		e.fetching = false
		if now >= e.leaseExp {
			e.tokens = 0 // tokens past their time are dropped: they were Redis's
		}
		e.tokens += extra
		e.leaseExp, e.rem, e.reset, e.fetched = now+h.ttl, rem, reset, now
		if extra < block && cost > 0 {
			e.denyUntil, e.denyCost = now+((block-rem)*period+limit-1)/limit, cost
			e.denyReset, e.denyRem, e.denyAt = now+reset, rem, now
		}
	}
	mu.Unlock()
}

// deny records that hash cannot take cost for wait ms; Redis said rem
// remained.
func (h *hotTable) deny(hash uint64, r *rules.Rule, capacity, cost, wait, reset, rem, now int64) {
	mu := h.lock(hash)
	mu.Lock()
	if e := h.entry(hash, r, capacity, now, true); e != nil {
		e.denyUntil, e.denyCost, e.denyReset = now+wait, cost, now+reset
		e.denyRem, e.denyAt = rem, now
		e.fetching = false
	}
	mu.Unlock()
}

// unfetch clears a fetch that did not complete (Redis failed or denied).
func (h *hotTable) unfetch(hash uint64, r *rules.Rule, capacity, now int64) {
	mu := h.lock(hash)
	mu.Lock()
	if e := h.entry(hash, r, capacity, now, false); e != nil {
		e.fetching = false
	}
	mu.Unlock()
}

// decideLocally decides the request from the hot table when it can, without
// a Redis call: a rule whose key is known to be empty for this cost denies
// it (the deny cache; a shadow rule's entry only marks "would deny"), and a
// request whose every rule holds enough leased tokens is served from them.
// It reports whether it decided. Otherwise each token-bucket rule whose key
// is hot and has no block has the block size in its script argument x, so
// that the Redis call fetches one.
func (h *hotTable) decideLocally(c *call, matched []*rules.Rule, d *Decision, m *metrics) bool {
	now := c.localMs
	deny, shadow := -1, -1
	var wait int64
	all := true
	for i, r := range matched {
		p := &c.rc[i].probe
		*p = hotProbe{}
		if c.rc[i].alias != 0 {
			continue // decided by the rule it shares a key with
		}
		if r.Algorithm == rules.Concurrency {
			all = false
			continue
		}
		rc := &c.rc[i]
		*p = h.probe(rc.key.b, r, rc.burst, rc.charge, now, rc.flagged)
		switch {
		case p.denied > 0 && !rc.shadow:
			if deny < 0 || p.denied > wait {
				deny, wait = i, p.denied
			}
		case p.denied > 0:
			if shadow < 0 {
				shadow = i
			}
		case !p.lease:
			all = false
		}
		if p.block > 0 {
			rc.x = p.block
		} else if p.giveBack > 0 {
			rc.x = -p.giveBack
		}
	}
	if deny < 0 && !all {
		return false
	}
	if d.Now.IsZero() {
		d.Now = time.UnixMilli(now)
	}
	if deny >= 0 {
		// No Redis call: a fetch that probes started is off, and leased
		// tokens that were to go back with it return to their leases.
		for i := range matched {
			p, capacity := &c.rc[i].probe, c.rc[i].burst
			if p.block > 0 {
				h.unfetch(p.hash, matched[i], capacity, now)
			} else if p.giveBack > 0 {
				h.give(p.hash, matched[i], capacity, p.giveBack, now)
			}
		}
		st := &d.Statuses[deny]
		st.Denied, st.Remaining, st.Reset = true, deniedRemaining(matched[deny], &c.rc[deny]), msDuration(c.rc[deny].probe.reset)
		d.Outcome, d.Reason, d.Rule, d.Path, d.bind = decision.Denied, decision.ReasonOverLimit, matched[deny], decision.PathDenyCache, deny+1
		d.Limit, d.Remaining, d.Reset = st.Limit, st.Remaining, st.Reset
		d.Wait = msDuration(wait)
		d.RetryAfter = retryAfter(d.Wait)
		m.denyHits.Add(1)
	} else {
		// Every rule has leased tokens (or a shadow rule's known denial):
		// take them, all or none.
		for i, r := range matched {
			p := &c.rc[i].probe
			if !p.lease {
				continue
			}
			ok, rem, reset := h.take(p.hash, r, c.rc[i].burst, c.rc[i].charge, now)
			if !ok { // another request took them meanwhile
				for j := 0; j < i; j++ {
					if c.rc[j].probe.lease {
						h.give(c.rc[j].probe.hash, matched[j], c.rc[j].burst, c.rc[j].charge, now)
					}
				}
				return false
			}
			st := &d.Statuses[i]
			st.Remaining, st.Reset = rem, msDuration(reset)
		}
		d.Path = decision.PathDenyCache // only shadow rules' known denials
		for i := range matched {
			if c.rc[i].probe.lease {
				d.Path = decision.PathLease
				m.leaseHits.Add(1)
				break
			}
		}
	}
	if shadow >= 0 {
		d.Statuses[shadow].Denied, d.Shadow = true, matched[shadow]
		if deny < 0 {
			d.Outcome, d.Rule = decision.ShadowDenied, matched[shadow]
		}
	}
	if c.aliases {
		c.copyAliases(d)
	}
	if deny < 0 {
		d.bindLeast()
	}
	return true
}

// deniedRemaining is the remaining a deny from the cache reports: what Redis
// said when it denied (a cost beyond what remains leaves a remaining above
// 0), plus, for a token bucket, the whole tokens refilled since, below the
// cost (the key is still denied it). rc is the rule's ruleCall (its script
// values: limit and period as called). A token bucket's fraction of a token is
// not known here, so the figure may be one below Redis's, never above.
func deniedRemaining(r *rules.Rule, rc *ruleCall) int64 {
	p := &rc.probe
	rem := p.rem
	if limit, period, capacity, cost := rc.limit, rc.period, rc.burst, rc.charge; r.Algorithm == rules.TokenBucket && period > 0 && p.since > 0 {
		rem = min(satAdd(rem, refilled(p.since, limit, period)), cost-1, capacity)
	}
	return max(0, rem)
}

// refilled is floor(ms × limit / period) for non-negative arguments, exact
// in 128 bits, math.MaxInt64 when it does not fit.
func refilled(ms, limit, period int64) int64 {
	hi, lo := bits.Mul64(uint64(ms), uint64(limit))
	if hi >= uint64(period) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(period))
	return int64(min(q, math.MaxInt64))
}

// satAdd is a + b for non-negative a and b, math.MaxInt64 past it.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// learn updates the hot table from a Redis decision: fetched lease blocks
// join their leases, and the rule that denied (or, in shadow mode, would
// have) is known to be empty for this cost until its wait has passed.
func (h *hotTable) learn(c *call, matched []*rules.Rule, d *Decision) {
	now := c.localMs
	for gi := range c.groups {
		g := &c.groups[gi]
		for _, i := range c.order[g.from:g.to] {
			p := &c.rc[i].probe
			capacity := c.rc[i].burst
			if p.stale && g.err == nil && c.rc[i].res.took {
				h.deny(p.hash, matched[i], capacity, 0, 0, 0, 0, now) // consumed: the cached wait no longer holds
			}
			if p.block == 0 {
				continue
			}
			if g.err == nil && c.rc[i].res.took {
				rc := &c.rc[i]
				h.fetched(p.hash, matched[i], capacity, p.block, rc.res.window, rc.res.rem, rc.res.reset, rc.limit, rc.period, rc.charge, now)
			} else {
				h.unfetch(p.hash, matched[i], capacity, now)
			}
		}
		if g.err == nil && g.out.shadow > 0 && g.out.swait > 0 {
			h.remember(c, matched, d, g.out.shadow-1, g.out.swait, now)
		}
	}
	if d.Outcome == decision.Denied && d.Reason == decision.ReasonOverLimit && d.bind > 0 && d.Wait > 0 {
		h.remember(c, matched, d, d.bind-1, d.Wait.Milliseconds(), now)
	}
}

// remember puts rule i's key in the deny cache for wait ms.
func (h *hotTable) remember(c *call, matched []*rules.Rule, d *Decision, i int, wait, now int64) {
	p := &c.rc[i].probe
	if p.hash == 0 || matched[i].Algorithm == rules.Concurrency {
		return // not probed (an alias), or a slot that a Release can free early
	}
	st := &d.Statuses[i]
	h.deny(p.hash, matched[i], c.rc[i].burst, c.rc[i].charge, wait, st.Reset.Milliseconds(), max(0, st.Remaining), now)
}

// hotKey returns the pipeline's hot-key entry for rule r and entity tag, if
// one is in force at now.
func (l *Limiter) hotKey(c *call, r *rules.Rule, tag []byte, ctl *store.Control, now time.Time) (rules.HotKey, bool) {
	k := append(append(append(c.shareKey[:0], r.ID...), '|'), tag...)
	c.shareKey = k
	hk, ok := ctl.Hot[string(k)]
	if !ok {
		return hk, false
	}
	if now.IsZero() {
		now = l.opts.Clock()
	}
	return hk, now.Before(hk.ExpiresAt)
}

// instanceIndex is the number an instance name gives a split key's
// sub-key: the name's value when it is a number ("0", "1", ... as in a
// StatefulSet), else a hash of it.
func instanceIndex(name string) int {
	if n, err := strconv.Atoi(name); err == nil && n >= 0 {
		return n
	}
	return int(xxhash.Sum64String(name) >> 1 & (1<<31 - 1))
}
