package crowdsec

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Kinds of decisions received (label kind of
// sluice_crowdsec_decisions_received_total).
const (
	kindNew     = "new"
	kindDeleted = "deleted"
)

// metrics are a Bouncer's. Every series is made up front, so that each
// reads 0 before its first event.
type metrics struct {
	received     map[string]prometheus.Counter // by kind
	refused      map[string]prometheus.Counter // decisions, by reason
	invalid      prometheus.Counter
	active       prometheus.Gauge
	streamErrors prometheus.Counter

	applied, updated, deleted map[string]prometheus.Counter // by region
	rulesRefused              map[string]map[string]prometheus.Counter
	regionErrors              map[string]prometheus.Counter
	rules                     map[string]prometheus.Gauge
	lag                       map[string]prometheus.Observer
}

// collectors registers collectors on reg (nil: none), keeping the first
// error.
type collectors struct {
	reg prometheus.Registerer
	err error
}

func (c *collectors) add(cs ...prometheus.Collector) {
	for _, x := range cs {
		if c.reg == nil || c.err != nil {
			return
		}
		if err := c.reg.Register(x); err != nil {
			c.err = fmt.Errorf("crowdsec: registering metrics: %w", err)
		}
	}
}

func counters(vec *prometheus.CounterVec, values ...string) map[string]prometheus.Counter {
	m := map[string]prometheus.Counter{}
	for _, v := range values {
		m[v] = vec.WithLabelValues(v)
	}
	return m
}

func newMetrics(reg prometheus.Registerer, regions []string, streamAge func() float64) (*metrics, error) {
	c := &collectors{reg: reg}
	received := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_crowdsec_decisions_received_total",
		Help: "CrowdSec decisions read from the Local API's decision stream, by kind: new (or, at a startup pull, active) and deleted (or expired)."}, []string{"kind"})
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_crowdsec_decisions_refused_total",
		Help: "CrowdSec decisions that make no rule, each logged, by reason: scope (one sluice cannot enforce: Country, Username, ...), value (not an address, network or AS number), duration (unreadable or over)."}, []string{"reason"})
	invalid := prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_crowdsec_invalid_rules_total",
		Help: "Rules made from CrowdSec decisions that did not validate, logged and left out (a bug: none are expected)."})
	active := prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_crowdsec_decisions",
		Help: "Active CrowdSec decisions that make rules, as of the last answer of the stream."})
	streamErrors := prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_crowdsec_stream_errors_total",
		Help: "Failed pulls of the decision stream (the Local API unreachable, refusing the key, or answering an error); retried with backoff."})
	age := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_crowdsec_stream_age_seconds",
		Help: "Seconds since the last successful pull of the decision stream (since the start, before the first): grows while the Local API is unreachable."}, streamAge)
	byRegion := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"region"})
	}
	applied := byRegion("sluice_crowdsec_rules_applied_total", "Rules made from CrowdSec decisions written new to the region's Redis (one per source and decision type; again after the Redis lost them).")
	updated := byRegion("sluice_crowdsec_rules_updated_total", "Rules made from CrowdSec decisions rewritten in the region's Redis: changed decisions, renewals past 24 h.")
	deleted := byRegion("sluice_crowdsec_rules_deleted_total", "Rules deleted from the region's Redis because their CrowdSec decisions were deleted or expired.")
	regionErrors := byRegion("sluice_crowdsec_region_errors_total", "Failed syncs of the region's Redis with CrowdSec's decisions; retried with backoff.")
	rulesRefused := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_crowdsec_rules_refused_total",
		Help: "Rules made from CrowdSec decisions not written to the region's Redis, each counted once while it waits, by reason: cap (the bouncer's --max-rules), region_cap (the region's cap on all dynamic rules), killed (the kill switch is on)."},
		[]string{"region", "reason"})
	rules := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_crowdsec_rules",
		Help: "Rules made from CrowdSec decisions in the region's Redis after the last sync."}, []string{"region"})
	lag := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "sluice_crowdsec_apply_lag_seconds",
		Help:    "Time from the stream's answer that brought a decision to its rule in the region's Redis.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}}, []string{"region"})
	c.add(received, refused, invalid, active, streamErrors, age, applied, updated, deleted, regionErrors, rulesRefused, rules, lag)
	m := &metrics{
		received: counters(received, kindNew, kindDeleted),
		refused:  counters(refused, RefusedScope, RefusedValue, RefusedDuration),
		invalid:  invalid, active: active, streamErrors: streamErrors,
		applied: counters(applied, regions...), updated: counters(updated, regions...), deleted: counters(deleted, regions...),
		regionErrors: counters(regionErrors, regions...),
		rulesRefused: map[string]map[string]prometheus.Counter{}, rules: map[string]prometheus.Gauge{}, lag: map[string]prometheus.Observer{},
	}
	for _, r := range regions {
		m.rulesRefused[r] = map[string]prometheus.Counter{}
		for _, reason := range []string{refusedCap, refusedRegionCap, refusedKilled} {
			m.rulesRefused[r][reason] = rulesRefused.WithLabelValues(r, reason)
		}
		m.rules[r] = rules.WithLabelValues(r)
		m.lag[r] = lag.WithLabelValues(r)
	}
	return m, c.err
}
