// Command sluice is the sluice rate limiter's one binary. It only wires the
// packages; see `sluice help`.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/sluice-rl/sluice/rules"
)

func main() {
	// go-redis logs every failed dial itself; our errors already say so.
	redis.SetLogger(redisLog{})
	// One format for every line, the default logger's too (the SIGHUP
	// notice below, go-redis's and franz-go's through log): slog's
	// key=value, as each command's own logger writes.
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, nil)))
	// The first SIGTERM or SIGINT stops gracefully (serve drains); a second
	// ends the process at once, as a second Ctrl-C does for most servers.
	// The handler stays installed for the second: a process started with
	// SIGINT ignored (a background job of a script) would otherwise fall
	// back to ignoring it (found by a fresh user).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stopping := make(chan os.Signal, 2)
	signal.Notify(stopping, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-stopping
		cancel()
		s := <-stopping
		slog.Warn("second signal: stopping at once, without draining", "signal", s.String())
		os.Exit(128 + int(s.(syscall.Signal)))
	}()
	// SIGHUP, which operators send to reload, would end the process at once
	// (Go's default): the rule file and --rules-redis are followed without
	// it, so it is logged and otherwise ignored (found by a fresh user).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		for range hup {
			slog.Warn("SIGHUP ignored: the rule file (and --rules-redis) is followed without a signal; SIGTERM or SIGINT stops sluice, a second one at once")
		}
	}()
	if err := newRoot().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "sluice:", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "sluice",
		Short:         "sluice: a distributed API rate limiter with a stream-processing abuse detector and quota aggregator",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(serveCmd(), rulesCmd(), versionCmd())
	root.AddCommand(fullCommands()...) // none in the sidecar's build (commands_sidecar.go)
	return root
}

// parseHomes reads --home's values, REGION=ADDR each or several
// comma-separated, refusing a region named twice.
func parseHomes(vals []string) (map[string]string, error) {
	var out map[string]string
	for _, v := range vals {
		for _, kv := range strings.Split(v, ",") {
			region, addr, ok := strings.Cut(kv, "=")
			if !ok {
				return nil, fmt.Errorf("--home %s: want REGION=HOST:PORT or REGION=redis://...", redactURL(kv))
			}
			if _, dup := out[region]; dup {
				return nil, fmt.Errorf("--home: region %q is given twice; give each other region once", region)
			}
			if out == nil {
				out = map[string]string{}
			}
			out[region] = addr
		}
	}
	return out, nil
}

// checkHomes checks each --home: a region name, an address, and neither
// this region nor its Redis.
func (c *serveConfig) checkHomes() error {
	for region, addr := range c.Homes {
		if !rules.ValidID(region) {
			return fmt.Errorf("--home %s=%s: %q is not a region name (1-64 letters, digits, '-', '_' and '.')", region, redactURL(addr), region)
		}
		home, _, _, err := nodeAddr("--home "+region+"=", addr, c.RedisAuth)
		if err != nil {
			return fmt.Errorf("%w (want REGION=HOST:PORT or REGION=redis://...)", err)
		}
		if slices.Contains(c.Redis, home) {
			return fmt.Errorf("--home %s=%s: that is this region's own Redis (--redis); a home is another region's", region, redactURL(addr))
		}
		if region == c.Limiter.Region {
			return fmt.Errorf("--home %s=%s: that is this sidecar's own region (--region), whose Redis is --redis", region, redactURL(addr))
		}
	}
	return nil
}

func serveCmd() *cobra.Command {
	var (
		c                serveConfig
		failClosedStatus int
		applyFrontDoor   func() error
		rf               redisFlags
		homes            []string // --home, REGION=ADDR each (or comma-separated)
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the enforcer sidecar: Envoy's rate limit service over gRPC, /v1/check over HTTP, health and metrics",
		Long: `Serve answers rate-limit checks for a gateway: Envoy's rate limit service
(envoy.service.ratelimit.v3, a drop-in for envoyproxy/ratelimit) on --grpc, and
POST /v1/check (the same request in JSON), /healthz, /readyz and /metrics on
--http. SIGTERM or SIGINT drains: unready first (/readyz 503, gRPC health
NOT_SERVING) for --drain-delay while checks are still answered, then the
listeners close and in-flight checks finish (up to --drain-timeout), then it
exits 0.

--redis is one node, a Cluster (several addresses, or --redis-cluster), or
Sentinels (--redis-sentinel MASTER); at start each address is asked what it
is, and a mismatch (a Cluster node without --redis-cluster, a Sentinel or a
replica as a plain address) is refused with the flag that fixes it. --redis may
be a redis:// or rediss:// URL; --redis-username, --redis-password-file and
the --redis-tls* flags (or REDIS_USERNAME, REDIS_PASSWORD_FILE, ...) give
credentials and TLS; a Redis that refuses them at start stops serve, naming
the flag (docs/operations.md, "Production Redis"). ` + noRedisHelp + ` With no --rules,
the example rules (domain "sluice"); with no --brokers, no decision records.

The --rules file is followed: each valid change is applied whole, an invalid
one is logged and the rules in force stay. With --rules-redis the rule set
comes from the region's Redis instead (see sluice rules push), and --rules is
only the set in force until Redis has one.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			t, err := rf.resolve(cmd.Flags())
			if err != nil {
				return err
			}
			c.setRedis(t)
			if c.Homes, err = parseHomes(homes); err != nil {
				return err
			}
			if !rules.ValidID(c.Limiter.Region) {
				return fmt.Errorf("--region %q: want 1-64 letters, digits, '-', '_' and '.'", c.Limiter.Region)
			}
			if !cmd.Flags().Changed("regions") && len(c.Homes) > 0 {
				c.Limiter.Regions = 0 // from the regions --home names
			} else if c.Limiter.Regions < 1 {
				return fmt.Errorf("--regions %d: want at least 1", c.Limiter.Regions)
			}
			if err := c.checkHomes(); err != nil {
				return err
			}
			if c.QuotaTopic != "" && !validTopic(c.QuotaTopic) {
				return fmt.Errorf("--quota-topic %q: want 1-249 of a-z A-Z 0-9 '.' '_' '-'", c.QuotaTopic)
			}
			if c.Limiter.HomeBudget <= 0 {
				return fmt.Errorf("--home-budget %v: want a positive duration", c.Limiter.HomeBudget)
			}
			if c.Limiter.Fallback.Instances < 0 { // --regions is checked above
				return fmt.Errorf("--instances %d: want at least 1, or 0 to learn the count through Redis", c.Limiter.Fallback.Instances)
			}
			if c.Limiter.Fallback.RememberedKeys == 0 || c.Limiter.Fallback.RememberedKeys > 1<<24 {
				return fmt.Errorf("--remembered-keys %d: want 1 to 16777216, or negative for none", c.Limiter.Fallback.RememberedKeys)
			}
			if c.DrainDelay < 0 {
				return fmt.Errorf("--drain-delay %v: want a positive duration, or 0s for none", c.DrainDelay)
			}
			for _, d := range []struct {
				flag string
				v    time.Duration
			}{{"budget", c.Limiter.Budget}, {"queue-wait", c.Limiter.QueueWait}, {"refresh", c.Refresh}, {"drain-timeout", c.DrainTimeout}, {"rules-poll", c.RulesPoll}, {"status-wait", c.StatusWait}} {
				if d.v <= 0 {
					return fmt.Errorf("--%s %v: want a positive duration", d.flag, d.v)
				}
			}
			if c.Limiter.MaxInFlight == 0 {
				return fmt.Errorf("--max-in-flight 0: want a number of decisions, or a negative number for no limit (default 64 × GOMAXPROCS: leave it out)")
			}
			if failClosedStatus != 429 && failClosedStatus != 503 {
				return fmt.Errorf("--fail-closed-status %d: want 429 or 503", failClosedStatus)
			}
			c.Server.UnavailableStatus = failClosedStatus
			if err := applyFrontDoor(); err != nil {
				return err
			}
			c.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			if !cmd.Flags().Changed("budget") {
				c.Limiter.Budget = 0 // the default: 10 ms, or the try-out's with the in-process Redis
			}
			return runServe(cmd.Context(), c)
		},
	}
	host, _ := os.Hostname()
	f := cmd.Flags()
	f.StringVar(&c.GRPCAddr, "grpc", defaultGRPCAddr, "gRPC listen address (Envoy's rate limit service and access log, gRPC health); loopback by default, for the gateway on this host: give :8081 to serve other hosts")
	f.StringVar(&c.HTTPAddr, "http", defaultHTTPAddr, "HTTP listen address (/v1/check, /v1/forward-auth, /v1/usage, and the probes and metrics); loopback by default, for the gateway on this host: anyone who reaches it can spend any client's tokens")
	f.StringVar(&c.RulesFile, "rules", "", "rule file (YAML), reloaded when it changes; default: the built-in example rules, domain \"sluice\"")
	f.BoolVar(&c.RulesRedis, "rules-redis", false, "take the rule set from the region's Redis (sluice rules push) and follow its pushes; --rules is then only the initial set")
	f.DurationVar(&c.RulesPoll, "rules-poll", time.Second, "how often the rule source (file or Redis) is re-checked besides its change events")
	rf.add(f, "Redis address; several (comma-separated) for a Cluster, or the Sentinels' with --redis-sentinel ("+redisDefaultHelp+"); a Cluster node, Sentinel or replica that does not match the flags is refused at start", anyTopology)
	f.BoolVar(&c.RedisAllowEviction, "redis-allow-eviction", false, "start even though Redis's maxmemory-policy can evict keys (allkeys-*, volatile-*), which resets the limits of evicted counters; without it such a Redis is refused at start")
	f.BoolVar(&c.RedisStartDegraded, "redis-start-degraded", false, "start even when Redis refuses sluice's credentials, ACL permissions or TLS at start (decisions then follow each rule's failure mode); without it serve exits naming the flag to fix")
	f.StringVar(&c.Limiter.Region, "region", "local", "region this sidecar runs in")
	f.StringVar(&c.Limiter.Instance, "instance", host, "name of this sidecar within its region")
	f.IntVar(&c.Limiter.Fallback.Instances, "instances", 0, "sidecars sharing the region's traffic, which the local fallback divides each rule by while Redis is unavailable; 0: learned through Redis (a heartbeat every --refresh) and kept while it is away, 1 until it first answers")
	f.IntVar(&c.Limiter.Fallback.RememberedKeys, "remembered-keys", 1<<16, "keys whose last Redis answer the fallback remembers, to continue from it while Redis is unavailable (about 130 bytes each); negative: none")
	f.IntVar(&c.Limiter.Regions, "regions", 1, "regions sharing a global rule: each enforces 1/regions of it without a fresh share (default with --home: the regions named, this one included)")
	f.StringArrayVar(&homes, "home", nil, "another region's Redis for pinned rules, REGION=HOST:PORT (repeat, or comma-separate, for each other region), with --redis's credentials and TLS; or REGION=redis://USER:PASSWORD@HOST:PORT (rediss:// for TLS) with its own")
	f.DurationVar(&c.Limiter.HomeBudget, "home-budget", 500*time.Millisecond, "deadline of a pinned rule's call to another region's Redis (a WAN round trip)")
	f.StringVar(&c.QuotaTopic, "quota-topic", "sluice.quotas", "Kafka topic this region's G-Counter counts are published to every second (with --brokers)")
	f.DurationVar(&c.Limiter.Budget, "budget", 10*time.Millisecond, "how long Redis may take for a decision, by its clock (a script run later commits nothing); the sidecar waits for the answer twice as long at most; past it, failure modes decide; 1s with the in-process Redis, else")
	f.IntVar(&failClosedStatus, "fail-closed-status", 429, "HTTP status of /v1/check when a fail-closed rule denies because Redis is unavailable: 429 or 503")
	f.IntVar(&c.Limiter.MaxInFlight, "max-in-flight", 64*runtime.GOMAXPROCS(0), "most decisions in progress at once (default 64 × GOMAXPROCS), under an adaptive limit that starts at 2 × GOMAXPROCS (or this, if smaller); negative: no limit; 0 is refused; the others queue, up to --queue-wait, then are shed: decided by the rules' failure modes without Redis")
	f.DurationVar(&c.Limiter.QueueWait, "queue-wait", 100*time.Millisecond, "longest a check waits for a place (--max-in-flight) before it is shed (decided by the failure modes without Redis); raised to twice --budget if shorter")
	f.BoolVar(&c.Limiter.NoPipeline, "no-redis-pipeline", false, "send each decision's Redis call on its own connection instead of batching concurrent calls into pipelines (for comparison)")
	f.BoolVar(&c.Server.Pprof, "pprof", false, "serve Go's profiles on the HTTP listener under /debug/pprof/ (go tool pprof http://HOST/debug/pprof/profile); they reveal internals: only where no one else reaches --http")
	f.BoolVar(&c.Server.RequireRedis, "ready-needs-redis", false, "report unready (/readyz, gRPC health) while Redis does not answer, its circuit breaker is open, or it refuses the decision script (the readiness probe: NOPERM, NOAUTH, OOM, ...)")
	f.BoolVar(&c.Server.RequireRecords, "ready-needs-kafka", false, "report unready (/readyz, gRPC health) while no Kafka broker answers (with --brokers); by default a Kafka outage drops and counts decision records and the sidecar stays ready")
	f.StringSliceVar(&c.Brokers, "brokers", nil, "Kafka brokers for decision records (topic decisions); default: none, no records")
	f.DurationVar(&c.StatusWait, "status-wait", 5*time.Second, "how long a decision record with a request id waits for Envoy's access log (served on --grpc) to report its response status")
	f.DurationVar(&c.Refresh, "refresh", time.Second, "how often dynamic rules and shares are loaded from Redis")
	f.DurationVar(&c.DrainDelay, "drain-delay", 5*time.Second, "how long the sidecar stays unready at shutdown (/readyz 503, gRPC health NOT_SERVING) while still answering checks, before its listeners close; 0s: none")
	f.DurationVar(&c.DrainTimeout, "drain-timeout", 10*time.Second, "how long in-flight checks may take at shutdown, once the listeners have closed")
	f.BoolVar(&c.Limiter.Shadow, "shadow", false, "evaluate every rule in shadow mode: count and record would-be denials, allow every request")
	f.Int64Var(&c.Limiter.HotKeys.Rate, "hot-key-rate", 100, "requests per second on this sidecar that make a key hot (its tokens are then leased in blocks); negative: never")
	f.IntVar(&c.Limiter.HotKeys.LeaseBlock, "lease-block", 50, "largest block of tokens a hot key leases; negative: no leases")
	f.BoolVar(&c.KeyStore, "key-store", false, "fill account, org and tier from the API key, with the key store in --redis (cached a minute per key)")
	f.IntVar(&c.Limiter.DynamicCap, "dynamic-cap", 1000, "most dynamic rules applied at once (the first created); more are left out and counted")
	f.BoolVar(&c.Limiter.NoDynamic, "no-dynamic", false, "this sidecar's kill switch: apply no dynamic rules (the region-wide one is sluice rules kill on)")
	usageFlags(f, &c)
	applyFrontDoor = frontDoorFlags(f, &c)
	return cmd
}

// redisLog sends go-redis's own log lines to slog at debug level.
type redisLog struct{}

func (redisLog) Printf(ctx context.Context, format string, v ...any) {
	slog.DebugContext(ctx, "redis: "+fmt.Sprintf(format, v...))
}

// hostPort checks a HOST:PORT address, with a port from 1 to 65535.
func hostPort(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q: want 1 to 65535", port)
	}
	return nil
}

// validTopic reports whether name is a legal Kafka topic name.
func validTopic(name string) bool {
	if name == "" || len(name) > 249 || name == "." || name == ".." {
		return false
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// reactsToBackend reports whether set has an adaptive rule or a shedding
// block: what response statuses (the access log, --backend-degrade) act on.
func reactsToBackend(set *rules.Set) bool {
	if set.Shedding != nil {
		return true
	}
	for _, r := range set.Rules {
		if r.Adaptive() {
			return true
		}
	}
	return false
}
