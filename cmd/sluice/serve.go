package main

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"golang.org/x/net/netutil"

	"github.com/sluice-rl/sluice/analytics"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/enforcer/sidecar"
	"github.com/sluice-rl/sluice/pipeline"
	"github.com/sluice-rl/sluice/pipeline/gcounter"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
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
	UsageClickHouse analytics.ConnOptions
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
func runServe(ctx context.Context, c serveConfig) error {
	if c.GRPCAddr == "" {
		c.GRPCAddr = defaultGRPCAddr
	}
	if c.HTTPAddr == "" {
		c.HTTPAddr = defaultHTTPAddr
	}
	if c.DrainDelay < 0 {
		return fmt.Errorf("sidecar: drain delay %v must be positive (or 0 for none)", c.DrainDelay)
	}
	if c.Refresh < 0 || c.DrainTimeout < 0 || c.Limiter.Budget < 0 || c.RulesPoll < 0 || c.StatusWait < 0 {
		return fmt.Errorf("sidecar: refresh %v, drain timeout %v, budget %v, rules poll %v and status wait %v must be positive (or 0 for the default)", c.Refresh, c.DrainTimeout, c.Limiter.Budget, c.RulesPoll, c.StatusWait)
	}
	if c.Limiter.Instances < 0 {
		return fmt.Errorf("sidecar: --instances %d: want at least 1", c.Limiter.Instances)
	}
	if c.Limiter.Regions < 0 {
		return fmt.Errorf("sidecar: --regions %d: want at least 1", c.Limiter.Regions)
	}
	for _, a := range c.Redis {
		if err := hostPort(a); err != nil {
			return fmt.Errorf("sidecar: Redis address %q: want host:port (%v)", a, err)
		}
	}
	if c.RedisCluster && len(c.Redis) == 0 {
		return errors.New("sidecar: --redis-cluster needs the Cluster's addresses in --redis")
	}
	if c.RedisSentinel != "" && (c.RedisCluster || len(c.Redis) == 0) {
		return fmt.Errorf("sidecar: --redis-sentinel %s needs the Sentinels' addresses in --redis, and no --redis-cluster", c.RedisSentinel)
	}
	if c.Refresh == 0 {
		c.Refresh = time.Second
	}
	if c.Limiter.ShareRefresh == 0 {
		c.Limiter.ShareRefresh = c.Refresh // the soonest a new share arrives: a share of 0 waits for it
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 10 * time.Second
	}
	if c.Limiter.Budget == 0 {
		c.Limiter.Budget = defaultBudget(&c)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	log := c.Logger
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	// The watcher applies sets into set until the limiter exists, then into
	// the limiter. Apply runs in Load here, and later in the watcher's
	// goroutine, started after lim is set.
	set := sidecar.ExampleRules()
	var lim *enforcer.Limiter
	apply := func(s *rules.Set) {
		if lim == nil {
			set = s
		} else {
			lim.SetRules(s)
		}
	}
	var w *store.Watcher
	newWatcher := func(rdb redis.UniversalClient) (err error) {
		wo := store.WatchOptions{Apply: apply, Poll: c.RulesPoll, Logger: log, Registerer: reg, Redis: rdb}
		if rdb == nil {
			wo.File = c.RulesFile
		} else {
			// Reports the version it holds under this name, for pushes and
			// `sluice rules list`.
			wo.Instance = c.Limiter.Instance
			if wo.Instance == "" {
				wo.Instance, _ = os.Hostname()
			}
		}
		w, err = store.NewWatcher(wo)
		return err
	}
	switch {
	case c.RulesRedis && c.RulesFile != "":
		var err error
		if set, err = rules.Load(c.RulesFile); err != nil {
			return err
		}
		set.Version = 0 // any stored version replaces it
	case c.RulesRedis:
		set = rules.NewSet("", 0, nil)
	case c.RulesFile != "":
		// The file is read once here so that an unreadable or invalid one
		// is reported once, as the command's error: the watcher's Load
		// would also log it, as it does for a later reload.
		if _, err := rules.Load(c.RulesFile); err != nil {
			return fmt.Errorf("sidecar: rule file: %w", err)
		}
		if err := newWatcher(nil); err != nil {
			return err
		}
		if r := w.Load(ctx); r.Result != store.Applied {
			return fmt.Errorf("sidecar: rule file: %s: %w", r.Result, r.Err)
		}
	}

	if err := checkRedis(ctx, &c); err != nil {
		return err
	}
	var mem *enforcer.MemoryPolicy // its maxmemory-policy, read on every connection
	if len(c.Redis) > 0 {
		var err error
		if mem, err = enforcer.NewMemoryPolicy(enforcer.MemoryPolicyOptions{AllowEviction: c.RedisAllowEviction, Logger: log, Registerer: reg}); err != nil {
			return err
		}
	}
	rdb, closeRedis, err := openRedis(&c, mem)
	if err != nil {
		return err
	}
	defer closeRedis()
	if c.RulesRedis {
		if err := newWatcher(rdb); err != nil {
			return err
		}
	}
	tr, err := openTracing(ctx, log, attribute.String("cloud.region", c.Limiter.Region), attribute.String("service.instance.id", c.Limiter.Instance))
	if err != nil {
		return err
	}
	defer tr.Close(log) // after the servers: flushes their last spans
	lo := c.Limiter
	lo.Logger, lo.Registerer = log, reg
	lo.Tracer = tr.Tracer("github.com/sluice-rl/sluice/enforcer")
	if len(c.Homes) > 0 {
		lo.Homes = make(map[string]redis.UniversalClient, len(c.Homes))
		for region, addr := range c.Homes {
			h, err := openHome(&c, region, addr)
			if err != nil {
				return err
			}
			defer h.Close()
			lo.Homes[region] = h
		}
	}
	var join *sidecar.StatusJoin
	var records sidecar.Pinger
	if len(c.Brokers) > 0 {
		p, err := pipeline.NewProducer(pipeline.ProducerOptions{Brokers: c.Brokers, Logger: log, Registerer: reg})
		if err != nil {
			return err
		}
		defer p.Close() // after the servers have stopped: flushes what they logged
		records = p
		// The access log's statuses also feed adaptive rules (lim is set below, before the
		// sidecar serves the access-log service).
		observe := func(now time.Time, status int, latency time.Duration) { lim.ObserveResponse(now, status, latency) }
		if join, err = sidecar.NewStatusJoin(p, sidecar.StatusJoinOptions{Wait: c.StatusWait, Registerer: reg, Observe: observe}); err != nil {
			return err
		}
		defer join.Close() // before p closes: logs what it holds
		lo.Sink = join
	}
	if c.KeyStore {
		lo.Keys = store.NewKeyCache(store.NewRedisKeys(rdb), 0, 0)
	}
	if lim, err = enforcer.New(rdb, set, lo); err != nil {
		return err
	}
	var qp *gcounter.QuotaPublisher // this region's G-Counter counts, for the other regions
	if len(c.Brokers) > 0 {
		if qp, err = gcounter.NewQuotaPublisher(gcounter.QuotaPublisherOptions{Brokers: c.Brokers, Source: lim,
			Topic: c.QuotaTopic, Interval: c.QuotaInterval, Logger: log, Registerer: reg}); err != nil {
			return err
		}
		defer qp.Close()
	}
	probe, err := enforcer.NewProbe(rdb, enforcer.ProbeOptions{Instance: lo.Instance, Memory: mem, Logger: log, Registerer: reg})
	if err != nil {
		return err
	}
	so := c.Server
	so.Redis, so.Registry, so.Logger, so.StatusJoin, so.Records, so.Probe = rdb, reg, log, join, records, probe
	so.Tracer = tr.Tracer("github.com/sluice-rl/sluice/enforcer/sidecar")
	if so.RequireRecords && records == nil {
		return errors.New("sidecar: --ready-needs-kafka needs --brokers: without them no decision record is sent")
	}
	so.RequireRules = so.RequireRules || c.RulesRedis
	denials, closeDenials, err := usageDenials(&c)
	if err != nil {
		return err
	}
	defer closeDenials()
	so.Usage.Denials = denials
	srv, err := sidecar.New(lim, so)
	if err != nil {
		return err
	}
	warm, cancel := context.WithTimeout(ctx, 2*time.Second)
	if c.RulesRedis {
		// Invalid sets are logged by the watcher; a missing one here.
		if r := w.Load(warm); r.Result == store.Failed {
			log.Warn("no rule set from Redis yet: the initial one stays until one is pushed (sluice rules push)",
				"rules", len(set.Rules), "err", r.Err)
		}
	}
	set = lim.Rules()
	if join == nil && reactsToBackend(set) {
		log.Warn("the rule set has adaptive rules or a shedding block, but without --brokers the sidecar runs no access-log status join, so it sees no response statuses: adaptive factors stay at 1 and nothing is shed for backend health (docs/enforcement.md, \"Adaptive limits\")")
	}
	if n := len(set.Rules); n > enforcer.MaxRules {
		log.Warn("the rule set has more rules than one request may match; a request that matches more is refused (400, InvalidArgument)", "rules", n, "max_per_request", enforcer.MaxRules)
	}
	if err := checkRedisStart(warm, &c, probe, mem); err != nil {
		cancel()
		return err
	}
	if err := warmUp(warm, rdb, set); err != nil {
		if !enforcer.ClassifyRedisError(err).Config() { // else the probe said it
			log.Warn("redis does not answer yet: decisions follow each rule's failure mode until it does", "err", err)
		}
	} else if err := lim.Refresh(warm, time.Now()); err != nil {
		log.Warn("loading dynamic rules and shares", "err", err)
	}
	cancel()

	listen := c.Listen
	if listen == nil {
		var lc net.ListenConfig
		listen = lc.Listen
	}
	gl, err := listen(ctx, "tcp", c.GRPCAddr)
	if err != nil {
		return fmt.Errorf("sidecar: gRPC listener: %w", err)
	}
	hl, err := listen(ctx, "tcp", c.HTTPAddr)
	if err != nil {
		gl.Close()
		return fmt.Errorf("sidecar: HTTP listener: %w", err)
	}
	adm, err := openAdmin(ctx, listen, c.AdminAddr, srv, log)
	if err != nil {
		gl.Close()
		hl.Close()
		return err
	}
	warnExposed(log, gl.Addr(), hl.Addr())
	// At most maxGRPCConns connections at once; more wait in the kernel's
	// backlog. With the server's handshake, idle and stream bounds
	// (sidecar.NewGRPCServer), silent clients cannot hold the sidecar.
	gl = netutil.LimitListener(gl, maxGRPCConns)
	gs := srv.NewGRPCServer()
	hs := &http.Server{
		Handler:           srv.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		// A check's body is small (MaxBody): a client that has not sent it
		// within this is not a gateway.
		ReadTimeout:  10 * time.Second,
		WriteTimeout: 10 * time.Second,
		IdleTimeout:  2 * time.Minute,
		// Forward-auth reads a request from headers: bounded as a body is.
		MaxHeaderBytes: int(max(so.MaxBody, sidecar.DefaultOptions().MaxBody)),
		ErrorLog:       slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	log.Info("sluice sidecar serving", "grpc", gl.Addr().String(), "http", hl.Addr().String(), "admin", adm.addr(),
		"domain", set.Domain, "rules", len(set.Rules), "rules_version", set.Version, "rules_source", rulesSource(&c),
		"redis", redisName(&c), "decision_records", len(c.Brokers) > 0)
	if c.Listening != nil {
		c.Listening(gl.Addr(), hl.Addr())
	}

	// One run group: a server or a loop that stops on its own stops the
	// sidecar, with its error; SIGTERM (ctx) drains first, as below.
	g := newRunGroup(ctx)
	g.addStop("gRPC server", func() error { return gs.Serve(gl) }, func() {})
	g.addStop("HTTP server", func() error {
		if err := hs.Serve(hl); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}, func() {})
	if adm != nil {
		g.addStop("admin HTTP server", adm.serve, func() {})
	}
	g.add("redis probe", func(ctx context.Context) error {
		probe.Run(ctx, c.Refresh)
		return nil
	})
	g.add("refresh", func(ctx context.Context) error {
		refresh(ctx, c.Refresh, lim, srv, log)
		return nil
	})
	if w != nil {
		g.add("rule watcher", w.Run)
	}
	if qp != nil {
		g.add("quota publisher", qp.Run)
	}
	if join != nil {
		g.add("status join", func(ctx context.Context) error {
			join.Run(ctx) // closes on shutdown, after which records pass at once
			return nil
		})
	}
	// The drain: the servers' stop, whatever stopped the group. It returns
	// when both servers have stopped, so the run ends after them.
	drained := make(chan struct{})
	g.addStop("drain", func() error { <-drained; return nil }, func() {
		defer close(drained)
		srv.Drain()
		if c.DrainDelay > 0 {
			// Unready, still answering: probes and load balancers see the
			// 503 (and NOT_SERVING) before any connection is refused.
			log.Info("sluice sidecar unready, still answering checks", "delay", c.DrainDelay.String())
			time.Sleep(c.DrainDelay)
		}
		log.Info("sluice sidecar draining", "timeout", c.DrainTimeout.String())
		dctx, cancel := context.WithTimeout(context.Background(), c.DrainTimeout)
		defer cancel()
		stopped := make(chan struct{})
		go func() {
			gs.GracefulStop()
			close(stopped)
		}()
		if err := hs.Shutdown(dctx); err != nil {
			hs.Close()
		}
		adm.shutdown(dctx)
		select {
		case <-stopped:
		case <-dctx.Done():
			gs.Stop() // in-flight RPCs past the timeout are cut
			<-stopped
		}
	})
	err = g.wait()
	if err != nil {
		log.Error("sluice sidecar stopping", "err", err)
	}
	log.Info("sluice sidecar stopped")
	return err
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

// The default gRPC address, and the most gRPC connections served at once.
const (
	defaultGRPCAddr = "127.0.0.1:8081"
	maxGRPCConns    = 512
)

// The Redis pool of a sidecar: checks in flight at once, and connections kept
// open ahead.
const poolSize, poolIdle = 128, 32

// openHome returns a client on another region's Redis at addr (HOST:PORT,
// or a URL with its own credentials), for pinned rules: no retries, the
// limiter's HomeBudget as deadline (a WAN round trip).
func openHome(c *serveConfig, region, addr string) (*redis.Client, error) {
	budget := c.Limiter.HomeBudget
	if budget <= 0 {
		budget = 500 * time.Millisecond
	}
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

// openRedis returns the Redis client serveConfig asks for, set up as the
// limiter needs it, with its credentials and TLS, and mem reading the
// maxmemory-policy on every new connection (nil: not read), and what
// closes it.
func openRedis(c *serveConfig, mem *enforcer.MemoryPolicy) (redis.UniversalClient, func(), error) {
	addrs := c.Redis
	var m *miniredis.Miniredis
	if len(addrs) == 0 {
		m = miniredis.NewMiniRedis()
		if err := m.Start(); err != nil {
			return nil, nil, fmt.Errorf("sidecar: in-process Redis: %w", err)
		}
		c.Logger.Warn(tryOutWarning(c))
		addrs = []string{m.Addr()}
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
		if m != nil {
			m.Close()
		}
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
