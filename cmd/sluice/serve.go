package main

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/enforcer/sidecar"
	"github.com/sluice-rl/sluice/rules"
)

// serveConfig is what runServe needs: what the flags of `sluice serve` set.
// The zero value runs the embedded sidecar: the example rules, an in-process
// Redis, no decision records, gRPC on 127.0.0.1:8081 and HTTP on
// 127.0.0.1:8080, and no admin listener.
type serveConfig struct {
	// GRPCAddr and HTTPAddr are the listen addresses of the decisions and
	// usage; defaults "127.0.0.1:8081" and "127.0.0.1:8080" (a sidecar's
	// gateway is on its host; see defaultHTTPAddr). Port 0 picks a free
	// port (see Listening).
	GRPCAddr, HTTPAddr string
	// AdminAddr is the probes' and metrics' own listen address
	// (/healthz, /readyz, /metrics, for the kubelet and Prometheus);
	// "": none (the flag's default is defaultAdminAddr, every interface).
	AdminAddr string
	// RulesFile is the rule file (YAML), followed while the sidecar runs: a
	// new valid version is applied whole, an invalid one is logged and
	// counted and the set in force stays (see store.Watcher). "" uses
	// ExampleRules, fixed.
	RulesFile string
	// RulesRedis takes the static rule set from the region's Redis (the
	// rule-set store, store.SetStore, that `sluice rules push` writes) and
	// follows its pushes. RulesFile, if given, is then only the set in force
	// until Redis answers with one; without it the sidecar has no rules
	// until then. The sidecar records the version it holds in the store
	// under Limiter.Instance (default: the host name), which must be unique
	// among the region's sidecars (see store.WatchOptions.Instance).
	RulesRedis bool
	// RulesPoll is how often the rule source is re-checked besides its
	// events (file-system events, Redis notifications). Default 1 s.
	RulesPoll time.Duration
	// Redis are the Redis addresses: one for a single node, several (or
	// RedisCluster) for a Cluster. None: an in-process Redis (miniredis),
	// for trying sluice out: its counters live and die with the process.
	// RedisSentinel names the master that the Sentinels at Redis monitor:
	// the limiter's client is go-redis's failover client, which follows
	// Sentinel's failovers. runServe refuses a Sentinel or a replica given
	// as a plain address, a Cluster node without RedisCluster, and a
	// non-Cluster node with it, naming the flag (see checkRedis).
	Redis         []string
	RedisCluster  bool
	RedisSentinel string
	// RedisDB is the database of a single node or Sentinel group (a
	// --redis URL's /DB); a Cluster has only 0.
	RedisDB int
	// RedisAuth are the credentials and TLS of every Redis client the
	// sidecar opens (redisconn.go): this region's, on every node; the
	// Sentinels' own; the home regions' unless a --home URL gives its own.
	RedisAuth redisAuth
	// RedisAllowEviction starts the sidecar on a Redis whose
	// maxmemory-policy can evict its keys (allkeys-*, volatile-*), with a
	// warning; without it such a Redis is refused at start (see
	// checkRedisStart).
	RedisAllowEviction bool
	// RedisStartDegraded starts the sidecar even when Redis refuses its
	// credentials, ACL permissions or TLS at start; without it runServe
	// returns an error naming the flag to fix.
	RedisStartDegraded bool
	// KeyStore fills a request's account, organisation and tier from its
	// API key, with the key store in the region's Redis (store.RedisKeys,
	// cached a minute per key).
	KeyStore bool
	// Limiter configures the limiter (Region, Instance, Instances, Budget,
	// ...); runServe sets its Logger, Registerer and Sink.
	Limiter enforcer.Options
	// Server configures the APIs (Headers, UnavailableStatus,
	// RequireRedis, RequireRecords); runServe sets its Redis, Registry,
	// Logger, StatusJoin and Records.
	Server sidecar.Options
	// UsageClickHouse, when its Addr is set, gives GET /v1/usage the
	// key's denials per rule (analytics.KeyDenials).
	UsageClickHouse usageClickHouse
	// Brokers are Kafka brokers for decision records (pipeline.Producer,
	// topic "decisions") and for this region's G-Counter counts
	// (gcounter.QuotaPublisher, topic QuotaTopic). None: neither.
	Brokers []string
	// Homes maps every other region's name to its Redis address
	// (HOST:PORT, a single node), for pinned rules (enforcer.Options.Homes).
	Homes map[string]string
	// QuotaTopic is where this region's G-Counter counts are published
	// every QuotaInterval (1 s) when Brokers are given; default
	// gcounter.DefaultQuotaTopic.
	QuotaTopic    string
	QuotaInterval time.Duration
	// StatusWait is how long a decision record with a request id waits
	// for Envoy's access log to report its status (see StatusJoin, served
	// on the gRPC address). Default 5 s.
	StatusWait time.Duration
	// Refresh is how often dynamic rules and shares are loaded from Redis
	// (Limiter.Refresh) and readiness re-checked. Default 1 s.
	Refresh time.Duration
	// DrainDelay is how long the sidecar stays unready at shutdown
	// (/readyz 503, gRPC health NOT_SERVING) while it still answers checks,
	// before its listeners close: time for probes and load balancers to
	// see it leave. 0: none (the flag's default is 5 s).
	DrainDelay time.Duration
	// DrainTimeout bounds the wait for in-flight checks at shutdown, after
	// the listeners have closed; then connections are cut. Default 10 s.
	DrainTimeout time.Duration
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Listening, when set, is called with the bound addresses once both
	// listeners are open, before any request is served.
	Listening func(grpcAddr, httpAddr net.Addr)
	// Listen opens a listener; default net.ListenConfig's Listen. Tests
	// give listeners that fail.
	Listen func(ctx context.Context, network, addr string) (net.Listener, error)
}

// runServe serves the sidecar until ctx ends, then drains: readiness turns
// unready while checks are still answered (DrainDelay), then the listeners
// close, in-flight checks finish (up to DrainTimeout), and decision records
// are flushed. It returns nil after a
// shutdown that ctx asked for, and an error if the sidecar cannot start or
// a listener fails.
//
// It is a sequence of steps (serve_steps.go), each of which opens one part
// and registers what closes it: the rules, Redis, tracing, decision records,
// the limiter, the quota publisher, the probe, the APIs, the warm-up, the
// listeners, and the run group.
func runServe(ctx context.Context, c serveConfig) error {
	if err := c.check(); err != nil {
		return err
	}
	s := newSidecarRun(c)
	defer s.close()
	for _, step := range []func(context.Context) error{
		s.bind, s.loadRules, s.openRedis, s.openTracing, s.openHomes, s.openRecords, s.newLimiter,
		s.newQuotaPublisher, s.newServer, s.warm, s.listen,
	} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	return s.run(ctx)
}

// warmUp loads the limiter's script into Redis's script cache before the
// first request, whose budget (10 ms) a cold EVAL can exceed: a check-only
// decision, which consumes nothing, of the set's first rule for a made-up
// entity, by a throwaway limiter with a generous budget, no metrics and no
// decision records.
func warmUp(ctx context.Context, rdb redis.UniversalClient, set *rules.Set) error {
	if err := rdb.Ping(ctx).Err(); err != nil {
		return err
	}
	// Open the pools' connections now, in parallel, so that the first burst
	// of checks does not dial them within its budget: the main pool's, and
	// the pipeline pool's that the limiter's batched script calls use.
	var wg sync.WaitGroup
	for range poolIdle {
		wg.Add(2)
		go func() { defer wg.Done(); _ = rdb.Ping(ctx).Err() }()
		go func() {
			defer wg.Done()
			_, _ = rdb.Pipelined(ctx, func(p redis.Pipeliner) error { return p.Ping(ctx).Err() })
		}()
	}
	wg.Wait()
	if len(set.Rules) == 0 {
		return nil
	}
	quiet := slog.New(slog.DiscardHandler)
	l, err := enforcer.New(rdb, set, enforcer.Options{Budget: time.Second, Logger: quiet})
	if err != nil {
		return err
	}
	var p enforcer.Part
	for _, m := range set.Rules[0].Match {
		p.Descriptors[m.Key] = m.Value
		if m.Value == "" {
			p.Descriptors[m.Key] = "sluice-warm-up"
		}
	}
	p.CheckOnly = true
	d, err := l.Check(ctx, &enforcer.Request{Domain: set.Domain, Parts: []enforcer.Part{p}})
	if errors.Is(err, enforcer.ErrBadRequest) {
		return nil // the rule set's doing (too many rules match), not Redis's: warned about at start
	}
	if err == nil {
		err = d.Err
		_ = l.Release(ctx, &d) // a concurrency rule's check still takes a slot
	}
	return err
}

// refresh loads dynamic rules and shares and re-checks readiness every
// interval until ctx ends.
func refresh(ctx context.Context, every time.Duration, lim *enforcer.Limiter, srv *sidecar.Server, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			rctx, cancel := context.WithTimeout(ctx, every)
			err := lim.Refresh(rctx, now)
			srv.UpdateHealth(rctx)
			cancel()
			switch {
			case err != nil && !failing && ctx.Err() == nil:
				log.Warn("loading dynamic rules and shares failed; keeping the last ones", "err", err)
				failing = true
			case err == nil && failing:
				log.Info("loading dynamic rules and shares works again")
				failing = false
			}
		}
	}
}

// The default gRPC address, the most gRPC connections served at once, and
// the bounds of --budget and --refresh.
const (
	defaultGRPCAddr = "127.0.0.1:8081"
	maxGRPCConns    = 512
	maxBudget       = 10 * time.Second
	minRefresh      = 10 * time.Millisecond
)

// The Redis pool of a sidecar: checks in flight at once, and connections kept
// open ahead.
const poolSize, poolIdle = 128, 32

// openHome returns a client on another region's Redis at addr (HOST:PORT,
// or a URL with its own credentials), for pinned rules: no retries, the
// limiter's HomeBudget as deadline (a WAN round trip).
func openHome(c *serveConfig, region, addr string) (*redis.Client, error) {
	budget := homeBudget(c)
	addr, db, auth, err := nodeAddr("--home "+region+"=", addr, c.RedisAuth)
	if err != nil {
		return nil, err
	}
	return redis.NewClient(auth.options(&redis.Options{
		Addr: addr, DB: db, MaxRetries: -1, ContextTimeoutEnabled: true, DialerRetries: 1,
		PoolTimeout: budget, PoolSize: poolSize, MinIdleConns: poolIdle,
		ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second, DialTimeout: 2 * time.Second,
	})), nil
}

// homeBudget is the limiter's HomeBudget, or its default (500 ms).
func homeBudget(c *serveConfig) time.Duration {
	if b := c.Limiter.HomeBudget; b > 0 {
		return b
	}
	return 500 * time.Millisecond
}

// openRedis returns the Redis client serveConfig asks for, set up as the
// limiter needs it, with its credentials and TLS, and mem reading the
// maxmemory-policy on every new connection (nil: not read), and what
// closes it.
func openRedis(c *serveConfig, mem *enforcer.MemoryPolicy) (redis.UniversalClient, func(), error) {
	addrs := c.Redis
	stopInProcess := func() {}
	if len(addrs) == 0 {
		addr, stop, err := startInProcessRedis()
		if err != nil {
			return nil, nil, fmt.Errorf("sidecar: in-process Redis: %w", err)
		}
		c.Logger.Warn(tryOutWarning(c))
		addrs, stopInProcess = []string{addr}, stop
	}
	t := c.target()
	t.Addrs = addrs
	o := &redis.UniversalOptions{
		// A timed-out script may have run: never retry it. Context
		// deadlines carry the limiter's budget; a wait for a pooled
		// connection is bounded near it, and a warm pool keeps dials out of
		// the request path.
		MaxRetries:            -1,
		ContextTimeoutEnabled: true,
		PoolTimeout:           c.Limiter.Budget,
		// Enough connections that concurrent checks do not wait for one,
		// opened ahead (warmUp, MinIdleConns); a refused dial is not retried
		// (go-redis would pause 100 ms between dials).
		PoolSize:      poolSize,
		MinIdleConns:  poolIdle,
		DialerRetries: 1,
		// For calls without a deadline of their own (none on the request
		// path): a silent Redis holds them this long at most. go-redis
		// also cuts a decision's wait here, so it is at least the
		// longest a decision may wait (twice the budget).
		ReadTimeout:  max(time.Second, 2*c.Limiter.Budget+100*time.Millisecond),
		WriteTimeout: max(time.Second, 2*c.Limiter.Budget+100*time.Millisecond),
		DialTimeout:  time.Second,
	}
	if mem != nil {
		o.OnConnect = mem.OnConnect
	}
	// Sentinel: go-redis's failover client asks the Sentinels at Addrs for
	// the master (MasterName), and follows its failovers.
	rdb := redis.NewUniversalClient(t.universal(o))
	return rdb, func() {
		rdb.Close()
		stopInProcess()
	}, nil
}

func redisName(c *serveConfig) string { return c.target().describe() }

// checkRedis asks each --redis address what it is (INFO) and refuses a
// mismatch with the flags, naming the flag that fixes it: a Cluster node
// without --redis-cluster (2/3 of a 3-master Cluster's keys would answer
// MOVED, and every such decision would fall to the failure modes), a node
// that is not one with it, a Sentinel without --redis-sentinel (it answers
// no script), an address that is not a Sentinel with it, a Sentinel that
// does not monitor that master, and a replica as a single node (READONLY).
// An address that does not answer within a second is not checked: Redis may
// come up after the sidecar, which then follows the failure modes, and a
// MOVED reply makes it unready (enforcer.Limiter.Misrouted).
func checkRedis(ctx context.Context, c *serveConfig) error {
	cluster := c.RedisCluster || len(c.Redis) > 1
	for _, addr := range c.Redis {
		o := &redis.Options{Addr: addr}
		if c.RedisSentinel != "" {
			c.RedisAuth.sentinelOptions(o)
		} else {
			c.RedisAuth.options(o)
		}
		info, err := redisInfo(ctx, o)
		if err != nil {
			if cause := enforcer.ClassifyRedisError(err); cause.Config() {
				if err := refusedAtStart(c, addr, cause, err); err != nil {
					return err
				}
				c.Logger.Warn("redis refuses INFO: its kind (single node, Cluster, Sentinel) is not checked", "addr", addr, "cause", cause.String(), "err", err)
			} else {
				c.Logger.Warn("redis does not answer: its kind (single node, Cluster, Sentinel) is not checked", "addr", addr, "err", err)
			}
			continue
		}
		mode := info["redis_mode"]
		switch {
		case c.RedisSentinel != "":
			if mode != "sentinel" {
				return fmt.Errorf("sidecar: --redis %s with --redis-sentinel %s: that address is not a Redis Sentinel (redis_mode:%s): give the Sentinels' addresses", addr, c.RedisSentinel, mode)
			}
			if names := sentinelMasters(info); !slices.Contains(names, c.RedisSentinel) {
				return fmt.Errorf("sidecar: --redis-sentinel %s: the Sentinel at %s does not monitor that master (it monitors %q)", c.RedisSentinel, addr, names)
			}
		case mode == "sentinel":
			return fmt.Errorf("sidecar: --redis %s is a Redis Sentinel, which decides nothing: add --redis-sentinel MASTER (it monitors %q)", addr, sentinelMasters(info))
		case cluster && info["cluster_enabled"] != "1":
			return fmt.Errorf("sidecar: --redis %s with --redis-cluster (or several --redis addresses): that node is not in a Redis Cluster (cluster_enabled:%s): give one address without --redis-cluster", addr, info["cluster_enabled"])
		case !cluster && info["cluster_enabled"] == "1":
			return fmt.Errorf("sidecar: --redis %s is a Redis Cluster node: add --redis-cluster, or the keys of the other nodes' slots answer MOVED and their decisions fall to the failure modes", addr)
		case !cluster && info["role"] == "slave":
			return fmt.Errorf("sidecar: --redis %s is a replica (of %s:%s), which refuses the limiter's writes (READONLY): give its master, or its Sentinels with --redis-sentinel MASTER", addr, info["master_host"], info["master_port"])
		}
	}
	return nil
}

// redisInfo returns the fields of the INFO of o's node (the default
// sections: server, replication, cluster; a Sentinel's sentinel section),
// asked within a second with o's address, credentials and TLS.
func redisInfo(ctx context.Context, o *redis.Options) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	o.MaxRetries, o.DialerRetries, o.ContextTimeoutEnabled, o.PoolSize = -1, 1, true, 1
	o.DisableIdentity = true // a Sentinel knows no CLIENT SETINFO
	rc := redis.NewClient(o)
	defer rc.Close()
	text, err := rc.Info(ctx).Result()
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			m[k] = v
		}
	}
	return m, nil
}

// sentinelMasters returns the names of the masters a Sentinel's INFO lists
// (master0:name=sluice,status=ok,...).
func sentinelMasters(info map[string]string) []string {
	var names []string
	for k, v := range info {
		if !strings.HasPrefix(k, "master") {
			continue
		}
		if name, ok := strings.CutPrefix(v, "name="); ok {
			name, _, _ = strings.Cut(name, ",")
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

func rulesSource(c *serveConfig) string {
	switch {
	case c.RulesRedis:
		return "redis"
	case c.RulesFile != "":
		return "file"
	}
	return "built-in"
}
