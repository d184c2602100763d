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

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

// argsPerRule is how many ARGV values decide.lua and refund.lua take per rule.
const argsPerRule = 7

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
	rules    [MaxRules]*rules.Rule
	part     [MaxRules]uint8  // per rule: the part that matched it
	costs    [MaxRules]int64  // per rule: its part's cost
	ents     [MaxRules]string // per rule: an override's entity, else ""
	drop     [MaxRules]bool   // per rule: to be removed (see compact)
	blk      [MaxRules]Status // shadow blocking rules set aside (see blocks)
	nblk     int
	alias    [MaxRules]uint8 // per rule: 1 + the earlier rule with the same key, else 0
	aliases  bool
	probes   [MaxRules]hotProbe // per rule: its key's local state before the call
	flagged  [MaxRules]bool     // per rule: the pipeline marked its key hot
	localMs  int64              // the time for the hot table: the request's, else the enforcer's
	buf      []byte             // key text
	lbuf     []byte             // lease-id text
	shareKey []byte
	tagBuf   []byte // an entity tag for noShares
	hashIn   []byte // the text an entity tag hashes (rules.AppendEntityTagScratch)
	keys     [MaxRules]byteArg
	leaseIDs [MaxRules]byteArg
	nums     [MaxRules * argsPerRule]int64 // per rule: alg, limit, period, burst, cost, shadow, left
	slots    [MaxRules]uint16
	home     [MaxRules]int8  // per rule: the index of its home region (Limiter.remote), -1 = this region
	wend     [MaxRules]int64 // per G-Counter rule: the end of its window, ms
	remote   bool            // some rule's home is another region
	gc       bool            // some rule is a G-Counter
	order    [MaxRules]int   // rule indexes, grouped by slot
	groups   []group
	now      int64 // ARGV[1]: the request's time in ms, 0 = Redis TIME
	// The deadline decide.lua gets (µs since the epoch): this region's
	// calls', and the home regions' (HomeBudget). Past it a script commits
	// nothing.
	deadline, homeDeadline int64
	budget                 budgetCtx
	args                   []any
	res                    [MaxRules]ruleResult
	queueTimer             *time.Timer   // a wait for a place (Limiter.admit)
	wake                   chan struct{} // a place handed to the waiting c
	admitted               time.Time
	// A script call with c's arguments is still queued on the pipelined
	// connection after the budget ran out: c must not be reused.
	abandoned bool
	localCall // the local-scope rules' (see decideLocal)
}

// budgetCtx is the caller's context with the budget's earlier deadline,
// without allocating as context.WithTimeout does (five allocations per
// decision): it lives in the decision's pooled memory, with a timer and a
// Done channel that are reused from one decision to the next (a channel is
// made anew only after a budget ran out and closed it). go-redis, with
// ContextTimeoutEnabled, sets the socket deadlines from Deadline, and every
// wait of its own (for a pooled connection, a connection being set up, a
// dial retry's pause) ends at Done, so nothing holds a decision past the
// budget. Done closes at the deadline only: a caller's cancellation is seen
// by Err, and by Done at the deadline at the latest.
type budgetCtx struct {
	context.Context
	deadline time.Time
	done     chan struct{}
	timer    *time.Timer
}

func (b *budgetCtx) Deadline() (time.Time, bool) { return b.deadline, true }

func (b *budgetCtx) Done() <-chan struct{} { return b.done }

// arm starts the budget: ctx with deadline d.
func (b *budgetCtx) arm(ctx context.Context, d time.Time) {
	b.Context, b.deadline = ctx, d
	if b.timer == nil {
		b.done = make(chan struct{})
		b.timer = time.AfterFunc(time.Until(d), b.fire)
		return
	}
	b.timer.Reset(time.Until(d))
}

func (b *budgetCtx) fire() { close(b.done) }

// disarm ends the budget, holding no reference to the caller's context.
func (b *budgetCtx) disarm() {
	if !b.timer.Stop() {
		<-b.done // fired: wait for the close, then a fresh channel
		b.done = make(chan struct{})
	}
	b.Context = nil
}

func (b *budgetCtx) Err() error {
	if err := b.Context.Err(); err != nil {
		return err
	}
	if !time.Now().Before(b.deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// group is the rules of one Redis slot: order[from:to], decided by one
// script call whose arguments are args[argFrom:argTo].
type group struct {
	from, to       int
	n              int64 // number of keys = number of rules
	remote         *home // the region whose Redis decides it; nil = this region's
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

// decideRules decides the matched rules and fills d.
func (l *Limiter) decideRules(ctx context.Context, c *call, req *Request, matched []*rules.Rule, ctl *store.Control, d *Decision) {
	n := len(matched)
	c.buf = c.buf[:0]
	var offs [MaxRules + 1]int
	var leaseOffs [MaxRules][2]int
	c.lbuf = c.lbuf[:0]
	var fwNow time.Time
	c.now = 0 // Redis TIME
	c.remote, c.gc = false, false
	if !req.Now.IsZero() {
		c.now = req.Now.UnixMilli()
		fwNow = req.Now
	}
	for i, r := range matched {
		offs[i] = len(c.buf)
		c.buf = append(c.buf, store.BucketKeyPrefix...)
		tagAt := len(c.buf)
		if c.ents[i] != "" {
			c.buf = appendOverrideTag(c.buf, c.ents[i])
		} else {
			c.buf, c.hashIn = rules.AppendEntityTagScratch(c.buf, c.hashIn, r, &c.descs[c.part[i]])
		}
		tag := c.buf[tagAt:]
		c.buf = append(c.buf, "}:"...)
		if c.ents[i] != "" {
			c.buf = append(c.buf, overrideKeyName...) // not r.ID, which names the limit
		} else {
			c.buf = append(c.buf, r.ID...)
		}
		c.buf = append(c.buf, ':', '0'+byte(r.Algorithm))
		limit, burst := r.Limit, r.Burst
		c.home[i] = -1
		switch {
		case r.Pinned: // the whole limit, in the entity's home region
			c.home[i] = l.homeOf(r, tag)
			c.remote = c.remote || c.home[i] >= 0
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
		c.flagged[i] = false
		if len(ctl.Hot) > 0 && !r.Pinned && !r.GCounter { // a split would divide a global count
			if hk, ok := l.hotKey(c, r, tag, ctl, req.Now); ok {
				c.flagged[i] = hk.Lease
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
		if l.cluster || c.home[i] >= 0 && l.remote[c.home[i]].cluster != nil {
			c.slots[i] = Slot(string(c.buf[tagAt : tagAt+rules.EntityTagLen]))
		}
		period := r.Period.Milliseconds()
		var left, window int64 // window: the policy's, in ms, for RateLimit-Policy
		switch r.Algorithm {
		case rules.TokenBucket:
			window = (burst*period + limit - 1) / limit
		case rules.FixedWindow:
			if fwNow.IsZero() {
				fwNow = l.opts.Clock()
			}
			start, end := r.Window(fwNow)
			c.buf = append(c.buf, ':')
			c.buf = strconv.AppendInt(c.buf, start.UnixMilli(), 10)
			left = max(1, end.UnixMilli()-fwNow.UnixMilli())
			period = end.UnixMilli() - start.UnixMilli()
			window = period
			if r.GCounter {
				// A hash of per-region counts, not a counter: another key.
				c.buf = append(c.buf, ":g"...)
				c.wend[i], c.gc = end.UnixMilli(), true
			}
		case rules.SlidingWindow:
			window = period
		case rules.Concurrency:
			at := len(c.lbuf)
			c.lbuf = append(c.lbuf, l.leasePrefix...)
			c.lbuf = strconv.AppendUint(c.lbuf, l.leases.Add(1), 10)
			leaseOffs[i] = [2]int{at, len(c.lbuf)}
		}
		v := c.nums[i*argsPerRule : (i+1)*argsPerRule]
		v[0], v[1], v[2], v[3], v[4], v[5], v[6] = int64(r.Algorithm), limit, period, burst, c.costs[i], 0, left
		if r.GCounter {
			v[0] = algGCounter
		}
		shadow := r.Mode == rules.Shadow || l.opts.Shadow
		if shadow {
			v[5] = 1
		}
		d.Statuses = append(d.Statuses, Status{Rule: r, Limit: burst, Remaining: -1, Window: msDuration(window), Part: int(c.part[i]), Shadow: shadow})
	}
	offs[n] = len(c.buf)
	c.aliases = false
	for i := 0; i < n; i++ { // slices taken only now: appends may have moved the buffers
		c.keys[i].b = c.buf[offs[i]:offs[i+1]]
		if matched[i].Algorithm == rules.Concurrency {
			c.leaseIDs[i].b = c.lbuf[leaseOffs[i][0]:leaseOffs[i][1]]
		}
		c.alias[i] = 0
		if c.part[i] == 0 {
			continue // one part's rules have distinct ids, so distinct keys
		}
		// Two parts that match one rule for one entity (Envoy descriptors
		// that overlap) are one counter: the script would read its state
		// twice and write it twice, charging once. The first takes both
		// costs; the other reports its result.
		for j := 0; j < i; j++ {
			if c.alias[j] == 0 && string(c.keys[j].b) == string(c.keys[i].b) {
				c.alias[i], c.aliases = uint8(j+1), true
				c.nums[j*argsPerRule+4] += c.nums[i*argsPerRule+4]
				break
			}
		}
	}
	if l.hot != nil {
		c.localMs = c.now
		if c.localMs == 0 {
			c.localMs = l.opts.Clock().UnixMilli()
		}
		if l.decideLocally(c, matched, d) {
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
		l.learn(c, matched, d)
	}
}

// guarded runs the decision's script calls within the budget, through the
// circuit breaker: while it is open no call is made and every group fails
// with ErrBreakerOpen.
func (l *Limiter) guarded(ctx context.Context, c *call) {
	local := len(c.groups) // this region's groups come first (see group)
	for gi := range c.groups {
		if c.groups[gi].remote != nil {
			local = gi
			break
		}
	}
	done := func(error) {}
	run := local > 0
	if !l.cluster && run { // a Cluster has a breaker per master (runCluster); other regions one each (runHome)
		var err error
		if done, err = l.breaker.Allow(); err != nil {
			for gi := range c.groups[:local] {
				c.groups[gi].err = err
			}
			if local == len(c.groups) {
				return
			}
			run, done = false, func(error) {}
		}
	}
	// The budget is Redis's: the script gets now + Budget as its deadline
	// and, run past it by Redis's clock, commits nothing (ErrLate). The
	// sidecar waits for the answer up to twice that: a script that Redis
	// ran in time but whose answer the sidecar, short of CPU, read a little
	// late still decides exactly, while a silent Redis holds a request at
	// most 2 × Budget. A caller's earlier deadline bounds both.
	base := ctx
	start := time.Now()
	budget, wait := l.opts.Budget, 2*l.opts.Budget
	if l.readTimeout > 0 && wait > l.readTimeout {
		// go-redis cuts the wait at its ReadTimeout: a script run after it
		// would commit for a caller that has gone.
		budget, wait = l.readTimeout/2, l.readTimeout
	}
	script := start.Add(budget)
	if dl, ok := ctx.Deadline(); !ok || dl.Sub(start) > wait {
		c.budget.arm(ctx, start.Add(wait))
		defer c.budget.disarm()
		ctx = &c.budget
	} else if dl.Before(script) {
		script = dl
	}
	c.deadline = script.UnixMicro()
	_, span := l.traceScript(base, "decide", c)
	l.exec(ctx, base, c, l.decide, parseDecide, run)
	endScript(span, c)
	l.observeRedis(start)
	var first error
	for gi := range c.groups[:local] {
		if first = c.groups[gi].err; first != nil {
			break
		}
	}
	done(first)
}

// group splits the rules into one group per Redis slot (one group on a
// single node or Sentinel, where any keys may share a script call) and
// builds each group's EVALSHA arguments.
func (l *Limiter) group(c *call, n int) {
	c.groups = c.groups[:0]
	var done [MaxRules]bool
	if !l.cluster {
		k := 0
		for i := 0; i < n; i++ {
			if c.alias[i] == 0 && c.home[i] < 0 {
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
			if done[i] || c.alias[i] != 0 || c.home[i] >= 0 {
				continue
			}
			from := k
			for j := i; j < n; j++ {
				if !done[j] && c.alias[j] == 0 && c.home[j] < 0 && c.slots[j] == c.slots[i] {
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
			if done[i] || c.alias[i] != 0 || c.home[i] < 0 {
				continue
			}
			from := k
			for j := i; j < n; j++ {
				if !done[j] && c.alias[j] == 0 && c.home[j] == c.home[i] && (l.remote[c.home[i]].cluster == nil || c.slots[j] == c.slots[i]) {
					done[j] = true
					c.order[k] = j
					k++
				}
			}
			c.groups = append(c.groups, group{from: from, to: k, remote: l.remote[c.home[i]]})
		}
	}
	c.args = c.args[:0]
	for gi := range c.groups {
		g := &c.groups[gi]
		g.n = int64(g.to - g.from)
		g.argFrom = len(c.args)
		c.args = append(c.args, "evalsha", l.decide.sha, &g.n)
		for _, i := range c.order[g.from:g.to] {
			c.args = append(c.args, &c.keys[i])
		}
		c.args = append(c.args, &c.now, &g.n)
		for _, i := range c.order[g.from:g.to] {
			c.args = c.appendRuleArgs(c.args, i)
		}
		c.args = append(c.args, l.regionArg)
		if g.remote != nil {
			c.args = append(c.args, &c.homeDeadline)
		} else {
			c.args = append(c.args, &c.deadline)
		}
		g.argTo = len(c.args)
	}
}

// appendRuleArgs appends rule i's 7 script arguments, as pointers into c.
func (c *call) appendRuleArgs(args []any, i int) []any {
	v := c.nums[i*argsPerRule:]
	args = append(args, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5])
	if v[0] == int64(rules.Concurrency) {
		return append(args, &c.leaseIDs[i])
	}
	return append(args, &v[6])
}

// run sends every group's script call in one round trip. On a single node
// or Sentinel there is one group and one call. On a Cluster each group goes
// straight to the master of its slot, the nodes in parallel (see
// runCluster). A call whose script Redis has not cached (NOSCRIPT: a
// restart or SCRIPT FLUSH) is sent again with EVAL.
func (l *Limiter) run(ctx context.Context, c *call, s script, parse func(c *call, g *group, text string) error) {
	if l.cluster {
		l.runCluster(ctx, c, s, parse)
		return
	}
	for gi := range c.groups { // one group, except for refunds, which only a Cluster makes
		g := &c.groups[gi]
		args := c.args[g.argFrom:g.argTo]
		cmd := l.do(ctx, c, args)
		l.roundTrips.Add(1)
		if isNoScript(cmd.Err()) {
			args[0], args[1] = "eval", s.src
			cmd = l.do(ctx, c, args)
			l.roundTrips.Add(1)
		}
		g.err = l.result(cmd, c, g, parse)
		if isMoved(g.err) {
			l.misrouted(g.err)
		}
	}
}

// do sends one script call. With the pipeliner (a single node or Sentinel)
// it is queued with the other decisions' calls and written with them in one
// pipeline (go-redis's auto-pipelining): Redis reads and answers the batch
// at once, which costs it about half the CPU of separate round trips. The
// budget (ctx) bounds the wait for the answer, not the batch, which keeps
// the client's ReadTimeout: a call still queued when the budget runs out is
// abandoned, c is not reused (its arguments are in the queued command), and
// the script, if it runs later, commits nothing (its deadline argument has
// passed). Without the pipeliner, or with no other call in flight, it is one
// call on a pooled connection.
func (l *Limiter) do(ctx context.Context, c *call, args []any) *redis.Cmd {
	// Alone, a call goes straight to a pooled connection: a batch of one
	// would only add the pipeliner's hand-off (a goroutine switch each way,
	// 11 allocations) to the round trip.
	n := l.calling.Add(1)
	defer l.calling.Add(-1)
	if l.ap == nil || n == 1 {
		return l.rdb.Do(ctx, args...)
	}
	cmd := redis.NewCmd(context.Background(), args...)
	f := l.ap.Submit(context.Background(), cmd)
	if err := f.WaitContext(ctx); err == nil || ctx.Err() == nil {
		return cmd
	}
	// The budget ran out (or the caller gave up): one more look, in case
	// the answer came at the same moment.
	if f.WaitContext(doneCtx) == context.Canceled {
		c.abandoned = true
		bad := redis.NewCmd(ctx)
		bad.SetErr(ctx.Err())
		return bad
	}
	return cmd
}

// doneCtx is a context already done, for a wait that must not block.
var doneCtx = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// runCluster sends each group to the master of its slot itself, rather than
// through the ClusterClient, whose redirect loop (MaxRedirects) also retries
// timed-out commands: a script that ran but whose reply was lost would run
// again and charge the request twice. The node clients retry nothing
// (ClusterOptions.MaxRetries defaults to -1 for them). Groups on one node go
// in one pipeline; the nodes are called in parallel. A group refused without
// running (MOVED or ASK: the slot moved or is moving; TRYAGAIN; NOSCRIPT) is
// sent once more; a moved one through the ClusterClient, which follows the
// redirection (with ASKING for ASK).
func (l *Limiter) runCluster(ctx context.Context, c *call, s script, parse func(c *call, g *group, text string) error) {
	cc := l.rdb.(*redis.ClusterClient)
	cmds := make([]*redis.Cmd, len(c.groups))
	type batch struct {
		node   *redis.Client
		groups []int
		done   func(error) // its master's breaker
	}
	for attempt := 0; attempt < 2; attempt++ {
		var batches []batch
		var moved []int
		for gi := range c.groups {
			g := &c.groups[gi]
			if attempt == 1 {
				if !notRun(g.err) {
					continue
				}
				if isNoScript(g.err) {
					c.args[g.argFrom], c.args[g.argFrom+1] = "eval", s.src
				}
				if isMoved(g.err) {
					// The new node may not have the script cached yet: EVAL.
					c.args[g.argFrom], c.args[g.argFrom+1] = "eval", s.src
					moved = append(moved, gi)
					continue
				}
			}
			key := c.args[g.argFrom+3].(*byteArg).String()
			node, err := cc.MasterForKey(ctx, key)
			if err != nil {
				g.err = err
				continue
			}
			found := false
			for bi := range batches {
				if batches[bi].node == node {
					batches[bi].groups = append(batches[bi].groups, gi)
					found = true
				}
			}
			if !found {
				batches = append(batches, batch{node: node, groups: []int{gi}})
			}
		}
		if len(moved) > 0 {
			// A slot that moved, or is moving (ASK, which needs ASKING on the
			// target): the ClusterClient follows the redirection. Its redirect
			// loop would also retry a timeout, but a context deadline (with
			// ContextTimeoutEnabled) is never retried.
			// go-redis's redirect loop sleeps between attempts until Done,
			// which the budget closes at its deadline.
			rctx := ctx
			pipe := cc.Pipeline()
			for _, gi := range moved {
				g := &c.groups[gi]
				cmds[gi] = pipe.Do(rctx, c.args[g.argFrom:g.argTo]...)
			}
			_, _ = pipe.Exec(rctx)
			l.roundTrips.Add(1)
			for _, gi := range moved {
				c.groups[gi].err = l.result(cmds[gi], c, &c.groups[gi], parse)
			}
		}
		open := 0
		for _, b := range batches {
			done, err := l.nodes.get(b.node.Options().Addr).Allow()
			if err != nil { // this master's breaker is open: its slots fail at once
				for _, gi := range b.groups {
					c.groups[gi].err = err
				}
				continue
			}
			b.done = done
			batches[open] = b
			open++
		}
		batches = batches[:open]
		if len(batches) == 0 {
			return
		}
		send := func(b batch) {
			if len(b.groups) == 1 {
				g := &c.groups[b.groups[0]]
				cmds[b.groups[0]] = b.node.Do(ctx, c.args[g.argFrom:g.argTo]...)
				return
			}
			pipe := b.node.Pipeline()
			for _, gi := range b.groups {
				g := &c.groups[gi]
				cmds[gi] = pipe.Do(ctx, c.args[g.argFrom:g.argTo]...)
			}
			_, _ = pipe.Exec(ctx) // errors are per command
		}
		var wg sync.WaitGroup
		for _, b := range batches[1:] {
			wg.Add(1)
			go func() { defer wg.Done(); send(b) }()
		}
		send(batches[0])
		wg.Wait()
		l.roundTrips.Add(1)
		stale := false
		for _, b := range batches {
			var first error
			for _, gi := range b.groups {
				g := &c.groups[gi]
				g.err = l.result(cmds[gi], c, g, parse)
				stale = stale || staleRoute(g.err)
				if first == nil {
					first = g.err
				}
			}
			b.done(first)
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

// parseDecide reads decide.lua's reply for group g.
func parseDecide(c *call, g *group, text string) error {
	if strings.HasPrefix(text, "late ") {
		return ErrLate
	}
	var p intParser
	p.s = text
	g.out = groupResult{allowed: p.next() == 1}
	deny, wait, shadow := p.next(), p.next(), p.next()
	g.out.now = p.next()
	g.out.wait, g.out.swait = wait, p.next()
	if deny > 0 && deny <= g.n {
		g.out.deny = c.order[g.from+int(deny)-1] + 1
	}
	if shadow > 0 && shadow <= g.n {
		g.out.shadow = c.order[g.from+int(shadow)-1] + 1
	}
	for _, i := range c.order[g.from:g.to] {
		r := &c.res[i]
		var took int64
		r.rem, r.reset, took, r.window = p.next(), p.next(), p.next(), p.next()
		r.took, r.denied = took == 1, took == 2
		g.out.anyTook = g.out.anyTook || r.took
	}
	if p.err || p.s != "" || (!g.out.allowed && g.out.deny == 0) {
		return fmt.Errorf("enforcer: malformed script reply %q", text)
	}
	return nil
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
			st.Remaining = c.res[i].rem
			if matched[i].Algorithm == rules.TokenBucket {
				st.Remaining += c.res[i].window // a lease block's extra tokens are this enforcer's
			}
			st.Denied = c.res[i].denied
			st.Reset = msDuration(c.res[i].reset)
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
	l.keepLeases(c, matched, d)
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
		if j := c.alias[i]; j != 0 {
			st, of := &d.Statuses[i], &d.Statuses[j-1]
			st.Remaining, st.Reset, st.Denied = of.Remaining, of.Reset, of.Denied
		}
	}
}

// degraded applies the failure modes after a storage error.
func (l *Limiter) degraded(ctx context.Context, c *call, matched []*rules.Rule, d *Decision, err error) {
	l.redisErrs.failed(l.opts.Logger, err) // by cause; a log line per cause per 10 s at most
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
	l.keepLeases(c, matched, d)
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

// keepLeases records the concurrency slots the allowed request took.
func (l *Limiter) keepLeases(c *call, matched []*rules.Rule, d *Decision) {
	for gi := range c.groups {
		g := &c.groups[gi]
		if g.err != nil || !g.out.anyTook {
			continue
		}
		for _, i := range c.order[g.from:g.to] {
			if matched[i].Algorithm == rules.Concurrency && c.res[i].took {
				d.Leases = append(d.Leases, Lease{Key: string(c.keys[i].b), ID: string(c.leaseIDs[i].b), TTL: matched[i].Period})
			}
		}
	}
}

// dropSentLeases removes the concurrency leases that the calls which got no
// answer (a timeout, a broken connection) sent: such a script may have
// committed just before its deadline, its reply arriving after the caller
// gave up. One that runs later commits nothing (decide.lua's deadline), so a
// removal that Redis runs before the script leaves nothing either. Each
// removal has the budget, apart from the request's own deadline; a failed one
// is counted and its lease frees itself at its TTL.
func (l *Limiter) dropSentLeases(ctx context.Context, c *call, matched []*rules.Rule) {
	for gi := range c.groups {
		g := &c.groups[gi]
		if !mayHaveRun(g.err) {
			continue
		}
		for _, i := range c.order[g.from:g.to] {
			if matched[i].Algorithm != rules.Concurrency {
				continue
			}
			rdb := l.rdb
			if g.remote != nil {
				rdb = g.remote.rdb
			}
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.opts.Budget)
			err := rdb.ZRem(rctx, string(c.keys[i].b), string(c.leaseIDs[i].b)).Err()
			cancel()
			l.roundTrips.Add(1)
			if err != nil {
				l.leaseDropBad.Inc()
				l.slotRetry.add(l, []Lease{{Key: string(c.keys[i].b), ID: string(c.leaseIDs[i].b), TTL: matched[i].Period}}, time.Now())
			} else {
				l.leaseDropOK.Inc()
			}
		}
	}
}

// mayHaveRun reports whether a failed script call may have run in Redis: it
// got no answer (a timeout, a broken connection), as opposed to an error
// reply, a call never made (the breaker), or a late script's refusal.
func mayHaveRun(err error) bool {
	return err != nil && !isReply(err) && !errors.Is(err, ErrBreakerOpen) && !errors.Is(err, ErrLate) &&
		!errors.Is(err, context.Canceled)
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
		r := group{argFrom: len(c.args), from: gi, remote: g.remote} // from: the decide group it refunds
		c.args = append(c.args, "evalsha", l.refund.sha, nil)
		for _, i := range c.order[g.from:g.to] {
			if c.res[i].took {
				c.args = append(c.args, &c.keys[i])
				r.n++
			}
		}
		c.args[r.argFrom+2] = r.n
		c.args = append(c.args, g.out.now, r.n)
		for _, i := range c.order[g.from:g.to] {
			if c.res[i].took {
				switch matched[i].Algorithm {
				case rules.SlidingWindow:
					c.nums[i*argsPerRule+6] = c.res[i].window
				case rules.TokenBucket: // give back a lease block's extra tokens too
					c.nums[i*argsPerRule+4] += c.res[i].window
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
			if st := &d.Statuses[i]; c.res[i].took && st.Remaining >= 0 {
				cost := c.nums[i*argsPerRule+4]
				if matched[i].Algorithm == rules.TokenBucket {
					cost -= c.res[i].window // the extra was already counted as remaining
				}
				st.Remaining = min(st.Limit, st.Remaining+cost)
				if matched[i].Algorithm == rules.Concurrency {
					st.Remaining = min(st.Limit, c.res[i].rem+1)
				}
				c.res[i].took = false
			}
		}
	}
	c.groups = saved
}
