package enforcer

import (
	"cmp"
	"context"
	_ "embed"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"

	"github.com/sluice-rl/sluice/rules"
)

//go:embed charge.lua
var chargeLua string

// chargeScript is charge.lua, with its SHA-1 for EVALSHA.
var chargeScript = redis.NewScript(chargeLua)

// degradedMetrics count what the remembered state and the fallback's debts
// do (see lastKnown), and the heartbeats.
type degradedMetrics struct {
	charged, chargeErrs atomic.Uint64 // debt units charged to Redis; charges that failed (owed again)
	heartbeatBad        prometheus.Counter
	lastKick            atomic.Int64 // Unix ns of the last asynchronous charge started
	chargeTimedOut      atomic.Int64 // Unix ns of the last charge that timed out
	chargeErrLog        atomic.Int64 // Unix ns of the last log line of a failed charge
	answeredAt          atomic.Int64 // Unix ns of the last Redis answer while something was owed
	warned              atomic.Bool  // the "no remembered state" notice was logged
}

// rememberAnswers keeps what Redis said of each of the call's keys (the
// remembered state) and, when the fallback owes Redis units, starts a charge
// of its debts (Redis is answering). The one place a Redis answer is
// recorded.
func (l *Limiter) rememberAnswers(c *call) {
	if l.known == nil {
		return
	}
	answered := false
	for gi := range c.groups {
		g := &c.groups[gi]
		if g.err != nil {
			continue
		}
		answered = true
		for _, i := range c.order[g.from:g.to] {
			rc := &c.rc[i]
			if rc.alg == int64(rules.Concurrency) {
				continue
			}
			l.known.record(rc.key.b, knownOf(rc), rc.res.rem, rc.res.reset, g.out.now, c.sentAt)
		}
	}
	// Only after an answer: a charge kicked by a decision Redis did not
	// answer fails too, and holds the debts meanwhile (a loaded make test
	// found the debts of an outage in flight, unlisted, and Refresh, finding
	// a charge under way, charged nothing).
	if answered && l.known.owing.Load() > 0 {
		l.dm.answeredAt.Store(time.Now().UnixNano())
		l.kickDebts()
	}
}

// kickDebts charges the debts in a goroutine of their own, at most one at
// a time and one start each 10 ms: the decision that found Redis answering
// does not wait for it. It ends within RefundBudget.
func (l *Limiter) kickDebts() {
	now := time.Now().UnixNano()
	last := l.dm.lastKick.Load()
	if len(l.chargeSem) > 0 || now-last < int64(10*time.Millisecond) || !l.dm.lastKick.CompareAndSwap(last, now) {
		return
	}
	go l.chargeDebts(context.Background(), false)
}

// chargeDebts charges the fallback's debts to Redis (charge.lua, one call
// per key, pipelined, within RefundBudget), unless the breaker is open. A
// charge that fails is owed again. One charge runs at a time (chargeSem):
// with wait (Refresh) it waits for one under way to end (within its
// RefundBudget), then charges what is still owed; without (kickDebts) it
// leaves it.
func (l *Limiter) chargeDebts(ctx context.Context, wait bool) {
	if l.known == nil || l.known.owing.Load() == 0 || l.BreakerOpen() {
		return
	}
	if wait {
		l.chargeSem <- struct{}{}
	} else {
		select {
		case l.chargeSem <- struct{}{}:
		default:
			return
		}
	}
	defer func() { <-l.chargeSem }()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.opts.RefundBudget)
	defer cancel()
	var buf [256]debt
	for range 16 { // at most 4 096 keys a call; the rest at the next
		ds := l.known.debts(buf[:0])
		if len(ds) == 0 || l.sendCharges(ctx, ds) != nil {
			return
		}
	}
}

// sendCharges sends ds's charges (one charge.lua call each, pipelined; EVAL
// for those Redis answered NOSCRIPT) and settles each: charged, or owed
// again. It returns the first failure.
func (l *Limiter) sendCharges(ctx context.Context, ds []debt) (err error) {
	cmds := make([]*redis.Cmd, len(ds))
	hostNow := l.opts.Clock().UnixMilli() // the fallback's clock, which timed the grants
	send := func(sha bool) {
		pipe := l.rdb.Pipeline()
		for i := range ds {
			if sha || isNoScript(cmds[i].Err()) {
				d := &ds[i]
				keys, args := []string{d.key}, []any{d.now, d.rule.alg, d.rule.limit, d.rule.period, d.rule.burst, d.units, d.ttl}
				if c := d.curve; c.set && d.rule.alg == int64(rules.TokenBucket) {
					// The grants' curve, its times as ages before the
					// charge (on the caller's clock, else on this host's:
					// Redis's clock may differ from it, a duration not).
					ref := grantTime(hostNow, d.now)
					args = append(args, c.a, c.b, max(0, ref-c.t0), max(0, ref-c.tl))
				}
				if sha {
					cmds[i] = chargeScript.EvalSha(ctx, pipe, keys, args...)
				} else {
					cmds[i] = chargeScript.Eval(ctx, pipe, keys, args...)
				}
			}
		}
		_, _ = pipe.Exec(ctx) // errors are per command
		l.roundTrips.Add(1)
	}
	send(true)
	for _, cmd := range cmds {
		if isNoScript(cmd.Err()) {
			send(false)
			break
		}
	}
	for i := range ds {
		e := cmds[i].Err()
		l.known.settle(&ds[i], e == nil)
		if e == nil {
			l.dm.charged.Add(uint64(ds[i].units))
		} else {
			err = cmp.Or(err, e)
			l.dm.chargeErrs.Add(1)
		}
	}
	if err != nil {
		l.chargeFailed(err)
	}
	return err
}

// chargeFailed notes a failed charge: a timeout's time (see chargeFirst),
// and a log line at most once per logEvery (found by a fresh user: an ACL
// user without INCRBY failed every fixed window's charge, retried each
// second for ever, with nothing said).
func (l *Limiter) chargeFailed(err error) {
	now := time.Now().UnixNano()
	c := ClassifyRedisError(err)
	if c == CauseTimeout {
		l.dm.chargeTimedOut.Store(now)
	}
	last := l.dm.chargeErrLog.Load()
	if now-last <= int64(logEvery) || !l.dm.chargeErrLog.CompareAndSwap(last, now) {
		return
	}
	args := []any{"cause", c.String(), "err", err, "debt_keys", l.known.owing.Load()}
	if cmd := NoPermCommand(err); c == CauseNoPerm && cmd != "" { // a script's refusal does not name it
		args = append(args, "command", cmd)
	}
	msg := "charging the fallback's debts to Redis failed: owed again, and charged again after Redis's next answer (sluice_enforcer_debt_charge_errors_total)"
	if h := CauseHint(c); h != "" {
		msg += ": " + h
	}
	l.opts.Logger.Warn(msg, args...)
}

// chargeFirst charges the debts of c's first local groups' keys (this
// region's; see owesFor) before the decision is sent, so that Redis decides
// them knowing what the fallback granted: a decision that reached Redis
// first wrote the key, and the charge, finding the key written after its
// first grant, could not apply the grants at their times and charged them
// all at once (a fresh user: a client at 7 checks/s under a 10/s bucket was
// denied for 6.5 s after an outage; the charge, kicked by the decision's
// answer, raced it on another connection and, on a restarted Redis, lost
// it to NOSCRIPT).
//
// Within the budget, waiting for a charge under way (chargeSem) included,
// and as the circuit breaker lets it: with the breaker closed, unless a
// charge timed out since Redis last answered (a stalled Redis: the decision
// does not wait a budget for it first); half-open, as one of its probes (a
// charge that fails opens it again; with the probes out none is made, so
// the cool-downs of an outage stay at Breaker.Probes round trips each); open,
// not at all. On a Cluster, only with every master's breaker closed.
func (l *Limiter) chargeFirst(ctx context.Context, c *call, local int) {
	state := l.breaker.State()
	if l.cluster {
		if l.nodes.worst() != gobreaker.StateClosed {
			return
		}
		state = gobreaker.StateClosed
	}
	switch {
	case state == gobreaker.StateOpen:
		return
	case state == gobreaker.StateClosed && l.dm.chargeTimedOut.Load() > l.dm.answeredAt.Load():
		return
	}
	timer := time.NewTimer(l.opts.Budget)
	defer timer.Stop()
	select {
	case l.chargeSem <- struct{}{}:
	case <-timer.C:
		return
	case <-ctx.Done():
		return
	}
	defer func() { <-l.chargeSem }()
	var buf [8]debt
	ds := buf[:0]
	for gi := range c.groups[:local] {
		g := &c.groups[gi]
		for _, i := range c.order[g.from:g.to] {
			if rc := &c.rc[i]; chargeable(rc.alg) {
				ds = l.known.debtOf(rc.key.b, ds)
			}
		}
	}
	if len(ds) == 0 { // charged meanwhile (the charge it waited for)
		return
	}
	done := func(error) {}
	if state == gobreaker.StateHalfOpen {
		d, err := l.breaker.call()
		if err != nil { // the probes are out: owed again
			for i := range ds {
				l.known.settle(&ds[i], false)
			}
			return
		}
		done = d
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.opts.Budget)
	defer cancel()
	done(l.sendCharges(cctx, ds))
}

// noteUnremembered logs once that the fallback decides with no remembered
// state: Redis has answered no decision of this enforcer yet (it may have
// answered its start checks and probes: a fresh user read "not answered
// since started" after a restart of Redis that lost the ACL user).
func (l *Limiter) noteUnremembered() {
	if l.known != nil && l.known.any.Load() || l.dm.warned.Load() || !l.dm.warned.CompareAndSwap(false, true) {
		return
	}
	l.opts.Logger.Warn("deciding by the failure modes with no remembered Redis state (Redis has answered no decision of this enforcer yet): fail-open rules start from full local buckets of burst × Headroom ÷ instances",
		"instances", l.instances.get(), "instances_from", l.instances.source(), "headroom", l.opts.Fallback.Headroom)
}

// registerDegraded adds the remembered state's, the debts' and the
// instance count's metrics to reg.
func (l *Limiter) registerDegraded(reg prometheus.Registerer) error {
	m := &l.dm
	m.heartbeatBad = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_enforcer_heartbeat_errors_total",
		Help: "Heartbeats (the region's enforcer count, at every refresh) that Redis did not answer; the count learned last is kept.",
	})
	from := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_enforcer_fallback_rules_total",
		Help: "Fail-open rules the local fallback decided, by what it started from: remembered (Redis's last answer for the key) or bucket (a key it did not know: a full local bucket).",
	}, []string{"from"})
	l.local.fromMemory, l.local.fromBucket = from.WithLabelValues("remembered"), from.WithLabelValues("bucket")
	if reg == nil {
		return nil
	}
	known := func(f func(k *lastKnown) float64) func() float64 {
		return func() float64 {
			if l.known == nil {
				return 0
			}
			return f(l.known)
		}
	}
	for _, c := range []prometheus.Collector{
		m.heartbeatBad, from,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_enforcer_remembered_keys",
			Help: "Keys whose last Redis answer the fallback remembers (at most Options.Fallback.RememberedKeys); 0 after a start with Redis down.",
		}, known(func(k *lastKnown) float64 { return float64(k.used.Load()) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_enforcer_debt_keys",
			Help: "Keys for which the fallback granted units that Redis has not counted yet (debts, charged when it answers).",
		}, known(func(k *lastKnown) float64 { return float64(k.owing.Load()) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_enforcer_debt_units_charged_total",
			Help: "Units the fallback granted without Redis that were charged to Redis afterwards.",
		}, func() float64 { return float64(m.charged.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_enforcer_debt_units_lost_total",
			Help: "Units the fallback granted without Redis that will never be charged: their key was evicted from the remembered state (Options.Fallback.RememberedKeys) first.",
		}, known(func(k *lastKnown) float64 { return float64(k.lost.Load()) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_enforcer_debt_charge_errors_total",
			Help: "Charges of a key's debt that failed (owed again, for the next charge).",
		}, func() float64 { return float64(m.chargeErrs.Load()) }),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return l.instances.register(reg)
}
