package enforcer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"

	"github.com/sluice-rl/sluice/rules"
)

// Batching. Every decision's script call to a Redis node goes through that
// node's batcher. A decision that finds one of the node's connections free
// sends its call at once, alone; one that finds them all busy waits, and
// when a connection's call returns, everything that waited goes in the next
// call: one EVALSHA of decide.lua that decides the waiting decisions one
// after the other (each atomically, all its rules or none, with its own time,
// deadline and outcome), as envoyproxy/ratelimit's REDIS_PIPELINE_WINDOW and
// rueidis's auto-pipelining batch commands, taken one step further into the
// script: Redis parses one command, runs one script and answers once for the
// whole batch. A batch is whatever queued while the previous call was in
// flight: no timer holds a decision back to make a batch bigger.
//
// The goroutine that finds a connection free sends the call itself, and the
// one that hands results back when it returns hands the next batch to one of
// its decisions' goroutines to send: no goroutine of the batcher's own, and
// no wake-up beyond the one each waiting decision needs anyway.
//
// A batch waits for Redis until the earliest wait deadline among its
// decisions (normally its oldest's): no decision waits past its own. A
// decision whose deadline passes while it is still queued leaves the queue
// (errQueued: never sent, nothing charged); the circuit breaker counts it a
// Redis failure when the node's last call failed (a stalled Redis holds the
// queue: its calls are few and long, and counting only those would leave
// the breaker closed while most decisions fail), and leaves it out when the
// calls succeed (a sidecar short of CPU holds the queue). On a Cluster, one batch goes to
// one master, as one call per slot in one pipeline (a script's keys must
// share a slot).

// maxBatch and maxBatchKeys bound one call: the decisions and keys it
// carries. A longer queue waits for the next call.
const (
	maxBatch     = 64
	maxBatchKeys = 1024
)

// batchConns is how many calls a batcher has in flight at most: with more,
// Redis serves more calls of fewer decisions each (more of its CPU per
// decision); with fewer, a decision waits longer for the next call.
const batchConns = 2

// errQueued is the error of a decision whose wait deadline passed before a
// connection was free to send it: it never reached Redis.
var errQueued = fmt.Errorf("%w: still queued for a Redis connection (every connection's call in flight)", context.DeadlineExceeded)

// Ticket messages.
const (
	ticketDone = iota + 1 // the results are in the decision's groups
	ticketSend            // send the ticket's batch (ticket.next)
)

// ticket is one decision's groups (each one script call's worth: one slot)
// for one node, waiting for a batch or in one. It lives in the decision's
// call.
type ticket struct {
	c      *call
	groups []*group  // c's groups for this node
	until  time.Time // the wait deadline
	wake   chan uint8
	queued bool        // in the batcher's queue (under its mutex)
	next   *batchCall  // with ticketSend: the batch to send
	timer  *time.Timer // the wait in the queue
	// On a Cluster: the master, and its breaker's report.
	node *redis.Client
	done func(error)
}

// batcher batches the decide calls of concurrent decisions to one Redis node.
// Safe for concurrent use.
type batcher struct {
	l       *Limiter
	node    batchNode
	cluster bool // a Cluster master: one call per slot
	single  bool // Options.NoPipeline: a batch of one decision each
	conns   int  // calls in flight at most (batchConns)
	breaker *breaker
	mu      sync.Mutex
	queue   []*ticket
	flying  int          // calls in flight
	free    []*batchCall // idle batch buffers
	// failing is the error of the node's last finished call when the
	// breaker counted it a failure (a timeout, a refused connection, every
	// decision late), nil after one that succeeded: a decision that leaves
	// the queue unsent meanwhile was held up by Redis (see queuedOut).
	failing atomic.Pointer[error]
	// held is how many more queued-out decisions the breaker counts for
	// that call: 4 × Breaker.Failures per failed call.
	held atomic.Int32
	// silentFrom is when (Unix ns) the earliest call sent since the node's
	// last answer in time (a result or an error reply, not ErrLate) was
	// sent; 0 when the last call finished was answered. A stall of this
	// process excuses a timeout only until the node has been silent for
	// stallExcuse (see markStalled).
	silentFrom atomic.Int64
}

// stallExcuse is how long the node may leave calls unanswered while each
// of their timeouts overlapped a stall of this process and is the stall's:
// past it, the node, not the process, is not answering (a frozen Redis on
// a loaded host), and the timeouts count against it.
const stallExcuse = time.Second

// batchNode is what a batcher needs of a Redis client: a *redis.Client (a
// single node, a Sentinel group's master, a Cluster master).
type batchNode interface {
	Process(ctx context.Context, cmd redis.Cmder) error
	Pipeline() redis.Pipeliner
}

func newBatcher(l *Limiter, node batchNode, cluster bool, br *breaker) *batcher {
	return &batcher{l: l, node: node, cluster: cluster, single: l.opts.NoPipeline, conns: batchConns, breaker: br}
}

// decide sends t's groups to Redis, in a batch with other decisions', and
// returns when their results (or errors) are in the groups.
func (b *batcher) decide(ctx context.Context, t *ticket) {
	b.mu.Lock()
	if b.flying < b.conns || b.single {
		b.flying++
		bc := b.takeLocked()
		b.mu.Unlock()
		bc.add(t)
		b.send(bc)
		return
	}
	t.queued = true
	b.queue = append(b.queue, t)
	b.mu.Unlock()
	if t.timer == nil {
		t.timer = time.NewTimer(time.Until(t.until))
	} else {
		t.timer.Reset(time.Until(t.until))
	}
	var m uint8
	select {
	case m = <-t.wake:
	case <-t.timer.C:
	case <-ctx.Done():
	}
	t.timer.Stop() // Go 1.23 timers: no stale tick after Stop or Reset
	if m == 0 {
		b.mu.Lock()
		if t.queued { // still waiting: leave, unsent
			b.remove(t)
			b.mu.Unlock()
			err := errQueued
			if ctx.Err() != nil && time.Now().Before(t.until) {
				err = ctx.Err()
			} else {
				b.queuedOut()
			}
			t.fail(err)
			return
		}
		b.mu.Unlock()
		m = <-t.wake // in a batch already: its deadline is no later than t's
	}
	if m == ticketSend {
		bc := t.next
		t.next = nil
		b.send(bc)
	}
}

// remove takes t out of the queue. Called with the mutex held.
func (b *batcher) remove(t *ticket) {
	for i, q := range b.queue {
		if q == t {
			copy(b.queue[i:], b.queue[i+1:])
			b.queue[len(b.queue)-1] = nil
			b.queue = b.queue[:len(b.queue)-1]
			break
		}
	}
	t.queued = false
}

// takeLocked returns an idle batch buffer. Called with the mutex held.
func (b *batcher) takeLocked() *batchCall {
	if n := len(b.free); n > 0 {
		bc := b.free[n-1]
		b.free = b.free[:n-1]
		return bc
	}
	return &batchCall{b: b}
}

// send sends bc and hands its results to its decisions; then, if
// decisions are queued, it hands the next batch to one of them to send (from
// its own goroutine: this one returns to its caller), or releases the
// connection.
func (b *batcher) send(bc *batchCall) {
	bc.run()
	bc.deliver()
	b.recycle(bc)
	for {
		next := b.next()
		if next == nil {
			return
		}
		if next.dropExpired() {
			t := next.tickets[0]
			t.next = next
			t.wake <- ticketSend
			return
		}
		b.recycle(next)
	}
}

// recycle keeps bc for another batch.
func (b *batcher) recycle(bc *batchCall) {
	bc.reset()
	b.mu.Lock()
	b.free = append(b.free, bc)
	b.mu.Unlock()
}

// next takes the queue's head, at most maxBatch decisions and maxBatchKeys
// keys, as a batch for the connection just freed; nil (the connection
// released) when nothing is queued.
func (b *batcher) next() *batchCall {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.queue) == 0 || b.single {
		b.flying--
		return nil
	}
	bc := b.takeLocked()
	n, keys := 0, 0
	for n < len(b.queue) && n < maxBatch {
		t := b.queue[n]
		k := t.keys()
		if n > 0 && keys+k > maxBatchKeys {
			break
		}
		keys += k
		t.queued = false
		bc.tickets = append(bc.tickets, t)
		n++
	}
	rest := copy(b.queue, b.queue[n:])
	clear(b.queue[rest:])
	b.queue = b.queue[:rest]
	return bc
}

// dropExpired fails the decisions of bc whose wait deadline has passed
// (errQueued: they leave unsent, so that the batch's deadline, its earliest
// decision's, is not already past) and reports whether any is left.
func (bc *batchCall) dropExpired() bool {
	now := time.Now()
	live := bc.tickets[:0]
	for _, t := range bc.tickets {
		if now.Before(t.until) {
			live = append(live, t)
			continue
		}
		t.fail(errQueued)
		bc.b.queuedOut()
		t.wake <- ticketDone
	}
	clear(bc.tickets[len(live):])
	bc.tickets = live
	return len(live) > 0
}

// queuedOut reports a decision that left the queue unsent (errQueued) to
// the breaker: as a failure, with the last call's error, when that call
// failed; else not at all (the breaker leaves errQueued out). A failed call
// counts so for at most 4 × Breaker.Failures of the decisions queued out
// behind it, so that a sidecar whose own CPU stalled (every call timing out
// at once, hundreds of decisions queued) does not weigh as hundreds of
// failures. The bound: with Breaker.Failures - 1, a Redis asleep 100 ms of
// every 110 ms (TestFaultLoad/redis-stalled) opened the breaker after 2.4 s
// or not within 3 s; with 4 × Breaker.Failures after 0.46-0.49 s, unbounded
// 0.42-0.61 s (a loaded 2-core machine). Only while the breaker is closed:
// half-open, its probes are the calls themselves.
func (b *batcher) queuedOut() {
	e := b.failing.Load()
	if e == nil || b.breaker.State() != gobreaker.StateClosed || b.held.Add(-1) < 0 {
		return
	}
	if done, err := b.breaker.cb.Allow(); err == nil {
		done(*e)
	}
}

// keys is the number of keys t's groups send.
func (t *ticket) keys() int {
	n := 0
	for _, g := range t.groups {
		n += int(g.n)
	}
	return n
}

// fail sets err on t's groups.
func (t *ticket) fail(err error) {
	for _, g := range t.groups {
		g.err = err
	}
}

// batchCall is one batch: its decisions, and one script call per slot.
type batchCall struct {
	b       *batcher
	tickets []*ticket
	calls   []scriptCall
	pipe    []redis.Cmder
	ctx     deadlineCtx
}

// deadlineCtx is a batch's context: its deadline, and a Done channel that
// closes at it, so that go-redis's own waits end there too (for a pooled
// connection, a connection being dialled, a dial retry's pause), as well as
// its reads and writes (with ContextTimeoutEnabled, the socket deadlines). It
// lives in the pooled batchCall with its timer and channel, reused from one
// batch to the next (a channel is made anew only after a deadline passed and
// closed it): context.WithDeadline would cost 4 allocations per batch, a
// lone decision's whole budget of sluice's own (BenchmarkCheck: 6
// allocations a decision with this, 10 with context.WithDeadline).
type deadlineCtx struct {
	deadline time.Time
	done     *doneChan
	timer    *time.Timer
}

// doneChan is a deadlineCtx's channel, in an object of its own: the timer's
// function holds it, not the batch (a stopped timer may stay in the
// runtime's timer heap for a while, and through the batch it would keep the
// batcher and its Limiter reachable).
type doneChan struct{ ch chan struct{} }

func (d *doneChan) close() { close(d.ch) }

func (d *deadlineCtx) Deadline() (time.Time, bool) { return d.deadline, true }
func (d *deadlineCtx) Done() <-chan struct{}       { return d.done.ch }
func (d *deadlineCtx) Value(any) any               { return nil }
func (d *deadlineCtx) Err() error {
	if time.Now().Before(d.deadline) {
		return nil
	}
	return context.DeadlineExceeded
}

// arm starts the deadline.
func (d *deadlineCtx) arm(deadline time.Time) {
	d.deadline = deadline
	if d.timer == nil {
		d.done = &doneChan{ch: make(chan struct{})}
		d.timer = time.AfterFunc(time.Until(deadline), d.done.close)
		return
	}
	d.timer.Reset(time.Until(deadline))
}

// disarm stops the timer, or, if it fired, waits for the close and makes a
// fresh channel.
func (d *deadlineCtx) disarm() {
	if !d.timer.Stop() {
		<-d.done.ch
		d.done.ch = make(chan struct{})
	}
}

func (bc *batchCall) add(t *ticket) { bc.tickets = append(bc.tickets, t) }

func (bc *batchCall) reset() {
	clear(bc.tickets)
	bc.tickets = bc.tickets[:0]
	for i := range bc.calls {
		bc.calls[i].reset()
	}
	bc.calls = bc.calls[:0]
	clear(bc.pipe)
	bc.pipe = bc.pipe[:0]
}

// run sends the batch: one call on a single node; on a Cluster master one
// per slot, in one pipeline. Its deadline is the earliest of its decisions'.
func (bc *batchCall) run() {
	l := bc.b.l
	done, err := bc.b.breaker.call()
	if err != nil { // open: no call
		for _, t := range bc.tickets {
			t.fail(err)
		}
		return
	}
	sent := time.Now()
	defer func() {
		bc.markStalled(sent)
		err := bc.outcome()
		if breakerSuccess(err) || errors.Is(err, context.Canceled) || errors.Is(err, ErrStalled) {
			bc.b.failing.Store(nil) // (a stalled process's timeout is not Redis's failure)
		} else {
			bc.b.failing.Store(&err)
			bc.b.held.Store(int32(4 * l.opts.Breaker.Failures))
		}
		done(err)
	}()
	l.batchSize.Observe(float64(len(bc.tickets)))
	until := bc.tickets[0].until
	for _, t := range bc.tickets[1:] {
		if t.until.Before(until) {
			until = t.until
		}
	}
	for _, t := range bc.tickets {
		for _, g := range t.groups {
			sc := bc.callFor(g)
			sc.add(g)
		}
	}
	for i := range bc.calls {
		bc.calls[i].build(l)
	}
	bc.ctx.arm(until)
	defer bc.ctx.disarm()
	ctx := &bc.ctx
	node := bc.b.node
	if len(bc.calls) == 1 {
		sc := &bc.calls[0]
		cmd := redis.NewIntSliceCmd(ctx, sc.args...)
		_ = node.Process(ctx, cmd)
		l.roundTrips.Add(1)
		if isNoScript(cmd.Err()) {
			sc.args[0], sc.args[1] = "eval", l.decide.src
			cmd = redis.NewIntSliceCmd(ctx, sc.args...)
			_ = node.Process(ctx, cmd)
			l.roundTrips.Add(1)
		}
		sc.result(cmd)
		return
	}
	pipe := node.Pipeline()
	cmds := bc.pipe[:0]
	for i := range bc.calls {
		cmd := redis.NewIntSliceCmd(ctx, bc.calls[i].args...)
		_ = pipe.Process(ctx, cmd)
		cmds = append(cmds, cmd)
	}
	_, _ = pipe.Exec(ctx) // errors are per command
	l.roundTrips.Add(1)
	bc.pipe = cmds
	for i := range bc.calls {
		cmd := cmds[i].(*redis.IntSliceCmd)
		if isNoScript(cmd.Err()) { // rare: each again with EVAL
			sc := &bc.calls[i]
			sc.args[0], sc.args[1] = "eval", l.decide.src
			cmd = redis.NewIntSliceCmd(ctx, sc.args...)
			_ = node.Process(ctx, cmd)
			l.roundTrips.Add(1)
		}
		bc.calls[i].result(cmd)
	}
}

// markStalled wraps the timeouts of the batch's groups of this region in
// ErrStalled where their decision's wait overlapped a stall of this process
// longer than the budget (see Limiter.stalled): the breaker does not count
// them against Redis. It does so only while the node answers: once calls
// sent over stallExcuse (from the first one after its last answer, sent at
// sent or earlier) have had no answer, a stall excuses nothing, so that a
// frozen Redis on a loaded host (every wait overlapping some stall) still
// opens the breaker.
func (bc *batchCall) markStalled(sent time.Time) {
	l := bc.b.l
	if bc.answered() {
		bc.b.silentFrom.Store(0)
	} else {
		from := sent.UnixNano()
		if !bc.b.silentFrom.CompareAndSwap(0, from) {
			if f := bc.b.silentFrom.Load(); f != 0 { // (0: another call was answered meanwhile)
				from = min(from, f)
			}
		}
		if time.Now().UnixNano()-from > int64(stallExcuse) {
			return
		}
	}
	for i := range bc.calls {
		for _, g := range bc.calls[i].groups {
			if g.err != nil && g.remote == nil {
				g.err = l.stalled(g.err, g.c.waitFrom)
			}
		}
	}
}

// answered reports whether the node answered any of the batch's calls in
// time: a result or an error reply. Results it ran too late to use (ErrLate)
// are no answer here: a Redis that runs everything late is stalled itself,
// and its timeouts are its own, whatever this process did meanwhile.
func (bc *batchCall) answered() bool {
	for i := range bc.calls {
		for _, g := range bc.calls[i].groups {
			if g.err == nil || isReply(g.err) {
				return true
			}
		}
	}
	return false
}

// outcome is the batch's round trip for the circuit breaker: its first
// call's error, or ErrLate when Redis ran every decision past its deadline
// (it answered, too slowly for any), unless this process's own stall made
// each of them late (markStalled: ErrStalled, which the breaker excludes;
// found by a fresh user: a sidecar at a quarter core, its Redis idle, once
// opened its breaker on 219 late answers).
func (bc *batchCall) outcome() error {
	late := true
	var stalled error // the first late decision's error if every one was stalled
	for i := range bc.calls {
		for _, g := range bc.calls[i].groups {
			switch {
			case g.err == nil:
				late = false
			case !errors.Is(g.err, ErrLate):
				return g.err
			case !errors.Is(g.err, ErrStalled):
				stalled = ErrLate
			case stalled == nil:
				stalled = g.err
			}
		}
	}
	if !late {
		return nil
	}
	if stalled != nil {
		return stalled
	}
	return ErrLate
}

// callFor returns the script call of g's slot (on a single node, the one call).
func (bc *batchCall) callFor(g *group) *scriptCall {
	for i := range bc.calls {
		if !bc.b.cluster || bc.calls[i].slot == g.slot {
			return &bc.calls[i]
		}
	}
	if len(bc.calls) < cap(bc.calls) {
		bc.calls = bc.calls[:len(bc.calls)+1]
	} else {
		bc.calls = append(bc.calls, scriptCall{})
	}
	sc := &bc.calls[len(bc.calls)-1]
	sc.slot = g.slot
	return sc
}

// deliver wakes the batch's decisions but the first, the sender's own.
func (bc *batchCall) deliver() {
	for _, t := range bc.tickets[1:] {
		t.wake <- ticketDone
	}
}

// scriptCall is one call of decide.lua: the groups (one slot's rules of a
// decision each) it decides, in order, its arguments, and the distinct rule
// constants it sends once (tuples; see decide.lua).
type scriptCall struct {
	slot   uint16
	groups []*group
	args   []any
	nkeys  int64
	ntup   int64
	tuples []tuple
	index  map[tuple]int32 // tuple → index, past linearTuples
}

// tuple is a rule's constants in a script call.
type tuple struct {
	alg, limit, period, burst, cost int64
	shadow, hasX                    bool
}

// linearTuples is how many tuples a call looks up by a linear scan before it
// indexes them in a map.
const linearTuples = 8

func (sc *scriptCall) reset() {
	clear(sc.groups)
	sc.groups = sc.groups[:0]
	clear(sc.args)
	sc.args = sc.args[:0]
	sc.tuples = sc.tuples[:0]
	if sc.index != nil {
		clear(sc.index)
	}
}

func (sc *scriptCall) add(g *group) { sc.groups = append(sc.groups, g) }

// tupleOf returns the index of rc's constants among sc's tuples, adding them.
func (sc *scriptCall) tupleOf(rc *ruleCall) int {
	t := tuple{alg: rc.alg, limit: rc.limit, period: rc.period, burst: rc.burst, cost: rc.charge, shadow: rc.shadow,
		hasX: rc.alg == int64(rules.FixedWindow) || rc.alg == algGCounter || rc.alg == int64(rules.Concurrency) || (rc.alg == int64(rules.TokenBucket) && rc.x != 0)}
	if len(sc.tuples) <= linearTuples {
		for i := range sc.tuples {
			if sc.tuples[i] == t {
				return i
			}
		}
		sc.tuples = append(sc.tuples, t)
		if len(sc.tuples) > linearTuples {
			if sc.index == nil {
				sc.index = make(map[tuple]int32, 64)
			}
			for i, u := range sc.tuples {
				sc.index[u] = int32(i)
			}
		}
		return len(sc.tuples) - 1
	}
	if i, ok := sc.index[t]; ok {
		return int(i)
	}
	sc.tuples = append(sc.tuples, t)
	sc.index[t] = int32(len(sc.tuples) - 1)
	return len(sc.tuples) - 1
}

// tupleIDs are the tuples' ids as script arguments ("1", "2", ...), boxed
// once; shadowArgs and hasXArgs the flags'.
var (
	tupleIDs   = makeIDs(maxBatchKeys)
	shadowArgs = [2]any{"0", "1"}
)

func makeIDs(n int) []any {
	ids := make([]any, n)
	for i := range ids {
		ids[i] = strconv.Itoa(i + 1)
	}
	return ids
}

func flagArg(b bool) any {
	if b {
		return shadowArgs[1]
	}
	return shadowArgs[0]
}

// build makes sc's EVALSHA arguments (see decide.lua): the keys, the region,
// the tuples, then each group's time, deadline and rules.
func (sc *scriptCall) build(l *Limiter) {
	sc.nkeys = 0
	for _, g := range sc.groups {
		c := g.c
		for _, i := range c.order[g.from:g.to] {
			c.rc[i].tid = int32(sc.tupleOf(&c.rc[i]))
		}
		sc.nkeys += g.n
	}
	sc.ntup = int64(len(sc.tuples))
	args := append(sc.args[:0], "evalsha", l.decide.sha, &sc.nkeys)
	for _, g := range sc.groups {
		c := g.c
		for _, i := range c.order[g.from:g.to] {
			args = append(args, &c.rc[i].key)
		}
	}
	args = append(args, l.regionArg, &sc.ntup)
	for i := range sc.tuples {
		t := &sc.tuples[i]
		args = append(args, tupleIDs[i], &t.alg, &t.limit, &t.period, &t.burst, flagArg(t.shadow), &t.cost, flagArg(t.hasX))
	}
	for _, g := range sc.groups {
		c := g.c
		args = append(args, &c.now, g.deadline, &g.n)
		for _, i := range c.order[g.from:g.to] {
			rc := &c.rc[i]
			args = append(args, tupleIDs[rc.tid])
			if sc.tuples[rc.tid].hasX {
				if rc.alg == int64(rules.Concurrency) {
					args = append(args, &rc.leaseID)
				} else {
					args = append(args, &rc.x)
				}
			}
		}
	}
	sc.args = args
}

// result reads cmd's reply into sc's groups: an error for all of them, or
// each group's outcome.
func (sc *scriptCall) result(cmd *redis.IntSliceCmd) {
	v, err := cmd.Result()
	if err != nil {
		for _, g := range sc.groups {
			g.err = err
		}
		return
	}
	for _, g := range sc.groups {
		var ok bool
		if v, ok = g.parse(v); !ok {
			err := fmt.Errorf("enforcer: malformed script reply (%d values left)", len(v))
			for _, g := range sc.groups {
				if g.err == nil {
					g.err = err
				}
			}
			return
		}
	}
}

// parse reads g's part of decide.lua's reply from the front of v and
// returns the rest.
func (g *group) parse(v []int64) ([]int64, bool) {
	if len(v) > 0 && v[0] == -1 {
		g.err = ErrLate
		return v[1:], true
	}
	n := int(g.n)
	if len(v) < 6+4*n {
		return v, false
	}
	c := g.c
	g.err = nil
	g.out = groupResult{allowed: v[0] == 1, wait: v[2], now: v[4], swait: v[5]}
	deny, shadow := v[1], v[3]
	if deny > 0 && deny <= g.n {
		g.out.deny = c.order[g.from+int(deny)-1] + 1
	}
	if shadow > 0 && shadow <= g.n {
		g.out.shadow = c.order[g.from+int(shadow)-1] + 1
	}
	p := 6
	for _, i := range c.order[g.from:g.to] {
		r := &c.rc[i].res
		r.rem, r.reset, r.window = v[p], v[p+1], v[p+3]
		r.took, r.denied = v[p+2] == 1, v[p+2] == 2
		g.out.anyTook = g.out.anyTook || r.took
		p += 4
	}
	if !g.out.allowed && g.out.deny == 0 {
		return v, false
	}
	return v[p:], true
}

// nodeBatchers are a Cluster's batchers, one per master address, in a
// copy-on-write map (as nodeBreakers).
type nodeBatchers struct {
	m       atomic.Pointer[map[string]*batcher]
	mu      sync.Mutex
	l       *Limiter
	breaker func(addr string) *breaker // the master's
}

func (nb *nodeBatchers) get(node *redis.Client) *batcher {
	addr := node.Options().Addr
	if m := nb.m.Load(); m != nil {
		if b, ok := (*m)[addr]; ok && b.node == node {
			return b
		}
	}
	nb.mu.Lock()
	defer nb.mu.Unlock()
	old := map[string]*batcher{}
	if m := nb.m.Load(); m != nil {
		if b, ok := (*m)[addr]; ok && b.node == node {
			return b
		}
		old = *m
	}
	m := make(map[string]*batcher, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	b := newBatcher(nb.l, node, true, nb.breaker(addr))
	m[addr] = b
	nb.m.Store(&m)
	return b
}
