package enforcer

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sony/gobreaker/v2"
	"golang.org/x/time/rate"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

// metrics are the limiter's Prometheus metrics: atomic counters and one
// histogram, touched without allocating on the request path.
type metrics struct {
	decisions   ruleCounters
	degradedN   prometheus.Counter
	wouldDeny   [decision.NumPaths]prometheus.Counter
	redisErrs   *redisErrors // by cause, with their log lines
	redisTime   prometheus.Histogram
	batchSize   prometheus.Histogram
	roundTrips  atomic.Uint64
	trips       atomic.Uint64 // circuit breakers opened (every node's and home region's)
	shed        atomic.Uint64 // decisions shed (ErrOverloaded): decided by the failure modes
	lateRetries atomic.Uint64 // script calls sent again after a late answer
	// dynLeftOut counts dynamic rules left out of a request past MaxRules
	// (see capDynamic), and dynLeftOutLog says so at most once a minute.
	dynLeftOut    atomic.Uint64
	dynLeftOutLog rate.Sometimes
	queued        atomic.Uint64 // decisions that waited for a place (MaxInFlight)
	queueTime     prometheus.Histogram
	leaseHits     atomic.Uint64
	denyHits      atomic.Uint64
	refundOK      prometheus.Counter
	refundBad     prometheus.Counter
	refreshOK     prometheus.Counter
	refreshBad    prometheus.Counter
	dynDropped    prometheus.Gauge
	keyMisses     atomic.Uint64
	keyErrors     atomic.Uint64
	gcDropped     atomic.Uint64
	movedN        atomic.Uint64
	ipRefused     atomic.Uint64
	ipNames       atomic.Uint64
	// leases removed after a call that got no answer (see dropSentLeases)
	leaseDropOK, leaseDropBad prometheus.Counter
}

// maxRuleLabels bounds the rule label's values: rules beyond it (many
// dynamic rules over a long run) are counted as "other".
const maxRuleLabels = 1000

// ruleCounters are decisions_total's counters by rule and outcome, looked up
// by rule id in a copy-on-write map (no lock, no allocation once a rule has
// been seen).
type ruleCounters struct {
	vec *prometheus.CounterVec
	m   atomic.Pointer[map[string]*[decision.NumOutcomes]prometheus.Counter]
	mu  sync.Mutex
}

func (rc *ruleCounters) get(rule string) *[decision.NumOutcomes]prometheus.Counter {
	if c, ok := (*rc.m.Load())[rule]; ok {
		return c
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	old := *rc.m.Load()
	if c, ok := old[rule]; ok {
		return c
	}
	if len(old) >= maxRuleLabels {
		rule = "other"
		if c, ok := old[rule]; ok {
			return c
		}
	}
	c := new([decision.NumOutcomes]prometheus.Counter)
	for o := decision.Allowed; o <= decision.DegradedClosed; o++ {
		c[o] = rc.vec.WithLabelValues(o.String(), rule)
	}
	m := make(map[string]*[decision.NumOutcomes]prometheus.Counter, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[rule] = c
	rc.m.Store(&m)
	return c
}

func (l *Limiter) newMetrics(reg prometheus.Registerer) error {
	m := &l.metrics
	m.decisions.vec = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_enforcer_decisions_total",
		Help: "Decisions by outcome and rule (the rule that denied, else the binding one; \"\" when none matched).",
	}, []string{"outcome", "rule"})
	empty := map[string]*[decision.NumOutcomes]prometheus.Counter{}
	m.decisions.m.Store(&empty)
	m.degradedN = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_enforcer_degraded_decisions_total",
		Help: "Decisions taken by the failure modes because Redis failed or the breaker was open: alert on its rate.",
	})
	wouldDeny := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_enforcer_would_deny_total",
		Help: "Requests a shadow-mode rule would have denied, by the path the decision took.",
	}, []string{"path"})
	for p := range decision.NumPaths {
		m.wouldDeny[p] = wouldDeny.WithLabelValues(decision.Path(p).String())
	}
	redisErrs := m.newRedisErrors()
	m.redisTime = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "sluice_enforcer_redis_duration_seconds",
		Help:    "Time of a decision's Redis round trip, failed ones included.",
		Buckets: []float64{.0001, .00025, .0005, .001, .002, .005, .01, .025, .1, 1},
	})
	m.batchSize = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "sluice_enforcer_redis_batch_decisions",
		Help:    "Decisions per batched script call to a Redis node (see Options.NoPipeline): what queued while the node's connections had a call in flight.",
		Buckets: []float64{1, 2, 4, 8, 16, 32, 64},
	})
	breakerState := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_enforcer_breaker_state", Help: "The Redis circuit breaker (on a Cluster, the most open of the masters' breakers): 0 closed, 1 half-open, 2 open.",
	}, func() float64 { return float64(max(l.breaker.State(), l.nodes.worst())) })
	homeBreaker := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_enforcer_home_breaker_state", Help: "The most open of the home regions' circuit breakers (pinned rules, checked in their home region's Redis): 0 closed, 1 half-open, 2 open; 0 without home regions.",
	}, func() float64 {
		worst := gobreaker.StateClosed
		for _, h := range l.homes.remote {
			if h != nil {
				worst = max(worst, h.breaker.State())
			}
		}
		return float64(worst)
	})
	counterFunc := func(name, help string, v *atomic.Uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v.Load()) })
	}
	ref := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_enforcer_refunds_total", Help: "Refunds of reservations in other Cluster slots after a deny, by result.",
	}, []string{"result"})
	m.refundOK, m.refundBad = ref.WithLabelValues("ok"), ref.WithLabelValues("error")
	drops := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_enforcer_lease_removals_total", Help: "Concurrency leases removed after a script call that got no answer (it may have committed just before its deadline), by result.",
	}, []string{"result"})
	m.leaseDropOK, m.leaseDropBad = drops.WithLabelValues("ok"), drops.WithLabelValues("error")
	refresh := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_enforcer_control_refreshes_total", Help: "Loads of dynamic rules, shares and hot keys from Redis, by result.",
	}, []string{"result"})
	m.refreshOK, m.refreshBad = refresh.WithLabelValues("ok"), refresh.WithLabelValues("error")
	m.dynDropped = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sluice_enforcer_dynamic_rules_refused", Help: "Dynamic rules in Redis left out because they could loosen a static rule (a static rule's id, or replaces).",
	})
	dynActive := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_enforcer_dynamic_rules", Help: "Dynamic rules in force (0 while the kill switch is on).",
	}, func() float64 {
		if d := l.state.Load().dyn; d != nil {
			return float64(len(d.Rules))
		}
		return 0
	})
	overCap := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_enforcer_dynamic_rules_over_cap", Help: "Active dynamic rules in Redis left out because there are more than the cap (Options.DynamicCap).",
	}, func() float64 { return float64(l.state.Load().ctl.OverCap) })
	killed := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_enforcer_dynamic_rules_killed", Help: "1 while the dynamic-rule kill switch (in Redis, or Options.NoDynamic) is on.",
	}, func() float64 {
		if l.state.Load().killed {
			return 1
		}
		return 0
	})
	shareAt := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_enforcer_share_newest_timestamp_seconds", Help: "When the newest share loaded from Redis was computed, in Unix seconds (0: none loaded). Shares older than ShareTTL are ignored for the static split: alert on time() minus this.",
	}, func() float64 { return newestShare(l.state.Load().ctl) })
	staticVersion := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_enforcer_rules_version", Help: "The version of the static rule set in force.",
	}, func() float64 { return float64(l.state.Load().static.Version) })
	m.queueTime = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "sluice_enforcer_queue_wait_seconds",
		Help:    "How long decisions that found every place taken (Options.MaxInFlight) waited for one, shed ones included.",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
	})
	// The gate's state, 0 without a gate (MaxInFlight negative).
	gateGauge := func(name, help string, pick func(n int, limit float64) float64) prometheus.GaugeFunc {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 {
			if l.gate == nil {
				return 0
			}
			return pick(l.gate.state())
		})
	}
	inFlight := gateGauge("sluice_enforcer_in_flight", "Decisions in progress (0 when Options.MaxInFlight is negative: unbounded).",
		func(n int, _ float64) float64 { return float64(n) })
	inFlightLimit := gateGauge("sluice_enforcer_in_flight_limit", "The adaptive limit on decisions in progress (AIMD on their latency, between 2 × GOMAXPROCS and Options.MaxInFlight; 0 when unbounded).",
		func(_ int, limit float64) float64 { return limit })
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{
		m.queueTime, inFlight, inFlightLimit,
		counterFunc("sluice_enforcer_breaker_trips_total", "Times a Redis circuit breaker opened (this region's nodes and the home regions').", &m.trips),
		counterFunc("sluice_enforcer_shed_total", "Decisions shed (Decision.Err ErrOverloaded): every place was taken (Options.MaxInFlight) for longer than Options.QueueWait or the caller's deadline, so the rules' failure modes decided without Redis, from the remembered state. The sidecar itself is saturated. Also counted in sluice_enforcer_decisions_total.", &m.shed),
		counterFunc("sluice_enforcer_dynamic_rules_left_out_total", "Dynamic rules that matched a request but were left out of its decision because the request matched more than MaxRules (64) rules in all: shadow ones first. Static rules are never left out.", &m.dynLeftOut),
		counterFunc("sluice_enforcer_late_retries_total", "Script calls sent again, once, because Redis ran them past their deadline (late: nothing committed) while the wait for an answer had room for another: a sidecar that stalled before writing its call.", &m.lateRetries),
		counterFunc("sluice_enforcer_stalls_total", "Stalls of this process seen while it decided: a 5 ms timer that fired more than 5 ms late (a CPU quota's throttling, a starved host, a long pause). Waits that a stall ran out are extended by it, once; timeouts it caused are not breaker failures (cause stalled).", &l.clock.stalls),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_enforcer_stall_wait_seconds", Help: "How much longer than twice the budget the limiter now waits for Redis's answers (and than the queue wait for a place): the longest stall of this process longer than the budget in the last 10-20 s; 0 when it has not stalled."},
			func() float64 { return l.stall.get(time.Now()).Seconds() }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_enforcer_stalled_seconds_total", Help: "The total time of those stalls: the time this process did not run while it had decisions to make."},
			func() float64 { return time.Duration(l.clock.stalled.Load()).Seconds() }),
		counterFunc("sluice_enforcer_queued_total", "Decisions that waited for a place because Options.MaxInFlight were in progress (the sidecar's own CPU is the bottleneck).", &m.queued),
		m.decisions.vec, m.degradedN, wouldDeny, redisErrs, m.redisTime, m.batchSize, breakerState, homeBreaker, ref, drops, refresh,
		m.dynDropped, dynActive, overCap, killed, shareAt, staticVersion, l.slotRetry.collector(),
		counterFunc("sluice_enforcer_redis_round_trips_total", "Redis round trips (one call, or one pipeline across Cluster nodes).", &m.roundTrips),
		counterFunc("sluice_enforcer_lease_hits_total", "Decisions served from leased tokens of hot keys, without a Redis call.", &m.leaseHits),
		counterFunc("sluice_enforcer_key_store_lookups_total", "API keys looked up in the key store (not in its cache).", &m.keyMisses),
		counterFunc("sluice_enforcer_client_ip_refused_total", "Requests refused (ErrBadRequest) because a client_ip looked like an IP address but was none (999.1.1.1, 01.2.3.4).", &m.ipRefused),
		counterFunc("sluice_enforcer_client_ip_names_total", "Descriptors whose client_ip was no address but a name (a hostname in a replayed log), keyed as it is.", &m.ipNames),
		counterFunc("sluice_enforcer_key_store_errors_total", "Key store lookups that failed (the request went on without account, org and tier).", &m.keyErrors),
		counterFunc("sluice_enforcer_quota_windows_dropped_total", "G-Counter windows not remembered for QuotaCounts: more than MaxQuotaWindows waited (is a QuotaPublisher running?).", &m.gcDropped),
		counterFunc("sluice_enforcer_redis_moved_total", "MOVED or ASK replies from a Redis given as a single node: a Redis Cluster node without a Cluster client (the sidecar is unready from the first).", &m.movedN),
		counterFunc("sluice_enforcer_deny_cache_hits_total", "Decisions denied from the deny cache (a key known to be empty), without a Redis call.", &m.denyHits),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// newestShare returns the newest ComputedAt of c's shares in Unix seconds,
// or 0 when c has none. It walks the shares at each scrape, not per request.
func newestShare(c *store.Control) float64 {
	var newest time.Time
	for _, s := range c.Shares {
		if s.ComputedAt.After(newest) {
			newest = s.ComputedAt
		}
	}
	if newest.IsZero() {
		return 0
	}
	return float64(newest.UnixNano()) / 1e9
}

// overrideLabel is the rule label of every limit override's decisions:
// the overrides' limits are the callers' (Envoy's per-descriptor limit),
// and one label value each would let callers spend maxRuleLabels.
const overrideLabel = "override"

// ruleLabel is r's value of the rule label ("" for none).
func ruleLabel(r *rules.Rule) string {
	switch {
	case r == nil:
		return ""
	case len(r.Match) == 0: // a limit override (overrideRule): no rule has no match
		return overrideLabel
	}
	return r.ID
}

// count records a decision in the metrics.
func (l *Limiter) count(d *Decision) {
	var rule *rules.Rule
	if d.Rule != nil {
		rule = d.Rule
	} else if d.bind > 0 {
		rule = d.Statuses[d.bind-1].Rule
	} else if len(d.Statuses) > 0 { // degraded: no counts, so no binding rule
		rule = d.Statuses[0].Rule
	}
	l.decisions.get(ruleLabel(rule))[d.Outcome].Inc()
	if d.Path == decision.PathFallback {
		l.degradedN.Inc()
	}
	if d.Shadow != nil {
		l.wouldDeny[d.Path].Inc()
	}
}

// observeRedis records one round trip's time.
func (l *Limiter) observeRedis(start time.Time) {
	l.redisTime.Observe(time.Since(start).Seconds())
}
