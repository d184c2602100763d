package enforcer_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
)

// TestProbe: the readiness probe decides through Redis (its key written
// with a short TTL), reports a Redis over maxmemory as oom in Status, its
// gauges and one log line, and works again once Redis does.
func TestProbe(t *testing.T) {
	rdb := redistest.Server(t)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	var log bytes.Buffer
	p, err := enforcer.NewProbe(rdb, enforcer.ProbeOptions{Instance: "sidecar-1", Registerer: reg, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if st := p.Status(); !st.At.IsZero() || st.Err != nil {
		t.Errorf("before the first probe: %+v", st)
	}
	if err := p.Check(ctx); err != nil {
		t.Fatalf("probe of a healthy Redis: %v", err)
	}
	keys, err := rdb.Keys(ctx, "sl:*:sluice.readiness-probe:0").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("probe keys %v (%v), want one", keys, err)
	}
	if ttl := rdb.PTTL(ctx, keys[0]).Val(); ttl <= 0 || ttl > 3*time.Second {
		t.Errorf("the probe key's TTL %v, want a few seconds at most", ttl)
	}
	if testutil.ToFloat64(gaugeOf(t, reg, "sluice_enforcer_redis_up")) != 1 {
		t.Error("sluice_enforcer_redis_up is not 1")
	}

	if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := p.Check(ctx); enforcer.ClassifyRedisError(err) != enforcer.CauseOOM {
			t.Fatalf("probe over maxmemory: %v, want OOM", err)
		}
	}
	st := p.Status()
	if st.Cause != enforcer.CauseOOM || !strings.Contains(st.Err.Error(), "OOM command not allowed") || st.At.IsZero() {
		t.Errorf("Status over maxmemory: %+v", st)
	}
	if testutil.ToFloat64(gaugeOf(t, reg, "sluice_enforcer_redis_up")) != 0 ||
		testutil.ToFloat64(counterOf(t, reg, "sluice_enforcer_redis_down_cause", "cause", "oom")) != 1 ||
		testutil.ToFloat64(counterOf(t, reg, "sluice_enforcer_redis_down_cause", "cause", "noperm")) != 0 {
		t.Error("gauges over maxmemory: want up 0, down_cause{oom} 1, the others 0")
	}
	if n := strings.Count(log.String(), "level=ERROR"); n != 1 || !strings.Contains(log.String(), "cause=oom") {
		t.Errorf("%d error lines for two failed probes of one cause, want 1 with cause=oom:\n%s", n, log.String())
	}

	if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := p.Check(ctx); err != nil {
		t.Fatalf("probe once Redis has memory again: %v", err)
	}
	if st := p.Status(); st.Err != nil || st.Cause != enforcer.CauseNone {
		t.Errorf("Status after recovery: %+v", st)
	}
	if testutil.ToFloat64(counterOf(t, reg, "sluice_enforcer_redis_down_cause", "cause", "oom")) != 0 {
		t.Error("down_cause{oom} still 1 after recovery")
	}
	if !strings.Contains(log.String(), "works again") {
		t.Errorf("no recovery line:\n%s", log.String())
	}
}

// TestProbeEveryClusterMaster: on a Cluster the probe decides on every
// master (a probe key in each one's slots).
func TestProbeEveryClusterMaster(t *testing.T) {
	addrs := redistest.ClusterAddrs(t)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { cc.Close() })
	p, err := enforcer.NewProbe(cc, enforcer.ProbeOptions{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		n := redis.NewClient(&redis.Options{Addr: a})
		keys, err := n.Keys(context.Background(), "sl:*:sluice.readiness-probe:0").Result()
		n.Close()
		if err != nil || len(keys) != 1 {
			t.Errorf("master %s: probe keys %v (%v), want one", a, keys, err)
		}
	}
}

// TestMemoryPolicy: the maxmemory-policy is read on each new connection
// (OnConnect); an evicting one is reported, logged and gauged; INFO refused
// (NOPERM) is reported once and not asked again.
func TestMemoryPolicy(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	var log bytes.Buffer
	m, err := enforcer.NewMemoryPolicy(enforcer.MemoryPolicyOptions{Registerer: reg, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if st := m.Status(); len(st.Policies) != 0 || st.Evicting {
		t.Errorf("before any connection: %+v", st)
	}
	addr := redistest.AddrWith(t, "--maxmemory-policy", "allkeys-lru")
	rdb := redis.NewClient(&redis.Options{Addr: addr, OnConnect: m.OnConnect, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	st := m.Status()
	if len(st.Policies) != 1 || st.Policies[0] != "allkeys-lru" || !st.Evicting || st.Err != nil {
		t.Errorf("allkeys-lru: %+v", st)
	}
	if testutil.ToFloat64(counterOf(t, reg, "sluice_enforcer_redis_maxmemory_policy", "policy", "allkeys-lru")) != 1 {
		t.Error("gauge of allkeys-lru is not 1")
	}
	if !strings.Contains(log.String(), "level=WARN") || !strings.Contains(log.String(), "policy=allkeys-lru") {
		t.Errorf("no warning:\n%s", log.String())
	}
	// The policy changes; a reconnect reads it.
	if err := rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	_ = rdb.ClientKillByFilter(ctx, "TYPE", "normal", "SKIPME", "no").Err() // its own connection too
	for i := 0; rdb.Ping(ctx).Err() != nil && i < 3; i++ {                  // the first may meet the killed connection
	}
	if st := m.Status(); len(st.Policies) != 1 || st.Policies[0] != "noeviction" || st.Evicting {
		t.Errorf("after the change and a reconnect: %+v", st)
	}

	// CONFIG SET with no reconnect: a probe's Check reads it again. So
	// does a node read once that the client no longer reaches (as one that
	// restarted, with a new run_id): its old policy is gone.
	probe, err := enforcer.NewProbe(rdb, enforcer.ProbeOptions{Memory: m, MemoryReread: time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.ConfigSet(ctx, "maxmemory-policy", "volatile-ttl").Err(); err != nil {
		t.Fatal(err)
	}
	if err := probe.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if st := probe.Status(); fmt.Sprint(st.Memory.Policies) != "[volatile-ttl]" || !st.Memory.Evicting {
		t.Errorf("after CONFIG SET and a probe: %+v", st.Memory)
	}
	other := redis.NewClient(&redis.Options{Addr: redistest.Addr(t), OnConnect: m.OnConnect})
	t.Cleanup(func() { other.Close() })
	if err := other.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if st := m.Status(); fmt.Sprint(st.Policies) != "[noeviction volatile-ttl]" {
		t.Errorf("two nodes read: %+v", st)
	}
	time.Sleep(2 * time.Millisecond)
	if err := probe.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if st := m.Status(); fmt.Sprint(st.Policies) != "[volatile-ttl]" {
		t.Errorf("a node the client no longer reaches is still shown after a probe: %+v", st)
	}

	pw := redistest.Password(t)
	s := redistest.WithACL(t, []string{"noinfo on >" + pw + " ~* +@all -info"})
	m2, err := enforcer.NewMemoryPolicy(enforcer.MemoryPolicyOptions{Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr, Username: "noinfo", Password: pw, OnConnect: m2.OnConnect, PoolSize: 4})
	t.Cleanup(func() { c.Close() })
	log.Reset()
	for range 3 {
		if err := c.Ping(ctx).Err(); err != nil {
			t.Fatalf("a user without INFO must still connect: %v", err)
		}
		_ = c.ClientKillByFilter(ctx, "USER", "noinfo", "SKIPME", "no").Err()
	}
	if st := m2.Status(); len(st.Policies) != 0 || enforcer.ClassifyRedisError(st.Err) != enforcer.CauseNoPerm {
		t.Errorf("INFO refused: %+v", st)
	}
	if n := strings.Count(log.String(), "refuses INFO"); n != 1 {
		t.Errorf("%d lines about INFO refused over reconnects, want 1:\n%s", n, log.String())
	}
}

// gaugeOf returns a plain gauge's value in reg as a collector.
func gaugeOf(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"})
			g.Set(mf.GetMetric()[0].GetGauge().GetValue())
			return g
		}
	}
	t.Fatalf("no %s in the registry", name)
	return nil
}
