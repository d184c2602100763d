package enforcer

import (
	"context"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/rules"
)

// adaptive is the controller of adaptive rules (rules.Rule.AdaptiveFloor):
// one factor in [minFactor, 1] that scales their limits, following the
// health of the backend they protect as seen in its responses (status and
// latency, from the HTTP middleware or the sidecar's access-log status
// join). It is AIMD, additive increase and multiplicative decrease, as TCP
// congestion avoidance (Jacobson 1988, "Congestion avoidance and
// control"; Chiu and Jain 1989 show it converges to fairness) and Netflix's
// concurrency-limits AIMDLimit apply it: at the end of every interval
// (Options.Adaptive.Interval) with at least Adaptive.MinSamples responses, a
// 5xx share above Adaptive.ErrorRate by more than two binomial standard
// deviations (or, when set, a mean latency above
// Adaptive.Latency) multiplies the factor by Adaptive.Decrease; a healthy
// interval adds Adaptive.Increase, up to 1. An interval with fewer
// responses leaves a factor of 1 alone and says so once; a lower factor
// rises as in a healthy interval, because the shedding a low factor drives
// may itself starve the controller of responses. Each rule applies
// max(factor, its floor).
//
// Intervals are on the responses' clock (event time in replays): a step is
// taken by the first observation, or Adapt call, past the interval's end.
// The factor the controller moves is this enforcer's own; rules apply the
// region's, the mean of its enforcers' own factors shared through Redis at
// every Refresh (see shareAdaptive), when one is fresh.
type adaptive struct {
	factor atomic.Uint64 // math.Float64bits: this enforcer's own factor
	// The region's factor (math.Float64bits; 0: none yet), the mean of its
	// enforcers' own factors as shared through Redis (see Limiter.Refresh),
	// how many shared it, and when it was read (Unix ns).
	region, regionAt atomic.Uint64
	regionN          atomic.Int64

	samples, errors atomic.Int64
	latency         atomic.Int64 // sum of the interval's latencies, ns
	end             atomic.Int64 // Unix ns at which the interval ends; 0: not started

	// enabled: the rule set has adaptive rules or shedding (which reads
	// the factor as a load); else responses are not judged, nor logged.
	enabled atomic.Bool

	mu     sync.Mutex // steps
	silent bool       // the last interval had too few responses
	o      *Options
	log    *slog.Logger

	lastSamples     atomic.Int64
	downs, ups      atomic.Uint64
	lastErrorPermil atomic.Int64
}

// minFactor bounds the factor below: a rule's own floor is usually higher.
const minFactor = 0.01

func newAdaptive(o *Options) *adaptive {
	a := &adaptive{o: o, log: o.Logger}
	a.factor.Store(math.Float64bits(1))
	return a
}

// own returns this enforcer's own factor, which its controller moves.
func (a *adaptive) own() float64 { return math.Float64frombits(a.factor.Load()) }

// Factor returns the factor adaptive rules are scaled by now, in (0, 1]:
// the region's, read within the last 3 intervals (wall clock) from more
// than one enforcer, else this enforcer's own (a region of one enforcer,
// as a replay's, follows its own at once).
func (a *adaptive) Factor() float64 {
	if r := a.region.Load(); r != 0 && a.regionN.Load() > 1 && time.Now().UnixNano()-int64(a.regionAt.Load()) <= 3*int64(max(a.o.Adaptive.Interval, time.Second)) {
		return math.Float64frombits(r)
	}
	return a.own()
}

// forRule is the factor rule r applies: the controller's, never below its
// floor.
func (a *adaptive) forRule(r *rules.Rule) float64 { return max(a.Factor(), r.AdaptiveFloor) }

// observe counts one response of the backend at now.
func (a *adaptive) observe(now time.Time, status int, latency time.Duration) {
	a.adapt(now)
	a.samples.Add(1)
	if status >= 500 {
		a.errors.Add(1)
	}
	if latency > 0 {
		a.latency.Add(int64(latency))
	}
}

// adapt closes the interval if now is past its end: it judges the
// interval's responses and moves the factor.
func (a *adaptive) adapt(now time.Time) {
	ns := now.UnixNano()
	end := a.end.Load()
	if end != 0 && ns < end {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	end = a.end.Load()
	switch {
	case end == 0:
		a.end.Store(ns + int64(a.o.Adaptive.Interval))
		return
	case ns < end:
		return // another goroutine stepped
	}
	n, e, lat := a.samples.Swap(0), a.errors.Swap(0), a.latency.Swap(0)
	// The next interval starts where this one ended, or now if whole
	// intervals passed without a step (no responses, no Adapt).
	next := end + int64(a.o.Adaptive.Interval)
	if next <= ns {
		next = ns + int64(a.o.Adaptive.Interval)
	}
	a.end.Store(next)
	a.lastSamples.Store(n)
	old := a.own()
	if n < int64(a.o.Adaptive.MinSamples) {
		if !a.silent {
			a.silent = true
			a.log.Info("adaptive limits: too few response statuses to judge the backend: a factor of 1 stays, a lower one rises as when healthy",
				"factor", old, "statuses", n, "min_statuses", a.o.Adaptive.MinSamples, "interval", a.o.Adaptive.Interval)
		}
		// No evidence of harm. Below 1, the factor (and the shedding it
		// drives, see Limiter.Load) may itself be what starves the
		// controller of responses: rise, as TCP probes after a loss, and
		// let the responses that brings judge again.
		if old < 1 {
			a.factor.Store(math.Float64bits(min(1, old+a.o.Adaptive.Increase)))
			a.ups.Add(1)
		}
		return
	}
	if a.silent {
		a.silent = false
		a.log.Info("adaptive limits: response statuses arrive again", "statuses", n, "factor", old)
	}
	rate := float64(e) / float64(n)
	a.lastErrorPermil.Store(int64(rate * 1000))
	mean := time.Duration(lat / n)
	slow := a.o.Adaptive.Latency > 0 && mean > a.o.Adaptive.Latency
	f := old
	why := "healthy"
	// Above the target by more than chance: a one-sided binomial test at
	// two standard deviations, so that one error among a dozen responses
	// (8% against a target of 5%) does not cut.
	target := a.o.Adaptive.ErrorRate
	over := float64(e) > target*float64(n)+2*math.Sqrt(target*(1-target)*float64(n))
	switch {
	case over:
		f, why = max(minFactor, old*a.o.Adaptive.Decrease), "error rate above target"
	case slow:
		f, why = max(minFactor, old*a.o.Adaptive.Decrease), "mean latency above target"
	default:
		f = min(1, old+a.o.Adaptive.Increase)
	}
	if f == old {
		return
	}
	a.factor.Store(math.Float64bits(f))
	if f < old {
		a.downs.Add(1)
	} else {
		a.ups.Add(1)
	}
	a.log.Info("adaptive limits: factor changed", "from", old, "to", f, "why", why,
		"statuses", n, "errors_5xx", e, "error_rate", rate, "target_error_rate", a.o.Adaptive.ErrorRate,
		"mean_latency", mean, "target_latency", a.o.Adaptive.Latency, "interval_end", time.Unix(0, end).UTC())
}

// register adds the controller's metrics to reg.
func (a *adaptive) register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_enforcer_adaptive_factor",
			Help: "The factor adaptive rules' limits are scaled by (AIMD on the backend's responses), in (0, 1]; each rule applies at least its floor.",
		}, a.Factor),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_enforcer_adaptive_own_factor",
			Help: "This enforcer's own adaptive factor, from the responses it saw; the region's factor (sluice_enforcer_adaptive_factor) is the mean of its enforcers' own.",
		}, a.own),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_enforcer_adaptive_region_enforcers",
			Help: "Enforcers whose own adaptive factor made the region's at the last refresh (0: none shared, the own factor applies).",
		}, func() float64 { return float64(a.regionN.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_enforcer_adaptive_statuses",
			Help: "Response statuses the adaptive controller judged in its last interval (below Adaptive.MinSamples the factor stays).",
		}, func() float64 { return float64(a.lastSamples.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_enforcer_adaptive_error_ratio",
			Help: "The 5xx share of the responses of the adaptive controller's last judged interval.",
		}, func() float64 { return float64(a.lastErrorPermil.Load()) / 1000 }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "sluice_enforcer_adaptive_changes_total",
			Help:        "Changes of the adaptive factor, by direction.",
			ConstLabels: prometheus.Labels{"direction": "down"},
		}, func() float64 { return float64(a.downs.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "sluice_enforcer_adaptive_changes_total",
			Help:        "Changes of the adaptive factor, by direction.",
			ConstLabels: prometheus.Labels{"direction": "up"},
		}, func() float64 { return float64(a.ups.Load()) }),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// ObserveResponse reports one response of the backend the limiter protects
// (its HTTP status and how long it took; 0 if unknown) at now, for adaptive
// rules. The HTTP middleware reports every response it serves; the sidecar
// reports what Envoy's access log says (see sidecar.StatusJoinOptions).
//
// Responses are judged only while the rule set has adaptive rules or
// shedding: otherwise the factor would move, and log, for nothing.
func (l *Limiter) ObserveResponse(now time.Time, status int, latency time.Duration) {
	if l.adaptive.enabled.Load() {
		l.adaptive.observe(now, status, latency)
	}
}

// Adapt closes the adaptive controller's interval if now is past its end,
// as a response would: callers with no responses (a silent backend) call it
// so that the controller says so. Refresh calls it.
func (l *Limiter) Adapt(now time.Time) {
	if l.adaptive.enabled.Load() {
		l.adaptive.adapt(now)
	}
}

// enable turns the controller on for a rule set with adaptive rules or
// shedding, off (and its factor back to 1) for one without.
func (a *adaptive) enable(s *rules.Set) {
	on := s.Shedding != nil || slices.ContainsFunc(s.Rules, (*rules.Rule).Adaptive)
	if !on {
		a.factor.Store(math.Float64bits(1))
	}
	a.enabled.Store(on)
}

// AdaptiveFactor returns the factor adaptive rules' limits are scaled by
// (each rule applies at least its floor).
func (l *Limiter) AdaptiveFactor() float64 { return l.adaptive.Factor() }

// share records this enforcer's own factor in the region's Redis and takes
// the region's, the mean of the factors its enforcers recorded within 3
// intervals. Only when the rule set has adaptive rules; an error keeps the
// factor in force (the own factor once the region's is stale).
func (l *Limiter) shareAdaptive(ctx context.Context, set *rules.Set, now time.Time) {
	if set == nil || !slices.ContainsFunc(set.Rules, (*rules.Rule).Adaptive) {
		return
	}
	a := l.adaptive
	maxAge := 3 * max(l.opts.Adaptive.Interval, time.Second)
	f, n, err := l.store.PutAdaptive(ctx, l.opts.Instance, a.own(), now, maxAge)
	if err != nil {
		return
	}
	old := a.Factor()
	a.region.Store(math.Float64bits(f))
	a.regionAt.Store(uint64(time.Now().UnixNano()))
	a.regionN.Store(int64(n))
	if math.Abs(f-old) >= 0.01 {
		l.opts.Logger.Info("adaptive limits: the region's factor changed", "from", old, "to", f, "enforcers", n, "own", a.own())
	}
}
