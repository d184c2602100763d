package enforcer

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/rules"
)

// Probe checks the decision path the way a request takes it: each Check
// decides one request of its own rule through a Limiter over the same
// client, so the same script (EVALSHA, and EVAL when Redis has not cached
// it) writes a token bucket of its own (sl:{<tag>}:sluice.readiness-probe:0,
// a key that lives about 2 s) on every master. A Redis that answers PING but refuses
// the script (NOPERM for EVALSHA, NOAUTH, WRONGPASS, OOM under noeviction,
// MISCONF, READONLY, a failed TLS handshake) fails the probe, with its
// cause; readiness (the sidecar's /readyz, --ready-needs-redis) reads
// Status.
//
// The probe's decisions take no place among the limiter's (MaxInFlight),
// open no breaker of their own and are not counted in the limiter's
// metrics; each costs Redis one script call (per Cluster master).
//
// Build one with NewProbe; the zero value is not usable. A Probe is safe for
// concurrent use: Run (or Check) in one goroutine, Status from any.
//
// Metrics, on ProbeOptions.Registerer:
//
//	sluice_enforcer_redis_up                   1 when the last probe's decision went through Redis, else 0
//	sluice_enforcer_redis_down_cause{cause}    1 for the cause of the last failed probe (noauth, noperm, oom, ...), else 0
type Probe struct {
	rdb    redis.UniversalClient
	lim    *Limiter
	rule   *rules.Rule
	o      ProbeOptions
	up     prometheus.Gauge
	causes *prometheus.GaugeVec

	mu sync.Mutex
	st RedisStatus

	reread time.Time // when Check last read Memory again; Check's goroutine only
}

// ProbeOptions configure a Probe. The zero value is usable.
type ProbeOptions struct {
	// Instance names the probe's key, so that the sidecars of a region
	// probe keys of their own. Default "0".
	Instance string
	// Timeout bounds each probe's decision (its budget, by Redis's clock).
	// Default 1 s: the probe checks that decisions can be made at all; the
	// limiter's breaker judges their speed.
	Timeout time.Duration
	// Memory, when set, is reported in Status (see MemoryPolicy), and read
	// again (MemoryPolicy.Reread) by a Check at most every MemoryReread.
	Memory *MemoryPolicy
	// MemoryReread is how often, at most, Check reads Memory's policies
	// again: a policy changed with CONFIG SET, or a node restarted, shows
	// within it. Default 10 s.
	MemoryReread time.Duration
	// Logger; default slog.Default(). A probe that starts failing is logged
	// (with its cause and what to look at), and one that works again.
	Logger *slog.Logger
	// Registerer for the probe's gauges; nil registers none.
	Registerer prometheus.Registerer
}

// RedisStatus is what the last probe found.
type RedisStatus struct {
	// At is when the last probe ended; zero before the first.
	At time.Time
	// Err is the last probe's failure; nil when its decisions went
	// through Redis. It never holds a password: Redis's replies and the
	// client's errors carry none.
	Err error
	// Cause is Err's cause (CauseNone when Err is nil).
	Cause RedisCause
	// Node is the Cluster master whose decision failed; "" on a single
	// node or Sentinel group.
	Node string
	// Memory is the maxmemory-policy as last read (ProbeOptions.Memory).
	Memory PolicyStatus
}

// probeDomain and probeRule are the probe's own rule set: a token bucket no
// probe comes near, keyed by the user descriptor, with a 1 s period (its key
// lives about 2 s).
const (
	probeDomain = "sluice-readiness-probe"
	probeRule   = "sluice.readiness-probe"
	probeYAML   = "domain: " + probeDomain + "\nrules:\n  - id: " + probeRule +
		"\n    match: [{key: user}]\n    limit: 1000000000\n    period: 1s\n"
)

// NewProbe returns a Probe of the decision path on rdb (the client the
// limiter uses).
func NewProbe(rdb redis.UniversalClient, o ProbeOptions) (*Probe, error) {
	if o.Instance == "" {
		o.Instance = "0"
	}
	if o.Timeout < 0 {
		return nil, fmt.Errorf("enforcer: probe timeout %v must be positive (or 0 for the default)", o.Timeout)
	}
	if o.Timeout == 0 {
		o.Timeout = time.Second
	}
	if o.MemoryReread < 0 {
		return nil, fmt.Errorf("enforcer: probe memory reread %v must be positive (or 0 for the default)", o.MemoryReread)
	}
	if o.MemoryReread == 0 {
		o.MemoryReread = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	set, err := rules.Parse("probe", []byte(probeYAML))
	if err != nil {
		return nil, fmt.Errorf("enforcer: the probe's rule: %w", err)
	}
	lim, err := New(rdb, set, Options{
		Instance: o.Instance, Budget: o.Timeout, NoPipeline: true, MaxInFlight: -1,
		HotKeys: HotKeyOptions{Table: -1, Rate: -1, LeaseBlock: -1}, NoDynamic: true,
		// Its breaker never opens: every probe reaches Redis.
		Breaker: BreakerOptions{Failures: math.MaxInt32, Window: 10 * time.Second},
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return nil, err
	}
	p := &Probe{rdb: rdb, lim: lim, rule: set.Rules[0], o: o,
		up: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_enforcer_redis_up",
			Help: "1 when the last readiness probe's decision (the decision script, writing a probe key, on every Cluster master) went through Redis; 0 when it failed (see sluice_enforcer_redis_down_cause) or before the first.",
		}),
		causes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_enforcer_redis_down_cause",
			Help: "1 for the cause of the last failed readiness probe (noauth, wrongpass, noperm, oom, readonly, misconf, loading, tls, timeout, unreachable, ...), 0 for the others.",
		}, []string{"cause"}),
	}
	for c := RedisCause(1); c < numCauses; c++ {
		p.causes.WithLabelValues(c.String()).Set(0)
	}
	if o.Registerer != nil {
		for _, c := range []prometheus.Collector{p.up, p.causes} {
			if err := o.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("enforcer: registering the probe's metrics: %w", err)
			}
		}
	}
	return p, nil
}

// Run probes every interval (a non-positive one: every second) until ctx
// ends.
func (p *Probe) Run(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = p.Check(ctx)
		}
	}
}

// Check runs one probe now: a decision on every master (one on a single
// node or Sentinel group), within Timeout each. It returns the first
// failure (nil when every decision went through Redis), which Status
// reports from then on, and logs a change between working and failing or
// from one cause to another.
func (p *Probe) Check(ctx context.Context) error {
	node, err := p.check(ctx)
	if p.o.Memory != nil && err == nil && time.Since(p.reread) >= p.o.MemoryReread {
		p.reread = time.Now()
		rctx, cancel := context.WithTimeout(ctx, p.o.Timeout)
		_ = p.o.Memory.Reread(rctx, p.rdb) // a failure is in Memory's status
		cancel()
	}
	if ctx.Err() != nil && err != nil {
		return err // shutting down: nothing to say about Redis
	}
	st := RedisStatus{At: time.Now(), Err: err, Cause: ClassifyRedisError(err), Node: node}
	p.mu.Lock()
	was := p.st
	p.st = st
	p.mu.Unlock()
	if err == nil {
		p.up.Set(1)
	} else {
		p.up.Set(0)
	}
	if was.Cause != st.Cause {
		if was.Cause != CauseNone {
			p.causes.WithLabelValues(was.Cause.String()).Set(0)
		}
		if st.Cause != CauseNone {
			p.causes.WithLabelValues(st.Cause.String()).Set(1)
		}
	}
	switch {
	case err != nil && (was.Cause != st.Cause || was.At.IsZero()):
		args := []any{"cause", st.Cause.String(), "err", err}
		if node != "" {
			args = append(args, "node", node)
		}
		if st.Cause == CauseNoPerm {
			args = append(args, "command", NoPermCommand(err))
		}
		msg := "redis readiness probe: the decision script fails; decisions follow each rule's failure mode"
		if h := CauseHint(st.Cause); h != "" {
			msg += ": " + h
		}
		p.o.Logger.Error(msg, args...)
	case err == nil && was.Err != nil:
		p.o.Logger.Info("redis readiness probe: the decision script works again")
	}
	return err
}

// check decides the probe's request on each master and returns the first
// failure and the node it came from.
func (p *Probe) check(ctx context.Context) (string, error) {
	values, nodes, err := p.targets(ctx)
	if err != nil {
		return "", err
	}
	for i, v := range values {
		var d rules.Descriptors
		d[rules.KeyUser] = v
		dec, err := p.lim.Check(ctx, &Request{Domain: probeDomain, Descriptors: d})
		if err == nil {
			err = dec.Err
		}
		if err != nil {
			return nodes[i], err
		}
	}
	return "", nil
}

// probeCandidates bounds the values tried to find one probe key per
// Cluster master: with 16 masters of equal share, all are found with a
// probability of 1 - 7e-8.
const probeCandidates = 256

// targets returns the probe's user values, one per Cluster master (at most
// MaxParts masters; the rest are not probed), and the masters' addresses;
// one value and no address on a single node or Sentinel group.
func (p *Probe) targets(ctx context.Context) (values, nodes []string, err error) {
	cc, ok := p.rdb.(*redis.ClusterClient)
	if !ok {
		return []string{p.value(0)}, []string{""}, nil
	}
	masters := 0
	var mu sync.Mutex
	if err := cc.ForEachMaster(ctx, func(context.Context, *redis.Client) error {
		mu.Lock()
		masters++
		mu.Unlock()
		return nil
	}); err != nil {
		return nil, nil, err
	}
	seen := map[string]bool{}
	var tag []byte
	for i := 0; i < probeCandidates && len(values) < min(masters, MaxParts); i++ {
		v := p.value(i)
		var d rules.Descriptors
		d[rules.KeyUser] = v
		tag = append(append(tag[:0], '{'), rules.AppendEntityTag(nil, p.rule, &d)...)
		tag = append(tag, '}')
		n, err := cc.MasterForKey(ctx, string(tag))
		if err != nil {
			return nil, nil, err
		}
		if addr := n.Options().Addr; !seen[addr] {
			seen[addr] = true
			values, nodes = append(values, v), append(nodes, addr)
		}
	}
	return values, nodes, nil
}

func (p *Probe) value(i int) string {
	return fmt.Sprintf("%s/%d", p.o.Instance, i)
}

// Status returns what the last probe found, and the memory policy.
func (p *Probe) Status() RedisStatus {
	p.mu.Lock()
	st := p.st
	p.mu.Unlock()
	if p.o.Memory != nil {
		st.Memory = p.o.Memory.Status()
	}
	return st
}
