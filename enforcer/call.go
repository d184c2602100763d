package enforcer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

// argsPerRule is how many ARGV values decide.lua and refund.lua take per rule.
const argsPerRule = 7

// zero and one are shadow mode's script arguments, boxed once.
var zero, one int64 = 0, 1

// byteArg passes bytes to go-redis without boxing a string: a pointer in an
// interface costs no allocation, and go-redis writes a BinaryMarshaler's
// bytes as they are.
type byteArg struct{ b []byte }

func (a *byteArg) MarshalBinary() ([]byte, error) { return a.b, nil }

// String gives go-redis's Cluster routing the key's text.
func (a *byteArg) String() string { return string(a.b) }

// call is the scratch memory of one decision, pooled: keys, arguments and
// results live here so that a decision allocates nothing of its own.
type call struct {
	one      [1]Part // a request without Parts, as one part
	descs    [MaxParts]rules.Descriptors
	rules    [MaxRules]*rules.Rule // the matched rules (rules.Set.Match appends here)
	rc       [MaxRules]ruleCall    // one per matched rule, beside it
	blk      [MaxRules]Status      // shadow blocking rules set aside (see blocks)
	nblk     int
	aliases  bool   // some rule shares its key with an earlier one (ruleCall.alias)
	localMs  int64  // the time for the hot table: the request's, else the enforcer's
	buf      []byte // key text
	lbuf     []byte // lease-id text
	shareKey []byte
	tagBuf   []byte        // an entity tag for noShares
	hashIn   []byte        // the text an entity tag hashes (rules.AppendEntityTagScratch)
	remote   bool          // some rule's home is another region
	gc       bool          // some rule is a G-Counter
	order    [MaxRules]int // rule indexes, grouped by slot
	groups   []group
	now      int64 // ARGV[1]: the request's time in ms, 0 = Redis TIME
	// The deadline decide.lua gets (µs since the epoch): this region's
	// calls', and the home regions' (HomeBudget). Past it a script commits
	// nothing.
	deadline, homeDeadline int64
	until                  time.Time // the wait for this region's answers ends here
	waitFrom               time.Time // and began here (zero outside guarded)
	sentAt                 int64     // Unix ns when guarded began (for lastKnown.record)
	shed                   bool      // no place at the gate: decided without Redis
	retry                  []group   // late groups sent again (retryLate)
	// For the batchers, and for groups sent on their own: one per group at
	// most, sized before the script calls (sized: other regions' groups use
	// theirs from goroutines of their own, which must not grow them).
	tickets    []ticket
	scs        []scriptCall
	args       []any
	queueTimer *time.Timer   // a wait for a place (Limiter.admit)
	wake       chan struct{} // a place handed to the waiting c
	admitted   time.Time
	localCall  // the local-scope rules' (see localRules.decide)
}

// ruleCall is one matched rule of a decision: what the decision knows about
// it, from matching to the script's answer.
type ruleCall struct {
	part    uint8  // the request part that matched it
	alias   uint8  // 1 + the earlier rule with the same key, else 0
	drop    bool   // to be removed (see compact)
	flagged bool   // the pipeline marked its key hot
	home    int8   // the index of its home region (Limiter.remote), -1 = this region
	slot    uint16 // its key's Redis Cluster slot (on a Cluster)
	cost    int64  // its part's cost
	ent     string // an override's entity, else ""
	// The script's values: the algorithm (algGCounter for a G-Counter),
	// limit, period (ms), burst, the cost charged (its own, plus its
	// aliases'), shadow mode, and x (see decide.lua: a fixed window's ms
	// left, a token bucket's lease block or tokens given back, a sliding
	// window's charged window in a refund). A concurrency rule's x is its
	// lease id.
	alg, limit, period, burst, charge, x int64
	shadow                               bool
	tid                                  int32 // its constants' index in the script call (scriptCall.tuples)
	wend                                 int64 // a G-Counter's window end, ms
	key                                  byteArg
	leaseID                              byteArg
	probe                                hotProbe // its key's local state before the call
	res                                  ruleResult
}

// group is the rules of one Redis slot: order[from:to], decided by one
// script call (with other decisions' groups, in a batch; see batcher). A
// refund's arguments are args[argFrom:argTo].
type group struct {
	c              *call
	index          int // in c.groups
	from, to       int
	n              int64  // number of keys = number of rules
	slot           uint16 // the rules' Cluster slot (on a Cluster)
	remote         *home  // the region whose Redis decides it; nil = this region's
	deadline       *int64 // the script's deadline: c.deadline, or c.homeDeadline for another region's
	argFrom, argTo int
	out            groupResult
	err            error
}

type groupResult struct {
	allowed      bool
	deny, shadow int // rule index + 1 within the whole request; 0 if none
	wait, swait  int64
	now          int64
	anyTook      bool
}

type ruleResult struct {
	rem, reset int64
	took       bool
	denied     bool  // this rule denied, or in shadow mode would have
	window     int64 // sliding window: the window start charged
}

// decideRules decides the matched rules and fills d: each rule's key and
// script values (prepare), the rules that share a key (findAliases), the hot
// keys' local answers, then the script calls and their results.
func (l *Limiter) decideRules(ctx context.Context, c *call, req *Request, matched []*rules.Rule, ctl *store.Control, d *Decision) {
	n := len(matched)
	c.buf, c.lbuf = c.buf[:0], c.lbuf[:0]
	var offs [MaxRules + 1]int
	var leaseOffs [MaxRules][2]int
	var fwNow time.Time
	c.now = 0 // Redis TIME
	c.remote, c.gc = false, false
	if !req.Now.IsZero() {
		c.now = req.Now.UnixMilli()
		fwNow = req.Now
	}
	for i, r := range matched {
		offs[i] = len(c.buf)
		leaseOffs[i] = l.prepare(c, i, r, req, ctl, d, &fwNow)
	}
	offs[n] = len(c.buf)
	c.findAliases(matched, offs[:n+1], leaseOffs[:n])
	if c.shed { // no place at the gate (Options.MaxInFlight): the failure modes decide
		c.groups = c.groups[:0]
		l.degraded(ctx, c, matched, d, ErrOverloaded)
		return
	}
	if l.hot != nil {
		c.localMs = c.now
		if c.localMs == 0 {
			c.localMs = l.opts.Clock().UnixMilli()
		}
		if l.hot.decideLocally(c, matched, d, &l.metrics) {
			return
		}
	}
	l.group(c, n)
	l.guarded(ctx, c)
	d.Path = decision.PathRedis
	l.finish(ctx, c, matched, d)
	if c.gc {
		l.gc.mark(c, matched, &l.gcDropped)
	}
	if l.hot != nil {
		l.hot.learn(c, matched, d)
	}
}

// prepare appends rule i's key to c.buf (and a concurrency rule's lease id
// to c.lbuf, returning its offsets there) and sets its script values: the
// limit and burst scaled by the region's share, the adaptive factor and a
// split hot key, its home region, its slot, a fixed window's window, and
// its status in d. fwNow is the time fixed windows are chosen at, set on
// first use.
func (l *Limiter) prepare(c *call, i int, r *rules.Rule, req *Request, ctl *store.Control, d *Decision, fwNow *time.Time) (lease [2]int) {
	rc := &c.rc[i]
	c.buf = append(c.buf, store.BucketKeyPrefix...)
	tagAt := len(c.buf)
	if rc.ent != "" {
		c.buf = appendOverrideTag(c.buf, rc.ent)
	} else {
		c.buf, c.hashIn = rules.AppendEntityTagScratch(c.buf, c.hashIn, r, &c.descs[rc.part])
	}
	tag := c.buf[tagAt:]
	c.buf = append(c.buf, "}:"...)
	if rc.ent != "" {
		c.buf = append(c.buf, overrideKeyName...) // not r.ID, which names the limit
	} else {
		c.buf = append(c.buf, r.ID...)
	}
	c.buf = append(c.buf, ':', '0'+byte(r.Algorithm))
	limit, burst := r.Limit, r.Burst
	rc.home = -1
	switch {
	case r.Pinned: // the whole limit, in the entity's home region
		rc.home = l.homes.of(r, tag)
		c.remote = c.remote || rc.home >= 0
	case r.GCounter: // the whole limit, against the merged count
	case r.Global:
		f, fresh := l.share(c, r, tag, ctl, req.Now)
		limit, burst = scale(limit, f), scale(burst, f)
		d.Shared = d.Shared || fresh
	}
	if r.AdaptiveFloor > 0 {
		f := l.adaptive.forRule(r)
		limit, burst = scale(limit, f), scale(burst, f)
		d.Factor = min(d.Factor, f)
	}
	rc.flagged = false
	if len(ctl.Hot) > 0 && !r.Pinned && !r.GCounter { // a split would divide a global count
		if hk, ok := l.hotKey(c, r, tag, ctl, req.Now); ok {
			rc.flagged = hk.Lease
			if hk.Split > 1 && r.Algorithm != rules.Concurrency {
				// A split key: this instance's sub-key, with 1/Split of
				// the limit; the sub-key is the instance's, so one
				// instance's traffic stays on one sub-key.
				c.buf = append(c.buf, ":s"...)
				c.buf = strconv.AppendInt(c.buf, int64(l.instanceIdx%hk.Split), 10)
				limit, burst = scale(limit, 1/float64(hk.Split)), scale(burst, 1/float64(hk.Split))
			}
		}
	}
	if l.cluster || rc.home >= 0 && l.homes.remote[rc.home].cluster != nil {
		rc.slot = Slot(string(c.buf[tagAt : tagAt+rules.EntityTagLen]))
	}
	period := r.Period.Milliseconds()
	var left, window int64 // window: the policy's, in ms, for RateLimit-Policy
	switch r.Algorithm {
	case rules.TokenBucket:
		window = (burst*period + limit - 1) / limit
	case rules.FixedWindow:
		if fwNow.IsZero() {
			*fwNow = l.opts.Clock()
		}
		start, end := r.Window(*fwNow)
		c.buf = append(c.buf, ':')
		c.buf = strconv.AppendInt(c.buf, start.UnixMilli(), 10)
		left = max(1, end.UnixMilli()-fwNow.UnixMilli())
		period = end.UnixMilli() - start.UnixMilli()
		window = period
		if r.GCounter {
			// A hash of per-region counts, not a counter: another key.
			c.buf = append(c.buf, ":g"...)
			rc.wend, c.gc = end.UnixMilli(), true
		}
	case rules.SlidingWindow:
		window = period
	case rules.Concurrency:
		at := len(c.lbuf)
		c.lbuf = append(c.lbuf, l.leasePrefix...)
		c.lbuf = strconv.AppendUint(c.lbuf, l.leases.Add(1), 10)
		lease = [2]int{at, len(c.lbuf)}
	}
	rc.alg, rc.limit, rc.period, rc.burst, rc.charge, rc.x = int64(r.Algorithm), limit, period, burst, rc.cost, left
	if r.GCounter {
		rc.alg = algGCounter
	}
	rc.shadow = r.Mode == rules.Shadow || l.opts.Shadow
	d.Statuses = append(d.Statuses, Status{Rule: r, Limit: burst, Remaining: -1, Window: msDuration(window), Part: int(rc.part), Shadow: rc.shadow})
	return lease
}

// findAliases takes each rule's key and lease id from the buffers (only now:
// appends may have moved them) and marks the rules that share a key with an
// earlier one: two parts that match one rule for one entity (Envoy
// descriptors that overlap) are one counter, which the script would read
// twice and write twice, charging once. The first takes both costs; the
// other reports its result.
func (c *call) findAliases(matched []*rules.Rule, offs []int, leaseOffs [][2]int) {
	c.aliases = false
	for i := range matched {
		rc := &c.rc[i]
		rc.key.b = c.buf[offs[i]:offs[i+1]]
		if matched[i].Algorithm == rules.Concurrency {
			rc.leaseID.b = c.lbuf[leaseOffs[i][0]:leaseOffs[i][1]]
		}
		rc.alias = 0
		if rc.part == 0 {
			continue // one part's rules have distinct ids, so distinct keys
		}
		for j := 0; j < i; j++ {
			if c.rc[j].alias == 0 && string(c.rc[j].key.b) == string(rc.key.b) {
				rc.alias, c.aliases = uint8(j+1), true
				c.rc[j].charge += rc.charge
				break
			}
		}
	}
}

// rampPick gathers what the breaker's ramp places a decision by: its
// counters' keys (those the fallback would grant from a bucket of its own
// and owe to Redis).
type rampPick struct {
	pos     float64 // the least of the keys' places in the ramp, [0, 1)
	keyed   bool    // the decision has such a key
	unknown bool    // one of them Redis has not answered for since this enforcer started
}

// note adds group g's keys to p.
func (p *rampPick) note(l *Limiter, c *call, g *group) {
	if !p.keyed {
		p.pos = 1
	}
	for _, i := range c.order[g.from:g.to] {
		rc := &c.rc[i]
		if !chargeable(rc.alg) {
			continue
		}
		p.keyed = true
		// A key's place: its hash as a fraction of 2⁶⁴ (53 bits of it).
		p.pos = min(p.pos, float64(xxhash.Sum64(rc.key.b)>>11)/(1<<53))
		if l.known != nil {
			p.unknown = p.unknown || !l.known.answered(rc.key.b, knownOf(rc))
		}
	}
}

// rampSends reports whether the breaker's ramp, now sending share of the
// decisions to Redis, sends the decision p describes. A decision goes when
// one of its keys has its place below share (so a key, once on Redis, stays
// there for the rest of the ramp, and every decision that counts it goes
// too), or when Redis has not answered for one of its keys since this
// enforcer started; one without such keys is spread (breaker.spread).
//
// So the fallback and Redis do not grant one key's units side by side: a
// key Redis has not answered for would get a full local bucket (limit ×
// Headroom) beside its whole limit on Redis (a fresh user saw 110 of a
// fixed window of 50), and a key decided by both in turn, its local grants
// charged to Redis only after Redis answered, passed up to twice what was
// left (7-8 of 5). A decision sent to Redis for a key the fallback owes
// units for charges the debts first (guarded, owesFor), so that Redis
// decides knowing what the fallback granted before it (a key counted with
// others of other places, a tenant's, is decided by both in turn). Called
// on the ramp's path only.
func (l *Limiter) rampSends(p *rampPick, b *breaker, share float64) bool {
	return p.unknown || p.keyed && p.pos < share || !p.keyed && b.spread(share)
}

// owesFor reports whether the fallback owes Redis units (or is charging
// them) for one of the keys of c's first local groups (this region's):
// guarded then charges them first (chargeFirst). Called only while
// something is owed.
func (l *Limiter) owesFor(c *call, local int) bool {
	for gi := range c.groups[:local] {
		g := &c.groups[gi]
		for _, i := range c.order[g.from:g.to] {
			if rc := &c.rc[i]; chargeable(rc.alg) && l.known.owes(rc.key.b) {
				return true
			}
		}
	}
	return false
}

// rampSendsLocal is rampSends for c's first local groups (this region's).
func (l *Limiter) rampSendsLocal(c *call, local int, b *breaker, share float64) bool {
	var p rampPick
	for gi := range c.groups[:local] {
		p.note(l, c, &c.groups[gi])
	}
	return l.rampSends(&p, b, share)
}

// rampSendsTicket is rampSends for a Cluster master's groups of c.
func (l *Limiter) rampSendsTicket(c *call, t *ticket, b *breaker, share float64) bool {
	var p rampPick
	for _, g := range t.groups {
		p.note(l, c, g)
	}
	return l.rampSends(&p, b, share)
}

// guarded runs the decision's script calls within the budget, through the
// circuit breaker: while it is open no call is made and every group fails
// with ErrBreakerOpen. The breaker counts round trips: a batch's call, not
// each decision in it (see batchCall.run).
func (l *Limiter) guarded(ctx context.Context, c *call) {
	local := len(c.groups) // this region's groups come first (see group)
	for gi := range c.groups {
		if c.groups[gi].remote != nil {
			local = gi
			break
		}
	}
	run := local > 0
	if !l.cluster && run { // a Cluster's masters and other regions have breakers of their own (their batchers')
		if share, err := l.breaker.ramping(); err != nil && !(err == ErrBreakerRamp && l.rampSendsLocal(c, local, l.breaker, share)) {
			for gi := range c.groups[:local] {
				c.groups[gi].err = err
			}
			if local == len(c.groups) {
				return
			}
			run = false
		}
	}
	if run && l.known != nil && l.known.owing.Load() > 0 && l.owesFor(c, local) {
		l.chargeFirst(ctx, c, local) // Redis decides these keys knowing what the fallback granted them
	}
	// The budget is Redis's: the script gets now + Budget as its deadline
	// and, run past it by Redis's clock, commits nothing (ErrLate). The
	// sidecar waits for the answer up to twice that: a script that Redis
	// ran in time but whose answer the sidecar, short of CPU, read a little
	// late still decides exactly, while a silent Redis holds a request at
	// most 2 × Budget. A caller's earlier deadline bounds both.
	base := ctx
	start := time.Now()
	l.clock.touch(start)
	c.waitFrom = start
	c.sentAt = start.UnixNano()
	// A sidecar that stalls (a CPU quota) waits its recent stalls out too.
	budget, wait := l.opts.Budget, 2*l.opts.Budget+l.stall.get(start)
	if l.readTimeout > 0 && wait > l.readTimeout {
		// go-redis cuts the wait at its ReadTimeout: a script run after it
		// would commit for a caller that has gone. (A stall allowance never
		// lengthens the script's deadline.)
		budget, wait = min(budget, l.readTimeout/2), l.readTimeout
	}
	script := start.Add(budget)
	c.until = start.Add(wait)
	if dl, ok := ctx.Deadline(); ok && dl.Before(c.until) {
		c.until = dl
		if dl.Before(script) {
			script = dl
		}
	}
	c.deadline = script.UnixMicro()
	_, span := l.traceScript(base, "decide", c)
	c.sized(len(c.groups))
	l.exec(ctx, base, c, l.decide, nil, run)
	endScript(span, c)
	if run {
		l.retryLate(ctx, c, local, budget)
	}
	l.observeRedis(start)
	c.waitFrom = time.Time{}
}

// retryLate sends again, once, the calls of this region's groups that
// Redis ran past their deadline (ErrLate: it committed nothing, so sending
// again cannot charge twice), with a fresh deadline of the budget (at most
// the wait's end), if the wait has at least half a budget left, counting
// the time this process stalled in it as not spent: a sidecar that stalled
// between setting a deadline and writing the call is not Redis's fault.
// The caller's own deadline still bounds the wait.
func (l *Limiter) retryLate(ctx context.Context, c *call, local int, budget time.Duration) {
	n := 0
	for gi := range c.groups[:local] {
		if errors.Is(c.groups[gi].err, ErrLate) {
			n++
		}
	}
	if n == 0 {
		return
	}
	now := time.Now()
	// The wait grows by what this process spent stalled in it.
	until := c.until.Add(l.clock.stalledDuring(c.waitFrom, now))
	if dl, ok := ctx.Deadline(); ok && dl.Before(until) {
		until = dl
	}
	if until.Sub(now) < budget/2 {
		return
	}
	saved, savedUntil := c.groups, c.until
	retry := c.retry[:0] // the late groups, copied: their results are copied back below
	for gi := range saved[:local] {
		if errors.Is(saved[gi].err, ErrLate) {
			g := saved[gi]
			g.err = nil
			retry = append(retry, g)
		}
	}
	c.retry = retry
	c.deadline = min(now.Add(budget).UnixMicro(), until.UnixMicro()) // never past the wait: no commit for a caller gone
	c.groups, c.until = retry, until
	l.run(ctx, c, l.decide, nil)
	c.groups, c.until = saved, savedUntil
	k := 0
	for gi := range saved[:local] {
		if errors.Is(saved[gi].err, ErrLate) {
			saved[gi].out, saved[gi].err = retry[k].out, retry[k].err
			k++
		}
	}
	l.lateRetries.Add(uint64(n))
}

// group splits the rules into one group per Redis slot (one group on a
// single node or Sentinel, where any keys may share a script call).
func (l *Limiter) group(c *call, n int) {
	c.groups = c.groups[:0]
	var done [MaxRules]bool
	if !l.cluster {
		k := 0
		for i := 0; i < n; i++ {
			if c.rc[i].alias == 0 && c.rc[i].home < 0 {
				c.order[k] = i
				k++
			}
		}
		if k > 0 {
			c.groups = append(c.groups, group{from: 0, to: k})
		}
	} else {
		k := 0
		for i := 0; i < n; i++ {
			if done[i] || c.rc[i].alias != 0 || c.rc[i].home >= 0 {
				continue
			}
			from := k
			for j := i; j < n; j++ {
				if !done[j] && c.rc[j].alias == 0 && c.rc[j].home < 0 && c.rc[j].slot == c.rc[i].slot {
					done[j] = true
					c.order[k] = j
					k++
				}
			}
			c.groups = append(c.groups, group{from: from, to: k})
		}
	}
	if c.remote { // then one group per other home region (per slot, on a Cluster), decided there
		k := 0
		if len(c.groups) > 0 {
			k = c.groups[len(c.groups)-1].to
		}
		for i := 0; i < n; i++ {
			if done[i] || c.rc[i].alias != 0 || c.rc[i].home < 0 {
				continue
			}
			from := k
			for j := i; j < n; j++ {
				if !done[j] && c.rc[j].alias == 0 && c.rc[j].home == c.rc[i].home && (l.homes.remote[c.rc[i].home].cluster == nil || c.rc[j].slot == c.rc[i].slot) {
					done[j] = true
					c.order[k] = j
					k++
				}
			}
			c.groups = append(c.groups, group{from: from, to: k, remote: l.homes.remote[c.rc[i].home]})
		}
	}
	for gi := range c.groups {
		g := &c.groups[gi]
		g.c, g.index, g.n, g.err = c, gi, int64(g.to-g.from), nil
		g.slot = c.rc[c.order[g.from]].slot
		g.deadline = &c.deadline
		if g.remote != nil {
			g.deadline = &c.homeDeadline
		}
	}
}

// appendRuleArgs appends rule i's 7 script arguments, as pointers into c.
func (c *call) appendRuleArgs(args []any, i int) []any {
	rc := &c.rc[i]
	shadow := &zero
	if rc.shadow {
		shadow = &one
	}
	args = append(args, &rc.alg, &rc.limit, &rc.period, &rc.burst, &rc.charge, shadow)
	if rc.alg == int64(rules.Concurrency) {
		return append(args, &rc.leaseID)
	}
	return append(args, &rc.x)
}

// run sends every group's script call: decide.lua's through the batcher
// (see batcher), refund.lua's directly. On a single node or Sentinel there
// is one group and one call. On a Cluster each group goes straight to the
// master of its slot, the nodes in parallel (see runCluster). A call whose
// script Redis has not cached (NOSCRIPT: a restart or SCRIPT FLUSH) is sent
// again with EVAL.
func (l *Limiter) run(ctx context.Context, c *call, s script, parse func(c *call, g *group, text string) error) {
	if l.cluster {
		l.runCluster(ctx, c, s, parse)
		return
	}
	if l.isDecide(s) {
		t := c.ticket(0)
		for gi := range c.groups {
			t.groups = append(t.groups, &c.groups[gi])
		}
		t.until = c.until
		l.batch.decide(ctx, t)
		for gi := range c.groups {
			if err := c.groups[gi].err; isMoved(err) {
				l.misrouted(err)
				break
			}
		}
		return
	}
	for gi := range c.groups { // refunds: one group, except on a Cluster
		g := &c.groups[gi]
		args := c.args[g.argFrom:g.argTo]
		cmd := l.rdb.Do(ctx, args...)
		l.roundTrips.Add(1)
		if isNoScript(cmd.Err()) {
			args[0], args[1] = "eval", s.src
			cmd = l.rdb.Do(ctx, args...)
			l.roundTrips.Add(1)
		}
		g.err = l.result(cmd, c, g, parse)
		if isMoved(g.err) {
			l.misrouted(g.err)
		}
	}
}

// isDecide reports whether s is decide.lua (batched), not refund.lua.
func (l *Limiter) isDecide(s script) bool { return s.sha == l.decide.sha }

// ticket returns c's ticket k, empty, for a batcher.
// sized makes room for n tickets and script calls (one per group), before
// any goroutine takes one.
func (c *call) sized(n int) {
	for len(c.tickets) < n {
		c.tickets = append(c.tickets, ticket{})
	}
	for len(c.scs) < n {
		c.scs = append(c.scs, scriptCall{})
	}
}

func (c *call) ticket(k int) *ticket {
	t := &c.tickets[k]
	if t.wake == nil {
		t.c, t.wake = c, make(chan uint8, 1)
	}
	t.groups, t.node, t.next = t.groups[:0], nil, nil
	return t
}

// runCluster sends each group to the master of its slot itself, rather than
// through the ClusterClient, whose redirect loop (MaxRedirects) also retries
// timed-out commands: a script that ran but whose reply was lost would run
// again and charge the request twice. The node clients retry nothing
// (ClusterOptions.MaxRetries defaults to -1 for them). The groups of one
// master go in one batch (decide.lua) or one pipeline (refund.lua); the
// masters are called in parallel. A group refused without running (MOVED
// or ASK: the slot moved or is moving; TRYAGAIN; NOSCRIPT) is sent once
// more; a moved one through the ClusterClient, which follows the
// redirection (with ASKING for ASK).
func (l *Limiter) runCluster(ctx context.Context, c *call, s script, parse func(c *call, g *group, text string) error) {
	cc := l.rdb.(*redis.ClusterClient)
	decide := l.isDecide(s)
	cmds := make([]*redis.Cmd, len(c.groups))
	if decide {
		// The wait deadline, for the ClusterClient's own calls (slot map,
		// redirections); the batches wait until c.until themselves.
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, c.until)
		defer cancel()
	}
	for attempt := 0; attempt < 2; attempt++ {
		nodes := 0
		var moved []int
		for gi := range c.groups {
			g := &c.groups[gi]
			if attempt == 1 {
				if !notRun(g.err) {
					continue
				}
				if isMoved(g.err) {
					moved = append(moved, gi)
					continue
				}
				if !decide && isNoScript(g.err) {
					c.args[g.argFrom], c.args[g.argFrom+1] = "eval", s.src
				}
			}
			node, err := cc.MasterForKey(ctx, string(c.rc[c.order[g.from]].key.b))
			if err != nil {
				g.err = err
				continue
			}
			k := 0
			for k < nodes && c.tickets[k].node != node {
				k++
			}
			if k == nodes {
				t := c.ticket(k)
				t.node, t.until = node, c.until
				nodes++
			}
			c.tickets[k].groups = append(c.tickets[k].groups, g)
		}
		if len(moved) > 0 {
			// A slot that moved, or is moving (ASK, which needs ASKING on the
			// target): the ClusterClient follows the redirection, with EVAL
			// (the new node may not have the script cached). Its redirect
			// loop would also retry a timeout, but a context deadline (with
			// ContextTimeoutEnabled) is never retried.
			l.sendMoved(ctx, cc, c, s, parse, moved, cmds)
		}
		open := 0
		for k := range nodes {
			t := &c.tickets[k]
			if decide { // the master's batcher asks its breaker
				b := l.nodes.get(t.node.Options().Addr)
				if share, err := b.ramping(); err != nil && !(err == ErrBreakerRamp && l.rampSendsTicket(c, t, b, share)) {
					t.fail(err)
					continue
				}
				t.done = func(error) {}
				if open != k {
					c.tickets[open], c.tickets[k] = c.tickets[k], c.tickets[open]
				}
				open++
				continue
			}
			done, err := l.nodes.get(t.node.Options().Addr).Allow()
			if err != nil { // this master's breaker is open: its slots fail at once
				t.fail(err)
				continue
			}
			t.done = done
			if open != k {
				c.tickets[open], c.tickets[k] = c.tickets[k], c.tickets[open]
			}
			open++
		}
		if open == 0 {
			return
		}
		send := func(t *ticket) {
			if decide {
				l.nodeBatch.get(t.node).decide(ctx, t)
				return
			}
			if len(t.groups) == 1 {
				g := t.groups[0]
				cmds[g.index] = t.node.Do(ctx, c.args[g.argFrom:g.argTo]...)
				return
			}
			pipe := t.node.Pipeline()
			for _, g := range t.groups {
				cmds[g.index] = pipe.Do(ctx, c.args[g.argFrom:g.argTo]...)
			}
			_, _ = pipe.Exec(ctx) // errors are per command
		}
		var wg sync.WaitGroup
		for k := 1; k < open; k++ {
			wg.Add(1)
			go func(t *ticket) { defer wg.Done(); send(t) }(&c.tickets[k])
		}
		send(&c.tickets[0])
		wg.Wait()
		if !decide {
			l.roundTrips.Add(1)
		}
		stale := false
		for k := range open {
			t := &c.tickets[k]
			var first error
			for _, g := range t.groups {
				if !decide {
					g.err = l.result(cmds[g.index], c, g, parse)
				}
				stale = stale || staleRoute(g.err)
				if first == nil {
					first = g.err
				}
			}
			t.done(first)
			t.done = nil
		}
		if stale {
			// For the next decisions (the reload is asynchronous, one at a
			// time). This one's retry follows a redirection; a node that
			// takes no writes or does not answer leaves it to the failure
			// modes.
			cc.ReloadState(ctx)
		}
	}
}

// sendMoved sends the groups that answered MOVED or ASK through the
// ClusterClient, in one pipeline, with EVAL.
func (l *Limiter) sendMoved(ctx context.Context, cc *redis.ClusterClient, c *call, s script, parse func(c *call, g *group, text string) error, moved []int, cmds []*redis.Cmd) {
	pipe := cc.Pipeline()
	var ints []*redis.IntSliceCmd
	for _, gi := range moved {
		g := &c.groups[gi]
		if !l.isDecide(s) {
			c.args[g.argFrom], c.args[g.argFrom+1] = "eval", s.src
			cmds[gi] = pipe.Do(ctx, c.args[g.argFrom:g.argTo]...)
			continue
		}
		sc := c.single(gi)
		sc.add(g)
		sc.build(l)
		sc.args[0], sc.args[1] = "eval", l.decide.src
		cmd := redis.NewIntSliceCmd(ctx, sc.args...)
		_ = pipe.Process(ctx, cmd)
		ints = append(ints, cmd)
	}
	_, _ = pipe.Exec(ctx)
	l.roundTrips.Add(1)
	for k, gi := range moved {
		g := &c.groups[gi]
		if l.isDecide(s) {
			g.err = nil
			c.scs[gi].result(ints[k])
			continue
		}
		g.err = l.result(cmds[gi], c, g, parse)
	}
}

// single returns c's script call k, empty, for one group sent on its own
// (a Cluster redirection, another region's Cluster).
func (c *call) single(k int) *scriptCall {
	sc := &c.scs[k]
	sc.reset()
	return sc
}

// notRun reports whether err says Redis refused the call without running it,
// so that sending it again cannot charge twice.
func notRun(err error) bool {
	if err == nil {
		return false
	}
	m := err.Error()
	return isNoScript(err) || isMoved(err) || strings.HasPrefix(m, "TRYAGAIN")
}

// isMoved reports a Cluster redirection: the slot lives on another node.
func isMoved(err error) bool {
	if err == nil {
		return false
	}
	m := err.Error()
	return strings.HasPrefix(m, "MOVED ") || strings.HasPrefix(m, "ASK ")
}

func (l *Limiter) result(cmd *redis.Cmd, c *call, g *group, parse func(c *call, g *group, text string) error) error {
	text, err := cmd.Text()
	if err != nil {
		return err
	}
	return parse(c, g, text)
}

// parseRefund checks refund.lua's reply.
func parseRefund(c *call, g *group, text string) error {
	var p intParser
	p.s = text
	if p.next() != g.n || p.err {
		return fmt.Errorf("enforcer: malformed refund reply %q", text)
	}
	return nil
}

// intParser reads space-separated decimal integers without allocating.
type intParser struct {
	s   string
	err bool
}

func (p *intParser) next() int64 {
	if p.s == "" {
		p.err = true
		return 0
	}
	i := 0
	for i < len(p.s) && p.s[i] != ' ' {
		i++
	}
	v, err := strconv.ParseInt(p.s[:i], 10, 64)
	if err != nil {
		p.err = true
	}
	if i < len(p.s) {
		i++
	}
	p.s = p.s[i:]
	return v
}

// finish turns the groups' results into d, refunding what was taken in
// other slots when the request is denied.
func (l *Limiter) finish(ctx context.Context, c *call, matched []*rules.Rule, d *Decision) {
	l.rememberAnswers(c)
	if c.aliases {
		defer c.copyAliases(d)
	}
	var err error
	deny, shadow := 0, 0
	var wait, now int64
	for gi := range c.groups {
		g := &c.groups[gi]
		if g.err != nil {
			err = g.err
			continue
		}
		if now == 0 {
			now = g.out.now
		}
		if g.out.deny > 0 && (deny == 0 || blocksLonger(g.out.wait, wait)) {
			deny, wait = g.out.deny, g.out.wait // the rule that blocks longest, as within a slot
		}
		if g.out.shadow > 0 && (shadow == 0 || g.out.shadow < shadow) {
			shadow = g.out.shadow
		}
		for _, i := range c.order[g.from:g.to] {
			st := &d.Statuses[i]
			st.Remaining = c.rc[i].res.rem
			if matched[i].Algorithm == rules.TokenBucket {
				st.Remaining += c.rc[i].res.window // a lease block's extra tokens are this enforcer's
			}
			st.Denied = c.rc[i].res.denied
			st.Reset = msDuration(c.rc[i].res.reset)
		}
	}
	if c.aliases {
		c.copyAliases(d) // again after refunds, by the deferred call
	}
	if d.Now.IsZero() {
		if now > 0 {
			d.Now = time.UnixMilli(now)
		} else {
			d.Now = l.opts.Clock()
		}
	}
	if deny > 0 {
		l.refundTaken(ctx, c, matched, d)
		i := deny - 1
		st := &d.Statuses[i]
		st.Denied = true
		d.Outcome, d.Rule, d.bind = decision.Denied, matched[i], deny
		d.Limit, d.Remaining, d.Reset = st.Limit, st.Remaining, st.Reset
		if wait < 0 {
			d.Reason = decision.ReasonCostExceedsCapacity
		} else {
			d.Reason = decision.ReasonOverLimit
			d.Wait = msDuration(wait)
			d.RetryAfter = retryAfter(d.Wait)
		}
		return
	}
	if err != nil {
		l.dropSentLeases(ctx, c, matched)
		l.degraded(ctx, c, matched, d, err)
		return
	}
	if shadow > 0 {
		d.Outcome, d.Rule, d.Shadow = decision.ShadowDenied, matched[shadow-1], matched[shadow-1]
		d.Statuses[shadow-1].Denied = true
	}
	c.keepLeases(matched, d)
	d.bindLeast()
}

// bindLeast makes the binding rule of an allowed decision the enforced
// rate rule with the least remaining. Concurrency rules bind only when
// nothing else matched: they have no time window to report.
func (d *Decision) bindLeast() {
	d.Remaining = math.MaxInt64
	for i := range d.Statuses {
		st := &d.Statuses[i]
		if !st.Shadow && st.Rule.Algorithm != rules.Concurrency && st.Remaining < d.Remaining {
			d.Limit, d.Remaining, d.Reset, d.bind = st.Limit, st.Remaining, st.Reset, i+1
		}
	}
	if d.Remaining == math.MaxInt64 { // only shadow or concurrency rules matched
		st := &d.Statuses[0]
		d.Limit, d.Remaining, d.Reset, d.bind = st.Limit, st.Remaining, st.Reset, 1
	}
}

// copyAliases gives each rule that shares its key with an earlier one (see
// decideRules) that rule's state.
func (c *call) copyAliases(d *Decision) {
	for i := range d.Statuses {
		if j := c.rc[i].alias; j != 0 {
			st, of := &d.Statuses[i], &d.Statuses[j-1]
			st.Remaining, st.Reset, st.Denied = of.Remaining, of.Reset, of.Denied
		}
	}
}

// degraded applies the failure modes after a storage error.
func (l *Limiter) degraded(ctx context.Context, c *call, matched []*rules.Rule, d *Decision, err error) {
	if err != ErrOverloaded { // a shed decision is the sidecar's saturation, counted by the gate
		l.redisErrs.failed(l.opts.Logger, err) // by cause; a log line per cause per 10 s at most
	}
	d.Err = err
	d.Outcome, d.Path = decision.DegradedOpen, decision.PathFallback
	d.Remaining = -1
	for i := range d.Statuses {
		d.Statuses[i].Remaining = -1
	}
	for i, r := range matched {
		if r.FailureMode != rules.FailClosed {
			continue
		}
		if d.Statuses[i].Shadow { // a shadow rule never denies: it would have
			if d.Shadow == nil {
				d.Shadow = r
				d.Statuses[i].Denied = true
			}
			continue
		}
		d.Outcome, d.Reason, d.Rule = decision.DegradedClosed, decision.ReasonLimiterUnavailable, r
		d.RetryAfter = time.Second
		l.refundTaken(ctx, c, matched, d)
		return
	}
	now := d.Now // the request's own time, else the enforcer's (not Redis's: it did not answer)
	if c.now == 0 {
		now = l.opts.Clock()
	}
	l.noteUnremembered()
	i, wait, shadow := l.local.decide(c, matched, now)
	if shadow >= 0 && d.Shadow == nil {
		d.Shadow = matched[shadow]
		d.Statuses[shadow].Denied = true
	}
	if i >= 0 {
		d.Outcome, d.Rule = decision.DegradedClosed, matched[i]
		d.Statuses[i].Denied = true
		if wait < 0 {
			d.Reason = decision.ReasonCostExceedsCapacity
		} else {
			d.Reason, d.Wait = decision.ReasonLocalOverLimit, wait
			d.RetryAfter = retryAfter(wait)
		}
		l.refundTaken(ctx, c, matched, d)
		return
	}
	c.keepLeases(matched, d)
}

// blocksLonger reports whether a rule that denies with wait w blocks longer
// than one that denies with wait than; a negative wait (a cost beyond
// capacity: waiting never helps) blocks longest.
func blocksLonger[T int64 | time.Duration](w, than T) bool {
	return than >= 0 && (w < 0 || w > than)
}

// msDuration converts milliseconds from a script into a Duration,
// saturating rather than wrapping: a negative count is 0 and one past
// time.Duration's range its largest whole second, so that no header is
// ever negative or shorter than the true wait. rules.Validate keeps every
// rule's waits and resets within rules.MaxWait, so this is a safeguard.
func msDuration(ms int64) time.Duration {
	const most = math.MaxInt64 / int64(time.Millisecond) / 1000 * 1000 // whole seconds, with room for ceilSeconds
	switch {
	case ms <= 0:
		return 0
	case ms > most-1000:
		return time.Duration(most-1000) * time.Millisecond
	}
	return time.Duration(ms) * time.Millisecond
}

// retryAfter is wait rounded up to whole seconds, at least 1 s.
func retryAfter(wait time.Duration) time.Duration {
	return max(time.Second, time.Duration(ceilSeconds(wait))*time.Second)
}

// refundTaken gives back what the groups that allowed took, when another
// group denied (or failed and a rule fails closed): refund.lua per group, in
// one round trip. A failed refund is counted; the units come back as the
// bucket refills or the window ends.
func (l *Limiter) refundTaken(ctx context.Context, c *call, matched []*rules.Rule, d *Decision) {
	refunds := c.groups[:0:0]
	c.args = c.args[:0]
	for gi := range c.groups {
		g := c.groups[gi]
		if g.err != nil || !g.out.anyTook {
			continue
		}
		r := group{c: c, index: len(refunds), argFrom: len(c.args), from: gi, remote: g.remote} // from: the decide group it refunds
		c.args = append(c.args, "evalsha", l.refund.sha, nil)
		for _, i := range c.order[g.from:g.to] {
			if c.rc[i].res.took {
				c.args = append(c.args, &c.rc[i].key)
				r.n++
			}
		}
		c.args[r.argFrom+2] = r.n
		c.args = append(c.args, g.out.now, r.n)
		for _, i := range c.order[g.from:g.to] {
			if c.rc[i].res.took {
				switch matched[i].Algorithm {
				case rules.SlidingWindow:
					c.rc[i].x = c.rc[i].res.window
				case rules.TokenBucket: // give back a lease block's extra tokens too
					c.rc[i].charge += c.rc[i].res.window
				}
				c.args = c.appendRuleArgs(c.args, i)
			}
		}
		c.args = append(c.args, l.regionArg)
		r.argTo = len(c.args)
		refunds = append(refunds, r)
	}
	if len(refunds) == 0 {
		return
	}
	saved := c.groups
	c.groups = refunds
	// The request's own deadline may be what failed it (a stalled node):
	// the refunds to the healthy nodes get a budget of their own.
	base := context.WithoutCancel(ctx)
	rctx, cancel := context.WithTimeout(base, l.opts.RefundBudget)
	defer cancel()
	_, span := l.traceScript(ctx, "refund", c)
	c.sized(len(c.groups))
	l.exec(rctx, base, c, l.refund, parseRefund, true)
	endScript(span, c)
	for _, g := range c.groups {
		if g.err != nil {
			l.refundBad.Inc()
			continue
		}
		l.refundOK.Inc()
		// Report what the refunded rules hold now, as a single node would.
		dg := saved[g.from]
		for _, i := range c.order[dg.from:dg.to] {
			if st := &d.Statuses[i]; c.rc[i].res.took && st.Remaining >= 0 {
				cost := c.rc[i].charge
				if matched[i].Algorithm == rules.TokenBucket {
					cost -= c.rc[i].res.window // the extra was already counted as remaining
				}
				st.Remaining = min(st.Limit, st.Remaining+cost)
				if matched[i].Algorithm == rules.Concurrency {
					st.Remaining = min(st.Limit, c.rc[i].res.rem+1)
				}
				c.rc[i].res.took = false
			}
		}
	}
	c.groups = saved
}
