package enforcer

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

var (
	//go:embed decide.lua
	decideLua string
	//go:embed refund.lua
	refundLua string
)

// ErrBadRequest is returned for a request the limiter cannot decide (for
// example one that matches too many rules).
var ErrBadRequest = errors.New("bad request")

// ErrBreakerOpen is a degraded decision's Err while the circuit breaker is
// open: Redis was not called.
var ErrBreakerOpen = errors.New("enforcer: circuit breaker open: Redis not called")

// ErrOverloaded is the Err of a decision shed because the limiter was
// saturated: Options.MaxInFlight decisions were in progress for all of
// Options.QueueWait (or until the caller's deadline). Redis was not
// called: the rules' failure modes decided, from the remembered state and
// the local buckets (PathFallback), as for a failed Redis call, and
// sluice_enforcer_shed_total counts it. The decision is an answer (an
// allow or a deny), never an error that hands the choice to the gateway.
var ErrOverloaded = errors.New("enforcer: overloaded: every place was taken for the whole queue wait; shed: decided by the failure modes without Redis")

// ErrLate is a degraded decision's Err when Redis ran its script only after
// the decision's deadline (Budget, or the caller's earlier one): the script
// committed nothing. Read by a caller that had not given up yet, it says that
// Redis's clock is ahead of this host's by more than the reply took.
var ErrLate = errors.New("enforcer: Redis ran the script past its deadline and committed nothing (Redis too slow for the budget, or its clock ahead of this host's)")

// Request is one request to decide.
type Request struct {
	// Domain names the rule set the request is checked against, as in
	// Envoy's rate limit service; a request for another domain than the
	// set's matches no rule. Empty means the set's own domain.
	Domain      string
	Descriptors rules.Descriptors
	// Cost (hits_addend): 0 means the route's default cost from the rule set
	// (rules.Set.Costs), else 1.
	Cost uint32
	// Now is the caller's clock (replays, tests). The zero value uses Redis
	// TIME for token buckets, sliding windows and leases: one clock per Redis
	// shard, immune to gateway skew. Fixed windows are always chosen on the
	// enforcer's clock (Options.Clock) when Now is zero; see FixedWindow.
	Now time.Time
	// Parts, when not empty, replace Descriptors: each is one descriptor
	// set with its own cost (or limit override), and all of them are
	// decided together — every rule that any part matches is checked, and
	// all are committed only if every enforced rule allows. Envoy's
	// RateLimitRequest, with its list of descriptors, is such a request. At
	// most MaxParts.
	Parts []Part
	// Optional, copied into the decision record.
	RequestID string
	UserAgent string
	Status    uint32
	// LogLater keeps the decision record in the Decision instead of logging
	// it, so that the caller can add the response's HTTP status once it is
	// known and log it with Limiter.LogStatus. The detector's scan and
	// new-identity signals read that status. Every decision taken with
	// LogLater must be passed to LogStatus, or its record is lost.
	LogLater bool
}

// Options configure a Limiter. The zero value is usable; see each field.
// The fields come in groups, in this order, each validated once by New,
// which fills its defaults (options.go): regions, homes and shares; the
// budget; the circuit breaker (Breaker); the in-flight gate and batching;
// the local fallback (Fallback) and local-scope rules; load shedding
// (Shedding); adaptive limits (Adaptive); shadow mode; hot keys, leases and
// the deny cache (HotKeys); dynamic rules and the key store; and where the
// limiter reports (Sink, Logger, Registerer, Tracer). A group of several
// settings is a struct of its own (BreakerOptions, FallbackOptions,
// SheddingOptions, AdaptiveOptions, HotKeyOptions), as gubernator's
// BehaviorConfig is.
type Options struct {
	// Region this enforcer runs in, e.g. "eu-west". Default "local".
	Region string
	// Instance names this enforcer within its region. Default "0".
	Instance string
	// Regions is how many regions share a global rule; a global rule with no
	// fresh share gets 1/Regions of its limit (the static split), and a
	// pinned or G-Counter rule's local fallback bucket 1/Regions (see
	// docs/enforcement.md). Default 1, or the number of regions in Homes.
	Regions int
	// Homes maps each region's name to a client on that region's Redis, for
	// pinned rules (rules.Rule.Pinned): each entity's home is one of these
	// regions and this one (rules.Homes), and a pinned rule whose entity's
	// home is another region is decided in that region's Redis, in a call
	// of its own made in parallel with this region's. Every enforcer of
	// every region must name the same regions. This region's own entry, if
	// any, is not used (its Redis is the Limiter's). The clients are single
	// nodes, Sentinel (FailoverClient) or Clusters (one call per slot, each
	// to its master), set up as the Limiter's (no retries, context
	// deadlines). Nil: pinned rules are counted in this region alone.
	Homes map[string]redis.UniversalClient
	// HomeBudget bounds a call to another region's Redis (a pinned rule's
	// decision or refund): a WAN round trip. Default 500 ms. A caller's
	// earlier deadline wins.
	HomeBudget time.Duration
	// ShareTTL is how old a share may be (against the decision's time) before
	// the static split replaces it. Default 30 s.
	ShareTTL time.Duration
	// ShareRefresh is how often the caller loads shares (Refresh; sluice
	// serve's --refresh): the soonest a new share can arrive. A global rule
	// whose fresh share is 0 denies with this Wait (Retry-After rounded up
	// to whole seconds) and ReasonNoShare. Default 1 s.
	ShareRefresh time.Duration
	// IPv6Prefix is the prefix length that keys IPv6 client addresses: all
	// addresses of one /IPv6Prefix share their per-IP counters. Default 64;
	// 128 keys each address. IPv4-mapped IPv6 addresses are keyed as IPv4.
	IPv6Prefix int
	// ValueHashKey keys the hash that stands for a descriptor value longer
	// than MaxValue in decision records (HashValue). Give every enforcer of
	// a deployment the same secret key, so that one value hashes alike
	// everywhere and records do not let a reader test guesses of long
	// secrets. Default DefaultValueHashKey (public).
	ValueHashKey []byte
	// Clock is the enforcer's clock, for fixed windows when a request has no
	// Now. Default time.Now.
	Clock func() time.Time
	// Budget bounds the time Redis may take for a decision, by Redis's
	// clock: the script gets the deadline and, run past it, commits nothing
	// (ErrLate; sent again once if the wait has room); the rules' failure
	// modes then decide. The sidecar waits for the answer up to twice the
	// Budget (plus a refund's RefundBudget on a Cluster deny), so that a
	// healthy Redis's answer read late by a sidecar short of CPU still
	// decides exactly, and a silent Redis holds a request 2 × Budget at
	// most; a process that stalls (a CPU quota) waits its recent stalls out
	// too (stallWait, at most 100 ms more). Default 10 ms (the sidecar's
	// longest wait is then Envoy's default timeout for the call, 20 ms). A
	// caller's earlier deadline bounds both. It needs a client with
	// ContextTimeoutEnabled (New warns otherwise).
	Budget time.Duration
	// RefundBudget bounds the refunds of a denied Cluster decision (given
	// back to the slots that allowed), apart from the request's own
	// deadline. Default 50 ms.
	RefundBudget time.Duration
	// Breaker is the circuit breaker in front of Redis.
	Breaker BreakerOptions
	// MaxInFlight bounds the decisions in progress at once, under a limit
	// that adapts to their latency (AIMD, see gate: it falls when admitted
	// decisions take more than half the Budget). The others wait for a
	// place, at most QueueWait (or the caller's earlier deadline), and are
	// then shed: decided by the failure modes without Redis (Decision.Err
	// ErrOverloaded, counted). A
	// decision's Budget starts when it has its place, so a sidecar whose
	// own CPU is saturated queues requests ahead of the budget instead of
	// timing out a healthy Redis and swapping global limits for local
	// ones. Defaults 64 × GOMAXPROCS and 100 ms; QueueWait is raised to
	// 2 × Budget if shorter; a negative MaxInFlight admits everything at
	// once.
	MaxInFlight int
	QueueWait   time.Duration
	// NoPipeline sends each decision's script call on its own (for
	// comparison). By default concurrent decisions' calls to one Redis node
	// are batched: the decisions that queue while a connection's call is in
	// flight go in its next call, one script run deciding them one after the
	// other (see batcher).
	NoPipeline bool
	// Fallback is how the local fallback decides while Redis is unavailable.
	Fallback FallbackOptions
	// LocalEntities bounds the entities (rule and key) that local-scope
	// rules (rules.ScopeLocal) keep a token bucket for in this process,
	// least recently used forgotten first (it then starts again full).
	// About 150 bytes each: the default 100 000 holds about 15 MiB.
	LocalEntities int
	// Shedding is priority load shedding's (rules.Shedding).
	Shedding SheddingOptions
	// Adaptive is the controller of adaptive rules (rules.Rule.AdaptiveFloor).
	Adaptive AdaptiveOptions
	// Shadow evaluates every rule in shadow mode: rules are checked and
	// counted, and would-be denials recorded (Decision.Shadow, the decision
	// record, metrics), but every request is allowed — on every path:
	// Redis, deny cache, lease and fallback. For trying a rule set on live
	// traffic.
	Shadow bool
	// HotKeys is the per-key local state: hot keys, their leases, and the
	// deny cache.
	HotKeys HotKeyOptions
	// DynamicCap is how many active dynamic rules an enforcer applies at
	// most (the first created); more are left out and counted. Default
	// 1000, as store.Store's.
	DynamicCap int
	// NoDynamic is this enforcer's kill switch for dynamic rules: none
	// apply, whatever Redis holds (shares and hot keys still do). The
	// region-wide switch is in Redis (see store.Store).
	NoDynamic bool
	// Keys, when set, resolves a request's API key to its account,
	// organisation and tier (see rules.Identity) for the rules on them,
	// where the request does not give them itself. A key not in the cache
	// costs one lookup, bounded by Budget; a failed lookup leaves the
	// descriptors as they are and is counted.
	Keys *store.KeyCache
	// Sink receives every decision record; nil logs nothing.
	Sink decision.Sink
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Registerer for the limiter's metrics; nil registers none.
	Registerer prometheus.Registerer
	// Tracer, when set, traces every decision: a span per Decide
	// (SpanDecide) and one per round of script calls (SpanScript), children
	// of the span in the caller's context. Nil (the default) traces
	// nothing, at the cost of one comparison per decision.
	Tracer trace.Tracer
}

// BreakerOptions configure the circuit breaker in front of Redis (one per
// node on a Cluster). The zero value gives the defaults.
//
// Failures consecutive failed round trips (timeouts, refused or broken
// connections; not Redis error replies), when they are also more than half
// of the round trips of the last Window (a rolling window), open the
// breaker: while it is open no Redis call is made and the failure modes
// decide at once. After Cooldown, Probes calls are let through (half-open);
// if all succeed the breaker closes, and over Ramp the share of decisions
// sent to Redis grows from a tenth to all (the rest are degraded with
// ErrBreakerRamp). Defaults 5, 1 s, 500 ms (or 4 × Failures × Budget if
// longer), 3 and 1 s; a negative Ramp closes at once.
type BreakerOptions struct {
	Failures int
	Cooldown time.Duration
	Window   time.Duration
	Probes   int
	Ramp     time.Duration
}

// FallbackOptions configure the local fallback, which decides while Redis is
// unavailable (see docs/enforcement.md). The zero value gives the defaults.
type FallbackOptions struct {
	// Instances is how many enforcers share this region's traffic, and
	// Headroom how much more than an even split one may let through while
	// Redis is unavailable: a fail-open rule's local bucket holds burst ×
	// Headroom ÷ Instances. 0, the default, learns the count through Redis
	// (a heartbeat at every Refresh; store.Heartbeat) and keeps it while
	// Redis is away, DefaultInstances (1) until Redis first answers; a
	// positive value overrides it. Headroom's default is 1.2.
	Instances int
	Headroom  float64
	// RememberedKeys bounds the keys whose last Redis answer the fallback
	// remembers, to continue from it while Redis is unavailable (see
	// lastKnown), rounded up to a power of two; about 130 bytes each.
	// Default 65 536 (about 8 MiB); negative: none (every degraded key
	// starts from a full local bucket, and nothing is charged back).
	RememberedKeys int
	// Buckets bounds the local fallback buckets kept in memory (least
	// recently used evicted). Default 100 000.
	Buckets int
}

// SheddingOptions configure priority load shedding (rules.Shedding). The
// zero value gives the defaults.
type SheddingOptions struct {
	// Capacity is the work in flight (requests counted by BeginWork and
	// EndWork, as the HTTP middleware does) at which the in-flight load
	// signal is 1 (see Load). 0, the default, turns that signal off
	// (SetBackendLoad still applies).
	Capacity int
	// RetryAfter is the wait a request refused by load shedding is told
	// (Retry-After, rounded up to whole seconds). Default 1 s.
	RetryAfter time.Duration
}

// AdaptiveOptions configure the controller of adaptive rules
// (rules.Rule.AdaptiveFloor), whose limits are scaled by a factor that an
// AIMD controller moves at the end of every Interval of responses
// (ObserveResponse) with at least MinSamples of them: × Decrease when their
// 5xx share is above ErrorRate or (when Latency > 0) their mean latency
// above Latency, else + Increase, up to 1. Defaults 1 s, 10, 0.7, 0.05
// (5%), 0 (latency not judged) and 0.05: from 1 to a floor of 0.2 in 5
// intervals, back in 16. See adaptive. The zero value gives the defaults.
type AdaptiveOptions struct {
	Interval   time.Duration
	MinSamples int
	Decrease   float64
	ErrorRate  float64
	Latency    time.Duration
	Increase   float64
}

// HotKeyOptions configure the per-key local state: the rate that makes a
// key hot, its leases, and the deny cache. The zero value gives the
// defaults.
type HotKeyOptions struct {
	// Rate is the request rate, per second on this instance, above which a
	// token-bucket key is hot: its tokens are then taken from Redis in
	// blocks (leases) and served locally. Default 100; negative turns local
	// detection off (keys the pipeline flags still lease).
	Rate int64
	// LeaseBlock caps a lease's block of tokens; the block adapts to about
	// 50 ms of the key's traffic, and is at most a quarter of the rule's
	// capacity. An instance holds at most one block per key, so a key can
	// pass its limit by at most HotKeys.LeaseBlock × Instances in any window.
	// Default 50; negative turns leases off.
	LeaseBlock int
	// LeaseTTL is how long leased tokens stay usable; unused ones are
	// dropped (they were taken from Redis: the key under-serves, never
	// over-serves). Default 1 s.
	LeaseTTL time.Duration
	// Table is the size of the table of per-key local state (rate, lease,
	// deny cache), rounded up to a power of two. Default 65 536 (about
	// 6 MiB); negative turns the deny cache and leases off.
	Table int
}

// script is a Lua script with its source and SHA-1 boxed once, so that
// passing them to go-redis allocates nothing.
type script struct{ src, sha any }

func newScript(src string) script {
	h := sha1.Sum([]byte(src))
	return script{src: src, sha: hex.EncodeToString(h[:])}
}

// Limiter decides requests against a rule set with one Redis script call per
// Redis slot the request's rules live in (one call on a single node): every
// matching rule, whatever its algorithm, is checked, and all are committed
// only if every enforced rule allows.
//
// Its zero value is not usable: build one with New. A Limiter is safe for
// concurrent use. Most callers want Check; hot paths reuse a Decision with
// Decide.
//
// Metrics (on Options.Registerer) are listed in the package doc.
type Limiter struct {
	rdb       redis.UniversalClient
	batch     *batcher     // a single node's or Sentinel group's; nil on a Cluster
	nodeBatch nodeBatchers // a Cluster's, one per master
	// The client's ReadTimeout (0: none): go-redis cuts a wait there even
	// when the context's deadline is later, so the wait for an answer, and
	// the script's deadline within it, never exceed it.
	readTimeout time.Duration
	cluster     bool
	decide      script
	refund      script
	store       *store.Store
	opts        Options
	hasher      *valueHasher // of long values in records

	state   atomic.Pointer[ruleState]
	stateMu sync.Mutex // serialises SetRules and Refresh (readers only load state)
	// Lease ids are leasePrefix + a counter: the instance name and 64 random
	// bits, so limiters that share an Instance (or a restarted one) never
	// issue the same id.
	leasePrefix string
	leases      atomic.Uint64
	gate        *gate        // MaxInFlight places; nil: unbounded
	breaker     *breaker     // single node, Sentinel
	nodes       nodeBreakers // Cluster: one per master
	local       *fallback
	known       *lastKnown     // the remembered Redis state; nil: off
	instances   *instanceCount // the fallback's divisor
	chargeSem   chan struct{}  // holds a token while a charge of the fallback's debts is under way (capacity 1)
	localRules  *localRules    // local-scope rules' state
	load        loadSignals    // priority load shedding's inputs
	adaptive    *adaptive      // adaptive rules' factor
	hot         *hotTable      // nil when HotKeys.Table < 0
	instanceIdx int            // this instance's sub-key of a split key
	overrides   *lru.Cache[overrideKey, *rules.Rule]
	calls       *sync.Pool   // of *call; not a field's value: see newCallPool
	slotRetry   releaseRetry // failed releases of concurrency slots, retried

	// Pinned rules: the regions, this one's index in them, and a client per
	// other region (nil at this region's index).
	homes homeRegions
	// G-Counter rules: this region's name as a script argument, boxed
	// once, and the windows counted since the last QuotaCounts.
	regionArg any
	gc        gcDirty
	// The first MOVED from a single node (see misrouted).
	moved atomic.Pointer[error]

	metrics // embedded: l.roundTrips, l.redisErrs, ...
	dm      degradedMetrics
	clock   stallClock // this process's stalls
	stall   stallWait  // how much longer than 2 × Budget to wait for answers: the recent stalls

	registered registrations // the collectors registered on Options.Registerer, for Close
}

// New returns a Limiter over rdb (single node, Sentinel or Cluster through
// go-redis's universal client) with the static rule set.
func New(rdb redis.UniversalClient, set *rules.Set, opts Options) (*Limiter, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if set == nil {
		return nil, fmt.Errorf("enforcer: nil rule set")
	}
	if v := reflect.ValueOf(rdb); rdb == nil || v.Kind() == reflect.Pointer && v.IsNil() {
		return nil, fmt.Errorf("enforcer: nil Redis client")
	}
	if _, ring := rdb.(*redis.Ring); ring {
		return nil, fmt.Errorf("enforcer: a redis.Ring shards keys without hash slots, so one script call could span shards: use a single node, Sentinel (FailoverClient) or Cluster")
	}
	_, cluster := rdb.(*redis.ClusterClient)
	readTimeout := checkClient(rdb, opts)
	l := &Limiter{
		rdb: rdb, cluster: cluster, readTimeout: readTimeout, decide: newScript(decideLua), refund: newScript(refundLua),
		store: store.NewStore(rdb, store.DynamicCap(opts.DynamicCap)), opts: opts, chargeSem: make(chan struct{}, 1),
		hasher: newValueHasher(opts.ValueHashKey),
	}
	opts.Registerer = l.registered.wrap(opts.Registerer) // (l.opts keeps the caller's)
	var nonce [8]byte
	_, _ = rand.Read(nonce[:]) // crypto/rand.Read never fails
	l.leasePrefix = opts.Instance + "-" + hex.EncodeToString(nonce[:]) + "-"
	l.dynLeftOutLog.Interval = time.Minute
	l.known = newLastKnown(opts.Fallback.RememberedKeys)
	l.instances = newInstanceCount(&opts, l.leasePrefix[:len(l.leasePrefix)-1])
	local, err := newFallback(&opts, l.instances, l.known)
	if err != nil {
		return nil, fmt.Errorf("enforcer: %w", err)
	}
	l.local = local
	if l.localRules, err = newLocalRules(opts.LocalEntities); err != nil {
		return nil, fmt.Errorf("enforcer: %w", err)
	}
	l.adaptive = newAdaptive(&l.opts)
	if opts.MaxInFlight > 0 {
		l.gate = newGate(opts.MaxInFlight, opts.Budget/2)
	}
	if opts.HotKeys.Table > 0 {
		l.hot = newHotTable(&opts)
	}
	l.instanceIdx = instanceIndex(opts.Instance)
	l.overrides, _ = lru.New[overrideKey, *rules.Rule](overrideRules) // errors only for a size <= 0
	l.nodes.new = func(name string) *breaker { return newBreaker(name, &opts, &l.trips) }
	l.breaker = newBreaker("redis", &opts, &l.trips)
	l.clock.start(func(now time.Time, d time.Duration) {
		if d > l.opts.Budget { // shorter ones fit in the wait of 2 × Budget
			l.stall.observe(now, d)
		}
	})
	if !cluster {
		l.batch = newBatcher(l, rdb, false, l.breaker)
	}
	l.nodeBatch.l, l.nodeBatch.breaker = l, l.nodes.get
	l.calls = newCallPool()
	if err := l.setHomes(); err != nil {
		return nil, err
	}
	l.local.pinShare = 1 / float64(l.opts.Regions)
	l.regionArg = l.opts.Region
	l.homes.warnPinned(set, &l.opts)
	l.adaptive.enable(set)
	l.warnIPv6Networks(set)
	l.state.Store(newState(set, &store.Control{}, opts.NoDynamic))
	if err := l.newMetrics(opts.Registerer); err != nil {
		return nil, fmt.Errorf("enforcer: registering metrics: %w", err)
	}
	if err := l.localRules.register(opts.Registerer); err != nil {
		return nil, fmt.Errorf("enforcer: registering metrics: %w", err)
	}
	if err := l.load.register(opts.Registerer, l.Load); err != nil {
		return nil, fmt.Errorf("enforcer: registering metrics: %w", err)
	}
	if err := l.adaptive.register(opts.Registerer); err != nil {
		return nil, fmt.Errorf("enforcer: registering metrics: %w", err)
	}
	if err := l.registerDegraded(opts.Registerer); err != nil {
		return nil, fmt.Errorf("enforcer: registering metrics: %w", err)
	}
	return l, nil
}

// SetRules swaps the static rule set; requests see the whole old or the whole
// new set (with the dynamic rules in force). A nil set is ignored.
func (l *Limiter) SetRules(s *rules.Set) {
	if s == nil {
		return
	}
	l.homes.warnPinned(s, &l.opts)
	l.adaptive.enable(s)
	l.warnIPv6Networks(s)
	l.stateMu.Lock()
	defer l.stateMu.Unlock()
	cur := l.state.Load()
	l.swap(newState(s, cur.ctl, l.opts.NoDynamic))
}

// swap puts st in force; it logs the dynamic rules it leaves out when they
// change, not at every refresh.
func (l *Limiter) swap(st *ruleState) {
	if len(st.dropped) > 0 && !slices.Equal(st.dropped, l.state.Load().dropped) {
		l.opts.Logger.Warn("left out dynamic rules that could loosen a static rule (a static rule's id, or replaces)", "rules", st.dropped)
	}
	l.dynDropped.Set(float64(len(st.dropped)))
	l.state.Store(st)
}

// Rules returns the static rule set in force.
func (l *Limiter) Rules() *rules.Set { return l.state.Load().static }

// BreakerOpen reports whether the Redis circuit breaker (on a Cluster, any
// master's) is open: decisions follow the rules' failure modes without
// calling Redis.
func (l *Limiter) BreakerOpen() bool {
	return max(l.breaker.State(), l.nodes.worst()) == gobreaker.StateOpen
}

// Control returns the dynamic rules and shares in force.
func (l *Limiter) Control() *store.Control { return l.state.Load().ctl }

// DynamicRules returns how many dynamic rules were loaded (Control's,
// whether or not the kill switch or a static rule's id leaves some out).
func (l *Limiter) DynamicRules() int { return len(l.state.Load().ctl.Rules) }

// DynamicNamesKey reports whether a loaded dynamic rule matches the custom
// descriptor key name (the sidecar counts keys that no rule names).
func (l *Limiter) DynamicNamesKey(name string) bool {
	for _, r := range l.state.Load().ctl.Rules {
		for j := range r.Match {
			if m := &r.Match[j]; m.Key == rules.KeyCustom && m.Name == name {
				return true
			}
		}
	}
	return false
}

// RoundTrips returns the Redis round trips made so far: one per decision
// whose rules share a slot (always, on a single node), plus script reloads
// and refunds.
func (l *Limiter) RoundTrips() uint64 { return l.roundTrips.Load() }

// Refresh loads dynamic rules (those not expired at now) and shares from
// Redis and swaps them in. Production calls it every second; replays call it
// at event-time barriers. On error the previous control state stays.
//
// It also closes the adaptive controller's interval if now is past it
// (Adapt) and, when the rule set has adaptive rules, shares this
// enforcer's adaptive factor with the region's (see store.PutAdaptive);
// renews this enforcer's heartbeat and learns the region's enforcer count
// (unless Options.Fallback.Instances overrides it; store.Heartbeat); and charges
// the local fallback's debts (see lastKnown).
func (l *Limiter) Refresh(ctx context.Context, now time.Time) error {
	l.Adapt(now)
	l.shareAdaptive(ctx, l.state.Load().static, now)
	l.heartbeat(ctx)
	l.chargeDebts(ctx, true)
	c, err := l.store.Load(ctx, now)
	if err != nil {
		l.refreshBad.Inc()
		return err
	}
	if c.Bad > 0 {
		l.opts.Logger.Warn("skipped undecodable control entries", "count", c.Bad)
	}
	l.refreshOK.Inc()
	l.stateMu.Lock()
	defer l.stateMu.Unlock()
	cur := l.state.Load()
	switch {
	case c.Killed && !cur.ctl.Killed:
		l.opts.Logger.Warn("the dynamic-rule kill switch is on in Redis: no dynamic rule applies")
	case !c.Killed && cur.ctl.Killed:
		l.opts.Logger.Info("the dynamic-rule kill switch is off in Redis: dynamic rules apply again", "rules", len(c.Rules), "no_dynamic", l.opts.NoDynamic)
	}
	if c.OverCap > 0 && c.OverCap != cur.ctl.OverCap {
		l.opts.Logger.Warn("more active dynamic rules than the cap: the first created are kept", "left_out", c.OverCap, "cap", l.opts.DynamicCap)
	}
	l.swap(newState(cur.static, c, l.opts.NoDynamic))
	return nil
}

// capDynamic leaves out of matched the dynamic rules (those from index
// dyn on) past MaxRules in all, counting and logging them: the shadow ones
// first, then the enforcing ones last in the dynamic set. Dynamic rules only add
// to the static ones, so leaving some out never loosens a static limit;
// refusing the request instead (400) would, behind a gateway that lets a
// rate limit service's errors through (Envoy's failure_mode_deny: false),
// drop every limit for the client a pile of shadow rules matched (found by
// a fresh user: 66 shadow rules on one address).
func (l *Limiter) capDynamic(matched []*rules.Rule, dyn int) []*rules.Rule {
	if len(matched) <= MaxRules || dyn >= MaxRules {
		return matched // within the cap, or the static rules alone are past it (refused)
	}
	// Enforcing before shadow, each in the dynamic set's order.
	d := matched[dyn:]
	slices.SortStableFunc(d, func(a, b *rules.Rule) int {
		return cmp.Compare(boolInt(a.Mode == rules.Shadow), boolInt(b.Mode == rules.Shadow))
	})
	left := len(matched) - MaxRules
	l.dynLeftOut.Add(uint64(left))
	l.dynLeftOutLog.Do(func() {
		l.opts.Logger.Warn("a request matched more rules than one decision takes: dynamic rules past the cap were left out of it, shadow ones first (sluice_enforcer_dynamic_rules_left_out_total); at most one such line a minute",
			"left_out", left, "max_per_request", MaxRules)
	})
	return matched[:MaxRules]
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// MaxRules caps the rules one request may match: the script's argument list
// grows with it.
const MaxRules = 64

// MaxParts caps a request's Parts (Envoy descriptors).
const MaxParts = 16

// Check decides req; see Decide. The Decision it returns is the caller's.
func (l *Limiter) Check(ctx context.Context, req *Request) (Decision, error) {
	var d Decision
	err := l.Decide(ctx, req, &d)
	return d, err
}

// Decide decides req into d, reusing d's slices: a caller that keeps one
// Decision per goroutine makes decisions without allocating in sluice's own
// code (go-redis allocates its command and the reply).
//
// It never returns an error for a storage failure: the matching rules'
// failure modes decide, and d.Err says why. It returns ErrBadRequest for a
// request it cannot decide (more than MaxRules rules match, or a client_ip
// that looks like an address but is none, see rules.CheckClientIP).
//
// With Options.Tracer set, it makes a span (SpanDecide) with a child span
// per round of script calls (SpanScript).
func (l *Limiter) Decide(ctx context.Context, req *Request, d *Decision) error {
	if l.opts.Tracer != nil {
		return l.decideTraced(ctx, req, d)
	}
	return l.decideRequest(ctx, req, d)
}

func (l *Limiter) decideRequest(ctx context.Context, req *Request, d *Decision) error {
	if req == nil || d == nil {
		return fmt.Errorf("%w: nil request or decision", ErrBadRequest)
	}
	if ctx == nil {
		ctx = context.Background()
	}
	start := time.Now()
	st := l.state.Load()
	static, ctl, dyn := st.static, st.ctl, st.dyn
	c := l.calls.Get().(*call)
	// Shed (no place within QueueWait): decided by the failure modes,
	// without Redis (decideRules), holding no place.
	c.shed = !l.gate.admit(ctx, c, l.opts.QueueWait, &l.clock, &l.stall, &l.metrics)
	// A decision that Redis answered is a sample of the gate's latency; one
	// that failed (errQueued included: queued behind calls to a Redis that
	// does not answer) waited without using a core.
	defer func() {
		if !c.shed {
			l.gate.leave(c, d.Err == nil)
		}
		l.calls.Put(c)
	}()
	parts := req.Parts
	if len(parts) == 0 {
		c.one[0] = Part{Descriptors: req.Descriptors}
		parts = c.one[:]
	}
	if len(parts) > MaxParts {
		return fmt.Errorf("%w: %d descriptors, more than %d", ErrBadRequest, len(parts), MaxParts)
	}
	if req.Domain != "" && req.Domain != static.Domain {
		// Another domain's request: as in envoyproxy/ratelimit, no rule of
		// this set applies (dynamic rules are made for this set's domain).
		static, ctl, dyn = nil, &store.Control{}, nil
	}
	now := req.Now
	clock := func() time.Time {
		if now.IsZero() {
			now = l.opts.Clock()
		}
		return now
	}
	matched, reqCost, err := l.match(ctx, c, req, parts, st, static, dyn, clock)
	if err != nil {
		return err
	}
	d.reset(req.Now)
	c.nblk = 0
	if sh := st.static.Shedding; sh != nil && l.load.shed(sh, l.Load(), l.opts.Shedding.RetryAfter, parts, clock, d) {
		matched = matched[:0] // refused before any rule: nothing charged
	}
	if len(matched) > 0 {
		matched = c.replaced(matched)
		matched = l.blocks(c, matched, clock, d)
	}
	if len(matched) > 0 && len(ctl.Shares) > 0 {
		matched = l.noShares(c, req, matched, ctl, clock, d)
	}
	if len(matched) > 0 {
		matched = l.localRules.decide(c, matched, clock, d, l.adaptive, l.opts.Shadow)
	} else {
		c.nloc = 0
	}
	switch {
	case len(matched) > 0:
		l.decideRules(ctx, c, req, matched, ctl, d)
		l.shadowBlocks(c, d)
	case c.nblk > 0 && d.Outcome != decision.Denied:
		l.shadowBlocks(c, d) // only shadow rules that would block matched
	}
	c.localCall.settle(d)
	l.count(d)
	if l.opts.Sink != nil {
		if req.LogLater {
			l.record(&d.later, req, d, reqCost, start, c.descs[:len(parts)])
			d.logLater = true
		} else {
			var rec decision.Record
			l.record(&rec, req, d, reqCost, start, c.descs[:len(parts)])
			l.opts.Sink.Log(rec)
		}
	}
	return nil
}

// match returns the rules that the request's parts match (an override's
// rule for a part that carries one), each with its part, cost and override
// entity in c, and the first part's cost, for the decision record. The
// parts' descriptors are copied into c, their client IPs normalised and,
// with a key store, their API keys' account, organisation and tier filled.
// static and dyn are nil for another domain's request; st's static set
// still gives the route costs.
func (l *Limiter) match(ctx context.Context, c *call, req *Request, parts []Part, st *ruleState, static, dyn *rules.Set, clock func() time.Time) (matched []*rules.Rule, reqCost int64, err error) {
	matched = c.rules[:0]
	for pi := range parts {
		p := &parts[pi]
		c.descs[pi] = p.Descriptors
		desc := &c.descs[pi]
		if err := l.normalize(desc, st.static); err != nil {
			return nil, 0, fmt.Errorf("%w: descriptor %d: %w", ErrBadRequest, pi, err)
		}
		if l.opts.Keys != nil && desc[rules.KeyAPIKey] != "" {
			l.identify(ctx, desc)
		}
		from := len(matched)
		if p.Override != nil {
			r, err := l.overrideRule(p.Override)
			if err != nil {
				return nil, 0, err
			}
			matched = append(matched, r)
			c.rc[from].ent = p.Override.Entity
		} else {
			if static != nil {
				matched = static.Match(desc, matched)
			}
			if dyn != nil {
				n := len(matched)
				matched = st.matchDynamic(desc, clock, matched)
				matched = l.capDynamic(matched, n)
			}
			if len(matched) > MaxRules {
				return nil, 0, fmt.Errorf("%w: %d rules match, more than %d", ErrBadRequest, len(matched), MaxRules)
			}
			for i := from; i < len(matched); i++ {
				c.rc[i].ent = ""
			}
		}
		cost := int64(p.Cost)
		switch {
		case p.CheckOnly:
			cost = 0
		case cost == 0:
			cost = st.static.Cost(req.Cost, desc[rules.KeyRoute]) // the route costs, also for another domain's request
		}
		if pi == 0 {
			reqCost = cost
		}
		for i := from; i < len(matched); i++ {
			c.rc[i].part, c.rc[i].cost = uint8(pi), cost
		}
	}
	return matched, reqCost, nil
}

// LogStatus logs the record of a decision taken with Request.LogLater, with
// the HTTP status the request was answered with (0 if unknown). It does
// nothing for any other decision, or a second time.
func (l *Limiter) LogStatus(d *Decision, status int) {
	if !d.logLater || l.opts.Sink == nil {
		return
	}
	d.logLater = false
	if status > 0 && status <= math.MaxUint16 {
		d.later.Status = uint32(status)
	}
	l.opts.Sink.Log(d.later)
}

// record fills rec with the decision record of d.
func (l *Limiter) record(rec *decision.Record, req *Request, d *Decision, cost int64, start time.Time, decided []rules.Descriptors) {
	*rec = decision.Record{
		Time: d.Now, Region: l.opts.Region, Instance: l.opts.Instance, RequestID: req.RequestID,
		Domain: req.Domain, Descriptors: req.Descriptors, UserAgent: req.UserAgent,
		Outcome: d.Outcome, Cost: uint32(min(cost, math.MaxUint32)), Remaining: d.Remaining,
		Latency: time.Since(start), Status: req.Status, AdaptiveFactor: d.Factor,
	}
	for pi := range req.Parts { // the parts' descriptors, merged: the first value of each key
		pd := &req.Parts[pi].Descriptors
		for k := range rules.NumKeys {
			if rec.Descriptors[k] == "" {
				rec.Descriptors[k] = pd[k]
			}
		}
		for i := range rules.MaxCustom {
			if name, v := pd.CustomAt(i); name != "" && rec.Descriptors.Custom(name) == "" {
				rec.Descriptors.SetCustom(name, v)
			}
		}
	}
	for pi := range decided { // the key store's account, org and tier
		for _, k := range [...]rules.Key{rules.KeyAccount, rules.KeyOrg, rules.KeyTier} {
			if rec.Descriptors[k] == "" {
				rec.Descriptors[k] = decided[pi][k]
			}
		}
	}
	if len(d.Statuses) > 0 {
		// The record outlives d (it is queued), so its rule ids get their own slice.
		rec.Matched = make([]string, len(d.Statuses))
		for i := range d.Statuses {
			rec.Matched[i] = d.Statuses[i].Rule.ID
		}
	}
	if rec.Time.IsZero() {
		rec.Time = start
	}
	if d.Rule != nil {
		rec.DenyingRule = d.Rule.ID
	}
	if d.Shadow != nil {
		rec.ShadowRule = d.Shadow.ID
	}
	rec.Path = d.Path
	l.hashLongValues(rec)
}

// identify fills the account, organisation and tier of d's API key from the
// key store. A cached answer allocates nothing; a lookup waits at most the
// budget.
func (l *Limiter) identify(ctx context.Context, d *rules.Descriptors) {
	id, ok, hit := l.opts.Keys.Cached(d[rules.KeyAPIKey])
	if !hit {
		l.keyMisses.Add(1)
		lctx, cancel := context.WithTimeout(ctx, l.opts.Budget)
		var err error
		id, ok, err = l.opts.Keys.Lookup(lctx, d[rules.KeyAPIKey])
		cancel()
		if err != nil {
			l.keyErrors.Add(1)
			return
		}
	}
	if ok {
		id.Fill(d)
	}
}

// warnIPv6Networks warns, once per rule, about an exact client_ip value that
// is an IPv6 /64 network when Options.IPv6Prefix is not 64: an envoyproxy
// config's exact IPv6 address is read as its /64 (rules.ParseEnvoy), which
// no client's key then equals (only a gateway's masked /64 text would).
func (l *Limiter) warnIPv6Networks(s *rules.Set) {
	if s == nil || l.opts.IPv6Prefix == 64 {
		return
	}
	for _, r := range s.Rules {
		for _, m := range r.Match {
			if m.Key != rules.KeyClientIP {
				continue
			}
			for _, v := range append(append([]string{m.Value}, m.Values...), m.Not...) {
				if p, err := netip.ParsePrefix(v); err == nil && p.Addr().Is6() && p.Bits() == 64 {
					l.opts.Logger.Warn("a client_ip value is an IPv6 /64, as an envoyproxy config's exact IPv6 address is read, but this limiter keys IPv6 clients by Options.IPv6Prefix, so no client's key equals it: convert the config (sluice rules convert) and use cidr",
						"rule", r.ID, "value", v, "ipv6_prefix", l.opts.IPv6Prefix)
					break
				}
			}
		}
	}
}

// normalizeIP rewrites the client IP into its canonical key form
// (rules.NormalizeIP), allocating only when the text changes. A value that
// is no address is checked by rules.CheckClientIP: a name (a hostname in a
// replayed log) is keyed as it is, which no canonical address text equals,
// and counted; a text that looks like an address but is none (999.1.1.1,
// 01.2.3.4) is counted and returned (rules.ErrNotAnAddress).
func (l *Limiter) normalizeIP(d *rules.Descriptors) error {
	s := d[rules.KeyClientIP]
	if s == "" {
		return nil
	}
	var buf [64]byte
	b, ok := rules.AppendNormalIP(buf[:0], s, l.opts.IPv6Prefix)
	if ok {
		if string(b) != s {
			d[rules.KeyClientIP] = string(b)
		}
		return nil
	}
	name, err := rules.CheckClientIP(s)
	switch {
	case err != nil:
		l.ipRefused.Add(1)
		return err
	case name:
		l.ipNames.Add(1)
	}
	return nil
}

// share returns this region's fraction of global rule r for the entity tag:
// the entity's own share, else the rule's default share, else 1/Regions (the
// static split, fresh = false). A share older than ShareTTL at now is ignored.
func (l *Limiter) share(c *call, r *rules.Rule, tag []byte, ctl *store.Control, now time.Time) (f float64, fresh bool) {
	if now.IsZero() {
		now = l.opts.Clock()
	}
	if len(ctl.Shares) > 0 {
		k := append(append(append(c.shareKey[:0], r.ID...), '|'), tag...)
		c.shareKey = k
		if s, ok := ctl.Shares[string(k)]; ok && l.fresh(s, now) {
			return s.Fraction, true
		}
		if s, ok := ctl.Shares[string(k[:len(r.ID)+1])]; ok && l.fresh(s, now) {
			return s.Fraction, true
		}
	}
	return 1 / float64(l.opts.Regions), false
}

// fresh reports whether a share was computed within ShareTTL of now, before
// or after: a share stamped far in the future (a skewed aggregator clock) is
// as stale as an old one.
func (l *Limiter) fresh(s rules.Share, now time.Time) bool {
	d := now.Sub(s.ComputedAt)
	return d <= l.opts.ShareTTL && d >= -l.opts.ShareTTL
}

// noShares decides, without Redis, the global rules whose fresh share for
// the request's entity is 0: an enforced one denies the request at once
// (ReasonNoShare, nothing else counted) with a Wait of ShareRefresh, the
// soonest a new share can arrive; shadow ones are set aside for
// shadowBlocks. It returns the rules left to decide. scale's floor of 1 is
// for small positive shares; a 0 is the aggregator's word that this region
// gets nothing.
func (l *Limiter) noShares(c *call, req *Request, matched []*rules.Rule, ctl *store.Control, clock func() time.Time, d *Decision) []*rules.Rule {
	any := false
	for i, r := range matched {
		c.rc[i].drop = false
		if !r.Global || r.Pinned || r.GCounter || c.rc[i].ent != "" {
			continue
		}
		c.tagBuf, c.hashIn = rules.AppendEntityTagScratch(c.tagBuf[:0], c.hashIn, r, &c.descs[c.rc[i].part])
		if f, fresh := l.share(c, r, c.tagBuf, ctl, req.Now); !fresh || f > 0 {
			continue
		}
		wait := l.opts.ShareRefresh
		st := Status{Rule: r, Reset: wait, Window: r.Period, Part: int(c.rc[i].part), Denied: true}
		if r.Mode != rules.Shadow && !l.opts.Shadow {
			d.Now = clock()
			d.Outcome, d.Reason, d.Rule, d.Path = decision.Denied, decision.ReasonNoShare, r, decision.PathNoShare
			d.Statuses = append(d.Statuses[:0], st)
			d.Limit, d.Remaining, d.Reset, d.bind = 0, 0, wait, 1
			d.Wait, d.RetryAfter = wait, time.Duration(ceilSeconds(wait))*time.Second
			c.nblk = 0
			return matched[:0]
		}
		st.Shadow = true
		c.rc[i].drop, any = true, true
		c.blk[c.nblk] = st
		c.nblk++
	}
	if !any {
		return matched
	}
	return c.compact(matched)
}

// scale returns x*f rounded down, at least 1, for a positive share f (a
// fresh share of 0 never reaches it: noShares denies). Rounding down keeps the
// regions' parts of a global limit within it when their shares sum to at
// most 1; the floor of 1 lets a region with a tiny share still serve, so a
// global limit smaller than the number of regions can be passed by up to one
// per region.
func scale(x int64, f float64) int64 {
	return max(1, int64(math.Floor(float64(x)*f+1e-9)))
}

// checkClient warns about go-redis settings that break the request path's
// promises: retries of timed-out commands (a script that ran but whose reply
// was lost runs again, charging a request twice), context deadlines that
// go-redis ignores unless ContextTimeoutEnabled is set (a slow Redis then
// holds a request for its ReadTimeout, 3 s by default, not the caller's
// deadline), dial retries (see warnDialRetries), and a ReadTimeout shorter
// than twice the Budget (the wait for an answer is cut there, and the
// script's deadline with it). It returns the ReadTimeout (0: none).
func checkClient(rdb redis.UniversalClient, opts Options) time.Duration {
	var retries, dials int
	var ctxTimeout bool
	var read time.Duration
	switch c := rdb.(type) {
	case *redis.Client: // single node, and Sentinel's failover client
		retries, ctxTimeout, dials, read = c.Options().MaxRetries, c.Options().ContextTimeoutEnabled, c.Options().DialerRetries, c.Options().ReadTimeout
	case *redis.ClusterClient: // the limiter calls the node clients itself; they inherit these
		retries, ctxTimeout, dials, read = c.Options().MaxRetries, c.Options().ContextTimeoutEnabled, c.Options().DialerRetries, c.Options().ReadTimeout
	default:
		return 0
	}
	log := opts.Logger
	warnDialRetries(dials, log)
	if retries > 0 {
		log.Warn("the Redis client retries timed-out commands: a decision whose reply was lost may be charged twice; set MaxRetries: -1", "max_retries", retries)
	}
	if !ctxTimeout {
		log.Warn("the Redis client ignores context deadlines: a slow Redis holds each request for its ReadTimeout; set ContextTimeoutEnabled: true")
	}
	if read < 0 {
		return 0
	}
	if read > 0 && read < 2*opts.Budget {
		log.Warn("the Redis client's ReadTimeout is shorter than twice the budget: decisions wait for Redis at most the ReadTimeout, and the script's deadline is half of it",
			"read_timeout", read, "budget", opts.Budget)
	}
	return read
}

// isReply reports whether err is an error reply from Redis (it answered).
func isReply(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// isNoScript reports whether err says the script is not in Redis's cache.
func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}
