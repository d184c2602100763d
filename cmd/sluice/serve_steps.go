package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"golang.org/x/net/netutil"

	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/enforcer/sidecar"
	"github.com/sluice-rl/sluice/pipeline"
	"github.com/sluice-rl/sluice/pipeline/gcounter"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

// check validates c and fills its defaults.
func (c *serveConfig) check() error {
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
	// Found by a fresh user: --budget 1h (a stalled Redis then holds every
	// check for up to two hours) and --refresh 1ms (a thousand reloads of
	// the dynamic rules and shares a second) were taken.
	if c.Limiter.Budget > maxBudget {
		return fmt.Errorf("sidecar: budget %v: at most %v (a check waits up to twice its budget for Redis, and a gateway's timeout for the limiter is far shorter: Envoy's default is 20 ms)", c.Limiter.Budget, maxBudget)
	}
	if c.Refresh > 0 && c.Refresh < minRefresh {
		return fmt.Errorf("sidecar: refresh %v: at least %v (each refresh reads the dynamic rules, the shares and readiness from Redis)", c.Refresh, minRefresh)
	}
	if c.Limiter.Fallback.Instances < 0 {
		return fmt.Errorf("sidecar: --instances %d: want at least 1, or 0 to learn it through Redis", c.Limiter.Fallback.Instances)
	}
	if c.Limiter.Regions < 0 {
		return fmt.Errorf("sidecar: --regions %d: want at least 1", c.Limiter.Regions)
	}
	if err := c.checkRedisFlags(); err != nil {
		return err
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
		c.Limiter.Budget = defaultBudget(c)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// checkRedisFlags checks the Redis addresses and their kind's flags.
func (c *serveConfig) checkRedisFlags() error {
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
	return nil
}

// sidecarRun is one run of the sidecar: what its steps open, in the order
// runServe opens them, and what closes them (in the reverse order).
type sidecarRun struct {
	c   serveConfig
	log *slog.Logger
	reg *prometheus.Registry

	// The rule set in force until the limiter exists (the watcher applies
	// into it, then into the limiter), and the watcher.
	set *rules.Set
	w   *store.Watcher

	mem     *enforcer.MemoryPolicy // its maxmemory-policy, read on every connection
	rdb     redis.UniversalClient
	tr      *tracing
	lo      enforcer.Options
	join    *sidecar.StatusJoin
	records sidecar.Pinger
	lim     *enforcer.Limiter
	qp      *gcounter.QuotaPublisher // this region's G-Counter counts, for the other regions
	probe   *enforcer.Probe
	homes   map[string]*enforcer.Probe // each --home region's Redis, probed as probe is
	srv     *sidecar.Server
	gl, hl  net.Listener
	al      net.Listener // --admin-http's, nil without one
	adm     *adminServer // the probes' and metrics' server (on al), nil without one

	closers []func()
}

func newSidecarRun(c serveConfig) *sidecarRun {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return &sidecarRun{c: c, log: c.Logger, reg: reg, set: sidecar.ExampleRules()}
}

// onClose registers f to run at close, before those registered earlier.
func (s *sidecarRun) onClose(f func()) { s.closers = append(s.closers, f) }

func (s *sidecarRun) close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
}

// apply puts a rule set in force: into s.set until the limiter exists, then
// into the limiter. It runs in the watcher's Load during the steps, and
// later in the watcher's goroutine, started after the limiter is set.
func (s *sidecarRun) apply(set *rules.Set) {
	if s.lim == nil {
		s.set = set
	} else {
		s.lim.SetRules(set)
	}
}

// newWatcher makes the rule watcher: of the rule file (rdb nil) or of the
// region's rule-set store.
func (s *sidecarRun) newWatcher(rdb redis.UniversalClient) (err error) {
	wo := store.WatchOptions{Apply: s.apply, Poll: s.c.RulesPoll, Logger: s.log, Registerer: s.reg, Redis: rdb}
	if rdb == nil {
		wo.File = s.c.RulesFile
	} else {
		// Reports the version it holds under this name, for pushes and
		// `sluice rules list`.
		wo.Instance = s.c.Limiter.Instance
		if wo.Instance == "" {
			wo.Instance, _ = os.Hostname()
		}
	}
	s.w, err = store.NewWatcher(wo)
	return err
}

// loadRules reads the rule set in force at the start: the rule file's, an
// empty one to be replaced from Redis, or the example rules.
func (s *sidecarRun) loadRules(ctx context.Context) error {
	c := &s.c
	switch {
	case c.RulesRedis && c.RulesFile != "":
		set, err := rules.Load(c.RulesFile)
		if err != nil {
			return err
		}
		set.Version = 0 // any stored version replaces it
		s.set = set
	case c.RulesRedis:
		s.set = rules.NewSet("", 0, nil)
	case c.RulesFile != "":
		// The file is read once here so that an unreadable or invalid one
		// is reported once, as the command's error: the watcher's Load
		// would also log it, as it does for a later reload.
		if _, err := rules.Load(c.RulesFile); err != nil {
			return fmt.Errorf("sidecar: rule file: %w", err)
		}
		if err := s.newWatcher(nil); err != nil {
			return err
		}
		if r := s.w.Load(ctx); r.Result != store.Applied {
			return fmt.Errorf("sidecar: rule file: %s: %w", r.Result, r.Err)
		}
	}
	return nil
}

// openRedis checks what the --redis addresses are and opens the client (and,
// with --rules-redis, the rule-set store's watcher on it).
func (s *sidecarRun) openRedis(ctx context.Context) error {
	c := &s.c
	if err := checkRedis(ctx, c); err != nil {
		return err
	}
	if len(c.Redis) > 0 {
		var err error
		if s.mem, err = enforcer.NewMemoryPolicy(enforcer.MemoryPolicyOptions{AllowEviction: c.RedisAllowEviction, Logger: s.log, Registerer: s.reg}); err != nil {
			return err
		}
	}
	rdb, closeRedis, err := openRedis(c, s.mem)
	if err != nil {
		return err
	}
	s.rdb = rdb
	s.onClose(closeRedis)
	if c.RulesRedis {
		return s.newWatcher(rdb)
	}
	return nil
}

// openTracing sets up OpenTelemetry tracing (off unless configured).
func (s *sidecarRun) openTracing(ctx context.Context) error {
	tr, err := openTracing(ctx, s.log, attribute.String("cloud.region", s.c.Limiter.Region), attribute.String("service.instance.id", s.c.Limiter.Instance))
	if err != nil {
		return err
	}
	s.tr = tr
	s.onClose(func() { tr.Close(s.log) }) // after the servers: flushes their last spans
	s.lo = s.c.Limiter
	s.lo.Logger, s.lo.Registerer = s.log, s.reg
	s.lo.Tracer = tr.Tracer("github.com/sluice-rl/sluice/enforcer")
	return nil
}

// openHomes opens a client on each other region's Redis (--home), for
// pinned rules.
func (s *sidecarRun) openHomes(context.Context) error {
	if len(s.c.Homes) == 0 {
		return nil
	}
	s.lo.Homes = make(map[string]redis.UniversalClient, len(s.c.Homes))
	for region, addr := range s.c.Homes {
		h, err := openHome(&s.c, region, addr)
		if err != nil {
			return err
		}
		s.onClose(func() { h.Close() })
		s.lo.Homes[region] = h
		p, err := enforcer.NewProbe(h, enforcer.ProbeOptions{Instance: s.c.Limiter.Instance, Timeout: homeBudget(&s.c) + time.Second,
			Logger: s.log.With("home", region)})
		if err != nil {
			return err
		}
		if s.homes == nil {
			s.homes = map[string]*enforcer.Probe{}
		}
		s.homes[region] = p
	}
	return nil
}

// openRecords starts the decision-record producer and the access log's
// status join when --brokers are given.
func (s *sidecarRun) openRecords(context.Context) error {
	if len(s.c.Brokers) == 0 {
		return nil
	}
	p, err := pipeline.NewProducer(pipeline.ProducerOptions{Brokers: s.c.Brokers, Logger: s.log, Registerer: s.reg})
	if err != nil {
		return err
	}
	s.onClose(func() { p.Close() }) // after the servers have stopped: flushes what they logged
	s.records = p
	// The access log's statuses also feed adaptive rules (the limiter is set
	// by the next steps, before the sidecar serves the access-log service).
	observe := func(now time.Time, status int, latency time.Duration) { s.lim.ObserveResponse(now, status, latency) }
	if s.join, err = sidecar.NewStatusJoin(p, sidecar.StatusJoinOptions{Wait: s.c.StatusWait, Registerer: s.reg, Observe: observe}); err != nil {
		return err
	}
	s.onClose(func() { s.join.Close() }) // before the producer closes: logs what it holds
	s.lo.Sink = s.join
	return nil
}

// newLimiter makes the limiter.
func (s *sidecarRun) newLimiter(context.Context) (err error) {
	if s.c.KeyStore {
		s.lo.Keys = store.NewKeyCache(store.NewRedisKeys(s.rdb), 0, 0)
	}
	if s.lim, err = enforcer.New(s.rdb, s.set, s.lo); err != nil {
		return err
	}
	// Closing leaves the region's count of enforcers, which the start-up
	// check's heartbeat joined: also when a later step fails (a port taken).
	s.closers = append(s.closers, s.lim.Close)
	return nil
}

// newQuotaPublisher publishes this region's G-Counter counts to the other
// regions when --brokers are given.
func (s *sidecarRun) newQuotaPublisher(context.Context) (err error) {
	if len(s.c.Brokers) == 0 {
		return nil
	}
	if s.qp, err = gcounter.NewQuotaPublisher(gcounter.QuotaPublisherOptions{Brokers: s.c.Brokers, Source: s.lim,
		Topic: s.c.QuotaTopic, Interval: s.c.QuotaInterval, Logger: s.log, Registerer: s.reg}); err != nil {
		return err
	}
	s.onClose(func() { s.qp.Close() })
	return nil
}

// newServer makes the readiness probe and the APIs (gRPC, HTTP).
func (s *sidecarRun) newServer(context.Context) (err error) {
	if s.probe, err = enforcer.NewProbe(s.rdb, enforcer.ProbeOptions{Instance: s.lo.Instance, Memory: s.mem, Logger: s.log, Registerer: s.reg}); err != nil {
		return err
	}
	so := s.c.Server
	so.Redis, so.Registry, so.Logger, so.StatusJoin, so.Records, so.Probe = s.rdb, s.reg, s.log, s.join, s.records, s.probe
	so.InProcessRedis = len(s.c.Redis) == 0
	for region, p := range s.homes {
		if so.HomeProbes == nil {
			so.HomeProbes = map[string]sidecar.RedisProbe{}
		}
		so.HomeProbes[region] = p
	}
	so.Tracer = s.tr.Tracer("github.com/sluice-rl/sluice/enforcer/sidecar")
	if so.RequireRecords && s.records == nil {
		return errors.New("sidecar: --ready-needs-kafka needs --brokers: without them no decision record is sent")
	}
	so.RequireRules = so.RequireRules || s.c.RulesRedis
	denials, closeDenials, err := usageDenials(&s.c)
	if err != nil {
		return err
	}
	s.onClose(closeDenials)
	so.Usage.Denials = denials
	s.srv, err = sidecar.New(s.lim, so)
	return err
}

// warm loads the rule set from Redis (--rules-redis), warns about rule sets
// the sidecar cannot serve as they ask, checks Redis's start, and warms the
// script cache, the pools and the dynamic rules, within 2 s.
func (s *sidecarRun) warm(ctx context.Context) error {
	warm, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if s.c.RulesRedis {
		// Invalid sets are logged by the watcher; a missing one here.
		if r := s.w.Load(warm); r.Result == store.Failed {
			s.log.Warn("no rule set from Redis yet: the initial one stays until one is pushed (sluice rules push)",
				"rules", len(s.set.Rules), "err", r.Err)
		}
	}
	s.set = s.lim.Rules()
	if s.join == nil && reactsToBackend(s.set) {
		s.log.Warn("the rule set has adaptive rules or a shedding block, but without --brokers the sidecar runs no access-log status join, so it sees no response statuses: adaptive factors stay at 1 and nothing is shed for backend health (docs/enforcement.md, \"Adaptive limits\")")
	}
	if n := len(s.set.Rules); n > enforcer.MaxRules {
		s.log.Warn("the rule set has more rules than one request may match; a request that matches more is refused (400, InvalidArgument)", "rules", n, "max_per_request", enforcer.MaxRules)
	}
	if err := checkRedisStart(warm, &s.c, s.probe, s.mem); err != nil {
		return err
	}
	if s.probe == nil || s.probe.Status().Err == nil { // Redis answers: else the probe has said why
		checkRedisExtras(warm, &s.c, s.rdb)
	}
	if err := checkHomesStart(warm, &s.c, s.homes); err != nil {
		return err
	}
	if err := s.lim.CheckHeartbeat(warm); err != nil && !s.c.RedisStartDegraded {
		if cause := enforcer.ClassifyRedisError(err); cause.Config() {
			return fmt.Errorf("sidecar: redis refuses the enforcer-count heartbeat at start (%s): %v: %s; or pass --redis-start-degraded to start anyway, with the local fallback dividing by the last count (or 1)", cause, err, startFix(cause, err))
		}
	}
	if err := warmUp(warm, s.rdb, s.set); err != nil {
		if !enforcer.ClassifyRedisError(err).Config() { // else the probe said it
			s.log.Warn("redis does not answer yet: decisions follow each rule's failure mode until it does", "err", err)
		}
	} else if err := s.lim.Refresh(warm, time.Now()); err != nil {
		s.log.Warn("loading dynamic rules and shares", "err", err)
	}
	return nil
}

// bind opens the gRPC, HTTP and admin listeners, first of the steps: an
// address in use is said at once, not after the Redis checks and the
// warm-up (up to seconds with Redis down). Connections wait in the kernel's
// backlog until run serves them. The listeners are closed at close (a
// second Close of a served one does nothing).
func (s *sidecarRun) bind(ctx context.Context) (err error) {
	listen := s.c.Listen
	if listen == nil {
		var lc net.ListenConfig
		listen = lc.Listen
	}
	if s.gl, err = listen(ctx, "tcp", s.c.GRPCAddr); err != nil {
		return fmt.Errorf("sidecar: gRPC listener: %w", err)
	}
	gl := s.gl
	s.onClose(func() { gl.Close() })
	if s.hl, err = listen(ctx, "tcp", s.c.HTTPAddr); err != nil {
		return fmt.Errorf("sidecar: HTTP listener: %w", err)
	}
	hl := s.hl
	s.onClose(func() { hl.Close() })
	if s.c.AdminAddr != "" {
		if s.al, err = listen(ctx, "tcp", s.c.AdminAddr); err != nil {
			return fmt.Errorf("sidecar: admin HTTP listener (--admin-http): %w", err)
		}
		al := s.al
		s.onClose(func() { al.Close() })
	}
	warnExposed(s.log, s.gl.Addr(), s.hl.Addr())
	return nil
}

// listen readies the listeners bind opened for run: the admin server, and
// the bound on gRPC connections.
func (s *sidecarRun) listen(context.Context) error {
	s.adm = newAdmin(s.al, s.srv, s.log)
	if !s.c.Server.ForwardAuth.Off {
		warnTrustAll(s.log, s.c.Server.ForwardAuth.TrustedProxies)
	}
	// At most maxGRPCConns connections at once; more wait in the kernel's
	// backlog. With the server's handshake, idle and stream bounds
	// (sidecar.NewGRPCServer), silent clients cannot hold the sidecar.
	s.gl = netutil.LimitListener(s.gl, maxGRPCConns)
	return nil
}

// run serves until ctx ends or a server or loop stops, in one run group:
// the servers, the probe, the refresh, the rule watcher, the quota
// publisher and the status join; SIGTERM (ctx) drains first (see drain).
func (s *sidecarRun) run(ctx context.Context) error {
	c, log := &s.c, s.log
	gs := s.srv.NewGRPCServer()
	hs := &http.Server{
		Handler:           s.srv.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		// A check's body is small (MaxBody): a client that has not sent it
		// within this is not a gateway.
		ReadTimeout:  10 * time.Second,
		WriteTimeout: 10 * time.Second,
		IdleTimeout:  2 * time.Minute,
		// Forward-auth reads a request from headers: bounded as a body is.
		MaxHeaderBytes: int(max(c.Server.MaxBody, sidecar.DefaultOptions().MaxBody)),
		ErrorLog:       slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	log.Info("sluice sidecar serving", "grpc", s.gl.Addr().String(), "http", s.hl.Addr().String(), "admin", s.adm.addr(),
		"domain", s.set.Domain, "rules", len(s.set.Rules), "rules_version", s.set.Version, "rules_source", rulesSource(c),
		"redis", redisName(c), "decision_records", len(c.Brokers) > 0)
	if c.Listening != nil {
		c.Listening(s.gl.Addr(), s.hl.Addr())
	}

	// One run group: a server or a loop that stops on its own stops the
	// sidecar, with its error; SIGTERM (ctx) drains first, as below.
	g := newRunGroup(ctx)
	g.addStop("gRPC server", func() error { return gs.Serve(s.gl) }, func() {})
	g.addStop("HTTP server", func() error {
		if err := hs.Serve(s.hl); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}, func() {})
	if s.adm != nil {
		g.addStop("admin HTTP server", s.adm.serve, func() {})
	}
	g.add("redis probe", func(ctx context.Context) error {
		s.probe.Run(ctx, c.Refresh)
		return nil
	})
	for region, p := range s.homes {
		g.add("home redis probe "+region, func(ctx context.Context) error {
			p.Run(ctx, c.Refresh)
			return nil
		})
	}
	g.add("refresh", func(ctx context.Context) error {
		refresh(ctx, c.Refresh, s.lim, s.srv, log)
		return nil
	})
	if s.w != nil {
		g.add("rule watcher", s.w.Run)
	}
	if s.qp != nil {
		g.add("quota publisher", s.qp.Run)
	}
	if s.join != nil {
		g.add("status join", func(ctx context.Context) error {
			s.join.Run(ctx) // closes on shutdown, after which records pass at once
			return nil
		})
	}
	// The drain: the servers' stop, whatever stopped the group. It returns
	// when both servers have stopped, so the run ends after them.
	drained := make(chan struct{})
	g.addStop("drain", func() error { <-drained; return nil }, func() {
		defer close(drained)
		s.drain(gs, hs)
	})
	err := g.wait()
	if err != nil {
		log.Error("sluice sidecar stopping", "err", err)
	}
	log.Info("sluice sidecar stopped")
	return err
}

// drain stops the servers: unready first, still answering checks, for
// DrainDelay; then the listeners close and in-flight checks finish, up to
// DrainTimeout, after which they are cut.
func (s *sidecarRun) drain(gs interface {
	GracefulStop()
	Stop()
}, hs *http.Server) {
	c, log := &s.c, s.log
	s.srv.Drain()
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
	s.adm.shutdown(dctx)
	select {
	case <-stopped:
	case <-dctx.Done():
		gs.Stop() // in-flight RPCs past the timeout are cut
		<-stopped
	}
}
