package enforcer

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/rules"
)

// loadSignals are the inputs of priority load shedding (rules.Shedding):
// the work in flight in the backend this limiter protects, over
// Options.Shedding.Capacity, and a load its caller measures (SetBackendLoad).
// The load is the largest of those and the backend's health (see Load).
// All fields are atomics: reading the load allocates nothing.
type loadSignals struct {
	work    atomic.Int64  // requests in flight (BeginWork, EndWork)
	backend atomic.Uint64 // math.Float64bits of the caller's load
	shedN   [rules.NumPriorities]atomic.Uint64
	unknown atomic.Uint64 // requests whose priority entry named no priority
}

// BeginWork counts a request the backend starts serving, for the in-flight
// load signal (Options.Shedding.Capacity); call EndWork when it ends. The HTTP
// middleware does both around the handler.
func (l *Limiter) BeginWork() { l.load.work.Add(1) }

// EndWork counts a request the backend finished serving (see BeginWork).
func (l *Limiter) EndWork() { l.load.work.Add(-1) }

// SetBackendLoad sets the load its caller measures for the backend (a
// number ≥ 0 in the units of rules.Shedding's thresholds: 1 is full; NaN
// and negative values count as 0), for example from its error rate or
// latency. It stays until set again.
func (l *Limiter) SetBackendLoad(v float64) {
	if !(v > 0) {
		v = 0
	}
	l.load.backend.Store(math.Float64bits(v))
}

// Load returns the load that priority shedding compares with its
// thresholds: the largest of the work in flight over Options.Shedding.Capacity
// (0 when Shedding.Capacity is 0), the backend load last set, and the backend's
// health as the adaptive controller judges it from its responses, 1 − the
// adaptive factor (0 while healthy; at most 0.99, so critical requests,
// at a threshold of 1, are never shed for health alone).
func (l *Limiter) Load() float64 {
	v := max(math.Float64frombits(l.load.backend.Load()), 1-l.adaptive.Factor())
	if c := l.opts.Shedding.Capacity; c > 0 {
		v = max(v, float64(l.load.work.Load())/float64(c))
	}
	return v
}

// shed decides whether the request is refused by priority load shedding (at
// load, the limiter's Load; refused requests are told to retry after retry),
// before any rule is checked (so that it charges nothing): its priority
// is its PriorityKey entry (the first part that carries one), else its
// route's default, else the default. A shed request is denied with
// ReasonShed on PathShed and a Retry-After of Options.Shedding.RetryAfter.
func (ls *loadSignals) shed(sh *rules.Shedding, load float64, retry time.Duration, parts []Part, clock func() time.Time, d *Decision) bool {
	if load < sh.Thresholds[rules.Sheddable] {
		return false // below every threshold: no need to find the priority
	}
	var given, route string
	for pi := range parts {
		if given == "" {
			given = parts[pi].Descriptors.Custom(sh.PriorityKey)
		}
		if route == "" {
			route = parts[pi].Descriptors[rules.KeyRoute]
		}
	}
	p, ok := sh.Priority(given, route)
	if !ok {
		ls.unknown.Add(1)
	}
	if !sh.Sheds(p, load) {
		return false
	}
	ls.shedN[p].Add(1)
	d.Now = clock()
	d.Outcome, d.Reason, d.Path, d.Priority = decision.Denied, decision.ReasonShed, decision.PathShed, p
	d.Wait, d.RetryAfter = retry, retryAfter(retry)
	return true
}

// registerLoad adds the shedding metrics to reg.
// register registers the load signals' metrics; load is the limiter's Load.
func (ls *loadSignals) register(reg prometheus.Registerer, load func() float64) error {
	if reg == nil {
		return nil
	}
	cs := []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_enforcer_load",
			Help: "The load priority shedding compares with its thresholds: work in flight over Shedding.Capacity, or the backend load set, whichever is larger (1 is full).",
		}, load),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_enforcer_work_in_flight",
			Help: "Requests the backend is serving, as counted by BeginWork and EndWork (the HTTP middleware).",
		}, func() float64 { return float64(ls.work.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_enforcer_priority_unknown_total",
			Help: "Requests whose priority entry named no priority (critical, normal, sheddable): given their route's default, else the default. Looked up only while the load is at or above the lowest threshold.",
		}, func() float64 { return float64(ls.unknown.Load()) }),
	}
	for p := rules.Critical; p < rules.NumPriorities; p++ {
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "sluice_enforcer_load_shed_total",
			Help:        "Requests refused by priority load shedding (503, nothing charged), by priority.",
			ConstLabels: prometheus.Labels{"priority": p.String()},
		}, func() float64 { return float64(ls.shedN[p].Load()) }))
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
