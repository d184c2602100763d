package enforcer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// MemoryPolicy follows Redis's maxmemory-policy as read from INFO on every
// new connection: install OnConnect as the client's OnConnect hook (go-redis
// calls it after each connection's handshake, so at start and on every
// reconnect, on every node of a Cluster; a Sentinel's own connections are
// skipped).
//
// Every key sluice writes has a TTL, so every policy but noeviction can
// evict a live counter: allkeys-* policies evict any key under memory
// pressure, volatile-* policies any key with a TTL, which is all of
// sluice's. An evicted counter starts again from zero, and its entity gets
// a fresh limit: run noeviction, and size maxmemory for the keys (then a
// full Redis refuses the decisions' writes with OOM, which the limiter
// reports and the rules' failure modes decide). An evicting policy is
// logged as a warning when first seen on a node, and reported in Status.
//
// The zero value is not usable: build one with NewMemoryPolicy. It is safe
// for concurrent use.
//
// Metrics, on MemoryPolicyOptions.Registerer:
//
//	sluice_enforcer_redis_maxmemory_policy{policy}   1 for each policy a node of this Redis runs, else 0
type MemoryPolicy struct {
	o       MemoryPolicyOptions
	refused atomic.Bool // INFO answered NOPERM: not asked again
	gauge   *prometheus.GaugeVec

	mu    sync.Mutex
	nodes map[string]string // run_id → maxmemory-policy
	err   error             // the last failed read, nil after a good one
}

// MemoryPolicyOptions configure a MemoryPolicy. The zero value is usable.
type MemoryPolicyOptions struct {
	// AllowEviction records that the operator accepted an evicting policy
	// (sluice serve --redis-allow-eviction): Status says so. It changes
	// nothing else.
	AllowEviction bool
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Registerer for the policy gauge; nil registers none.
	Registerer prometheus.Registerer
}

// PolicyStatus is what a MemoryPolicy has read.
type PolicyStatus struct {
	// Policies are the distinct policies of the nodes read, sorted; none
	// before the first read, or when INFO fails (see Err).
	Policies []string
	// Err is why no policy is known, or the last read's failure.
	Err error
	// Evicting reports a policy among Policies that can evict sluice's
	// keys (any but noeviction).
	Evicting bool
	// Allowed is MemoryPolicyOptions.AllowEviction.
	Allowed bool
}

// knownPolicies are Redis's maxmemory-policy values.
var knownPolicies = []string{"noeviction", "allkeys-lru", "allkeys-lfu", "allkeys-random",
	"volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl"}

// EvictingPolicy reports whether a maxmemory-policy can evict sluice's keys:
// every policy but noeviction (every sluice key has a TTL, so volatile-*
// policies take them as readily as allkeys-* ones).
func EvictingPolicy(policy string) bool { return policy != "" && policy != "noeviction" }

// NewMemoryPolicy returns a MemoryPolicy that has read nothing yet.
func NewMemoryPolicy(o MemoryPolicyOptions) (*MemoryPolicy, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	m := &MemoryPolicy{o: o, nodes: map[string]string{},
		gauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_enforcer_redis_maxmemory_policy",
			Help: "1 for each maxmemory-policy a node of this Redis runs (read from INFO on each new connection), else 0. Any policy but noeviction can evict live counters and reset limits.",
		}, []string{"policy"}),
	}
	for _, p := range knownPolicies {
		m.gauge.WithLabelValues(p).Set(0)
	}
	if o.Registerer != nil {
		if err := o.Registerer.Register(m.gauge); err != nil {
			return nil, fmt.Errorf("enforcer: registering the memory policy gauge: %w", err)
		}
	}
	return m, nil
}

// OnConnect reads the node's maxmemory-policy on a new connection, for
// go-redis's Options.OnConnect (and ClusterOptions', FailoverOptions',
// UniversalOptions'). It never fails the connection: a read that fails is
// reported in Status, and after a NOPERM (an ACL user without INFO) it is
// not tried again.
func (m *MemoryPolicy) OnConnect(ctx context.Context, cn *redis.Conn) error {
	if m.refused.Load() {
		return nil
	}
	info, err := cn.Info(ctx).Result()
	if err != nil {
		m.failed(err)
		return nil
	}
	node, policy, sentinel := parseInfo(info)
	switch {
	case sentinel:
		return nil // a failover client's connection to a Sentinel
	case policy == "":
		m.failed(errors.New("INFO has no maxmemory_policy"))
		return nil
	}
	m.read(node, policy)
	return nil
}

// parseInfo returns the run_id and maxmemory_policy in an INFO reply, and
// whether it is a Sentinel's.
func parseInfo(info string) (node, policy string, sentinel bool) {
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			switch k {
			case "redis_mode":
				sentinel = v == "sentinel"
			case "run_id":
				node = v
			case "maxmemory_policy":
				policy = v
			}
		}
	}
	return node, policy, sentinel
}

// Reread reads every node's maxmemory-policy again (INFO on each node of a
// Cluster, on the master of a single node or Sentinel group) and replaces
// what was read before. OnConnect alone misses a policy changed with CONFIG
// SET (no new connection reads it) and keeps the policy of a node that
// restarted (a new run_id) or left; after Reread, Status is the nodes' as
// they run now. A failed read is reported in Status and changes nothing
// else. Probe calls it every ProbeOptions.MemoryReread.
func (m *MemoryPolicy) Reread(ctx context.Context, rdb redis.UniversalClient) error {
	if m.refused.Load() {
		return nil
	}
	var mu sync.Mutex
	nodes := map[string]string{}
	readOne := func(ctx context.Context, c redis.Cmdable) error {
		info, err := c.Info(ctx).Result()
		if err != nil {
			return err
		}
		node, policy, _ := parseInfo(info)
		if policy == "" {
			return errors.New("INFO has no maxmemory_policy")
		}
		mu.Lock()
		nodes[node] = policy
		mu.Unlock()
		return nil
	}
	var err error
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error { return readOne(ctx, c) })
	} else {
		err = readOne(ctx, rdb)
	}
	if err != nil {
		m.failed(err)
		return err
	}
	m.mu.Lock()
	was := m.nodes
	m.nodes = nodes
	m.err = nil
	m.setGauge()
	m.mu.Unlock()
	for node, policy := range nodes {
		old, known := was[node]
		m.logPolicy(node, policy, old, known)
	}
	return nil
}

// read records node's policy, logging it when it is new or changed.
func (m *MemoryPolicy) read(node, policy string) {
	m.mu.Lock()
	was, known := m.nodes[node]
	m.nodes[node] = policy
	m.err = nil
	m.setGauge()
	m.mu.Unlock()
	m.logPolicy(node, policy, was, known)
}

// logPolicy logs node's policy when it is new (was unknown) or changed.
func (m *MemoryPolicy) logPolicy(node, policy, was string, known bool) {
	if known && was == policy {
		return
	}
	switch {
	case EvictingPolicy(policy):
		m.o.Logger.Warn("redis maxmemory-policy can evict sluice's counters under memory pressure, and an evicted counter resets its entity's limit: run noeviction (docs/operations.md, \"Production Redis\")",
			"policy", policy, "allowed", m.o.AllowEviction, "node_run_id", node)
	case known:
		m.o.Logger.Info("redis maxmemory-policy changed", "policy", policy, "was", was, "node_run_id", node)
	}
}

// setGauge sets the gauge from m.nodes; m.mu is held.
func (m *MemoryPolicy) setGauge() {
	for _, p := range knownPolicies {
		m.gauge.WithLabelValues(p).Set(0)
	}
	for _, p := range m.nodes {
		m.gauge.WithLabelValues(p).Set(1)
	}
}

// failed records a read that failed, logging the first of a kind.
func (m *MemoryPolicy) failed(err error) {
	if ClassifyRedisError(err) == CauseNoPerm {
		if m.refused.Swap(true) {
			return
		}
		m.o.Logger.Warn("redis refuses INFO to sluice's user: its maxmemory-policy is not checked (grant +info: docs/operations.md, \"Production Redis\")", "err", err)
	}
	m.mu.Lock()
	m.err = err
	m.mu.Unlock()
}

// Status returns the policies read and whether one evicts.
func (m *MemoryPolicy) Status() PolicyStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := PolicyStatus{Err: m.err, Allowed: m.o.AllowEviction}
	for _, p := range m.nodes {
		if !slices.Contains(st.Policies, p) {
			st.Policies = append(st.Policies, p)
		}
		st.Evicting = st.Evicting || EvictingPolicy(p)
	}
	slices.Sort(st.Policies)
	return st
}
