package enforcer

import (
	"context"
	_ "embed"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

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
		l.kickDebts()
	}
}

// kickDebts charges the debts in a goroutine of their own, at most one at
// a time and one start each 10 ms: the decision that found Redis answering
// does not wait for it. It ends within RefundBudget.
func (l *Limiter) kickDebts() {
	now := time.Now().UnixNano()
	last := l.dm.lastKick.Load()
	if l.charging.Load() || now-last < int64(10*time.Millisecond) || !l.dm.lastKick.CompareAndSwap(last, now) {
		return
	}
	go l.chargeDebts(context.Background(), false, l.opts.RefundBudget)
}

// chargeDebts charges the fallback's debts to Redis (charge.lua, one call
// per key, pipelined, within the duration given: RefundBudget, or the
// budget for a decision of the breaker's ramp), unless the breaker is
// open. A charge that fails is owed again. One charge runs at a time: with
// wait (Refresh, the ramp) it waits for one under way to end (within its
// RefundBudget), then charges what is still owed; without (kickDebts) it
// leaves it.
func (l *Limiter) chargeDebts(ctx context.Context, wait bool, within time.Duration) {
	if l.known == nil || l.known.owing.Load() == 0 || l.BreakerOpen() {
		return
	}
	if wait {
		l.chargeMu.Lock()
	} else if !l.chargeMu.TryLock() {
		return
	}
	l.charging.Store(true)
	defer func() { l.charging.Store(false); l.chargeMu.Unlock() }()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), within)
	defer cancel()
	var buf [256]debt
	for range 16 { // at most 4 096 keys a call; the rest at the next
		ds := l.known.debts(buf[:0])
		if len(ds) == 0 {
			return
		}
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
		failed := false
		for i := range ds {
			ok := cmds[i].Err() == nil
			l.known.settle(&ds[i], ok)
			if ok {
				l.dm.charged.Add(uint64(ds[i].units))
			} else {
				failed = true
				l.dm.chargeErrs.Add(1)
			}
		}
		if failed {
			return
		}
	}
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
		"instances", l.instances.get(), "instances_from", l.instances.source(), "headroom", l.opts.Headroom)
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
			Help: "Keys whose last Redis answer the fallback remembers (at most Options.RememberedKeys); 0 after a start with Redis down.",
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
			Help: "Units the fallback granted without Redis that will never be charged: their key was evicted from the remembered state (Options.RememberedKeys) first.",
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
