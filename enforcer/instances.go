package enforcer

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultInstances is the instance count a limiter that learns it
// (Options.Fallback.Instances 0) uses before it has learned it: when Redis
// has not answered a heartbeat since the process started (a sidecar
// restarted while Redis is down). 1: a lone sidecar keeps its rule's whole rate; a region of n
// sidecars that all restart during an outage lets up to n × Headroom times
// a fail-open rule's rate through until Redis answers (set --instances to
// bound that; docs/enforcement.md, "Storage errors").
const DefaultInstances = 1

// instanceCount is the number of enforcers that share the region's traffic,
// which the local fallback divides a rule by: Options.Fallback.Instances when set
// (the override), else learned through Redis (store.Heartbeat: each
// enforcer renews an entry with a TTL at every Refresh, and reads how many
// are live) and kept while Redis is away; DefaultInstances until first
// learned. A count rises at once and falls only after a heartbeat TTL of
// lower counts. Safe for concurrent use; reading it allocates nothing.
type instanceCount struct {
	override int
	n        atomic.Int64 // the count in use
	learned  atomic.Int64 // Unix ms of the last heartbeat answered; 0: never
	id       string       // this enforcer's heartbeat entry: its instance name and a random nonce
	ttl      time.Duration
	lowSince atomic.Int64 // Unix ns since heartbeats have counted fewer than n; 0: they have not
	refused  atomic.Int32 // the RedisCause of the last heartbeat Redis refused (NOPERM, ...); 0: none
}

func newInstanceCount(o *Options, id string) *instanceCount {
	ic := &instanceCount{override: o.Fallback.Instances, id: id, ttl: max(5*time.Second, 3*o.ShareRefresh)}
	if o.Fallback.Instances > 0 {
		ic.n.Store(int64(o.Fallback.Instances))
	} else {
		ic.n.Store(DefaultInstances)
	}
	return ic
}

// get returns the count in use, at least 1.
func (ic *instanceCount) get() float64 { return float64(max(1, ic.n.Load())) }

// source says where the count in use comes from: "override", "redis" or
// "default".
func (ic *instanceCount) source() string {
	switch {
	case ic.override > 0:
		return "override"
	case ic.learned.Load() > 0:
		return "redis"
	}
	return "default"
}

// heartbeat renews this enforcer's entry in Redis and learns the count,
// unless the count is overridden.
func (l *Limiter) heartbeat(ctx context.Context) {
	ic := l.instances
	if ic.override > 0 {
		return
	}
	n, err := l.heartbeatOnce(ctx)
	if err != nil {
		return
	}
	now := time.Now()
	if ic.learned.Load() > 0 && int64(n) < ic.n.Load() {
		// A lower count is taken only once it has held for a heartbeat's
		// TTL: a Redis that restarted empty has only the enforcers that
		// have beaten since, and the others' entries come back within one
		// refresh.
		ic.lowSince.CompareAndSwap(0, now.UnixNano())
		if time.Duration(now.UnixNano()-ic.lowSince.Load()) < ic.ttl {
			ic.learned.Store(now.UnixMilli())
			return
		}
	}
	ic.lowSince.Store(0)
	if old := ic.n.Swap(int64(n)); old != int64(n) {
		l.opts.Logger.Info("the region's enforcer count changed: the local fallback divides each rule by it", "instances", n, "was", old)
	}
	ic.learned.Store(now.UnixMilli())
}

// heartbeatOnce renews this enforcer's entry and returns the count. A
// refusal by Redis (an ACL user without ZADD or PEXPIRE on the instances
// set, NOAUTH, ...), which no outage explains and nothing else would show,
// is logged when it starts and when it ends: meanwhile the count stays what
// it was, and a region of n enforcers each dividing by 1 lets n times a
// fail-open rule's rate through an outage.
func (l *Limiter) heartbeatOnce(ctx context.Context) (int, error) {
	ic := l.instances
	n, err := l.store.Heartbeat(ctx, ic.id, ic.ttl)
	if err != nil {
		l.dm.heartbeatBad.Inc()
		if c := ClassifyRedisError(err); c.Config() {
			if RedisCause(ic.refused.Swap(int32(c))) != c {
				fix := "grant the ACL line of docs/operations.md, \"Production Redis\"" // NOPERM
				switch c {
				case CauseNoAuth, CauseWrongPass:
					fix = "give the credentials Redis wants (--redis-username, --redis-password-file)"
				case CauseTLS:
					fix = "fix the TLS flags (--redis-tls*) or the redis:// URL's scheme"
				}
				l.opts.Logger.Error("redis refuses the enforcer-count heartbeat: the local fallback keeps dividing each fail-open rule by the last count (or 1) during an outage; "+fix,
					"cause", c.String(), "command", NoPermCommand(err), "instances", ic.n.Load(), "err", err)
			}
		}
		return 0, err
	}
	if ic.refused.Swap(0) != 0 {
		l.opts.Logger.Info("redis takes the enforcer-count heartbeat again")
	}
	return n, nil
}

// CheckHeartbeat renews this enforcer's heartbeat once and returns Redis's
// error: for a start-up check (sluice serve refuses a Redis that refuses
// it). Nil when the count is overridden (Options.Fallback.Instances).
func (l *Limiter) CheckHeartbeat(ctx context.Context) error {
	if l.instances.override > 0 {
		return nil
	}
	_, err := l.heartbeatOnce(ctx)
	return err
}

// register adds the instance count's metrics to reg.
func (ic *instanceCount) register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_enforcer_fallback_instances",
			Help: "Enforcers the local fallback divides each fail-open rule by (Options.Fallback.Instances, --instances, when set; else learned through Redis heartbeats and kept while Redis is away; 1 before the first).",
		}, ic.get),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_enforcer_fallback_instances_learned",
			Help: "1 when the fallback's enforcer count was learned through Redis since this process started, 0 when it is the override (--instances) or the default (1, Redis not yet answered).",
		}, func() float64 {
			if ic.source() == "redis" {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_enforcer_fallback_instances_age_seconds",
			Help: "Seconds since Redis last answered this enforcer's heartbeat (the enforcer count's age); -1 when it never has or the count is the override.",
		}, func() float64 {
			at := ic.learned.Load()
			if at == 0 || ic.override > 0 {
				return -1
			}
			return float64(time.Now().UnixMilli()-at) / 1000
		}),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
