package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net/http"
	"net/http/pprof"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/rules"
)

// Options configure a Server. The zero value is usable: every field has a
// default, which DefaultOptions shows.
type Options struct {
	// Headers are the engine's rate-limit headers added to every answer
	// (response_headers_to_add over gRPC, the response's headers over
	// HTTP). Default enforcer.AllHeaders.
	Headers enforcer.HeaderSet
	// UnavailableStatus is /v1/check's status when a fail-closed rule
	// denies because Redis is unavailable: 429 (the default) or 503. gRPC
	// answers OVER_LIMIT either way, which Envoy turns into a 429.
	UnavailableStatus int
	// MaxBody caps a /v1/check request body, and a gRPC request message; a
	// larger one is answered 413 (gRPC: ResourceExhausted, unread). Default
	// 64 KiB.
	MaxBody int64
	// Redis, when set, is PINGed by readiness checks (at most once a
	// second; the answer is kept). Nil: readiness does not look at Redis.
	Redis redis.UniversalClient
	// InProcessRedis says that Redis is this process's own (sluice serve's
	// try-out, with no --redis): /readyz's Redis line says so, since each
	// such sidecar counts alone.
	InProcessRedis bool
	// RequireRedis makes the sidecar unready (/readyz 503, gRPC health
	// NOT_SERVING) while Redis does not answer, its circuit breaker is
	// open, or the Probe's decisions fail (NOPERM, NOAUTH, OOM, ...).
	// Default false: a sidecar whose Redis is down still answers, by each
	// rule's failure mode, and stays ready; see docs/enforcement.md,
	// "Sidecar APIs".
	RequireRedis bool
	// Probe, when set, is the readiness probe of the decision path
	// (enforcer.Probe, run by its owner): /readyz shows its last answer and
	// Redis's maxmemory-policy, and with RequireRedis a failed probe makes
	// the sidecar unready. Nil: readiness knows only PING and the breaker.
	Probe RedisProbe
	// HomeProbes are the probes of the other regions' Redis that pinned
	// rules are decided in (enforcer.Options.Homes), by region: /readyz
	// shows each one's last answer. They never make the sidecar unready:
	// while a home fails, the rules homed there follow their failure
	// modes and every other decision goes on.
	HomeProbes map[string]RedisProbe
	// Pprof serves Go's profiles (net/http/pprof) on the HTTP API under
	// /debug/pprof/, for profiling the request path, all but cmdline (the
	// command line, which can hold a password). Default false: they
	// reveal internals, so leave them off where others reach the listener.
	Pprof bool
	// Usage configures GET /v1/usage, where customers read their own API
	// key's rules and usage; on by default (see UsageOptions).
	Usage UsageOptions
	// ForwardAuth configures the forward-auth endpoint that nginx, Caddy
	// and Traefik call (ForwardAuthPath); on by default, for gateways on
	// loopback (see ForwardAuthOptions).
	ForwardAuth ForwardAuthOptions
	// Registry takes the sidecar's metrics and is served on /metrics. Nil:
	// a new registry of the Server's own (Server.Registry).
	Registry *prometheus.Registry
	// Logger; default slog.Default().
	Logger *slog.Logger
	// StatusJoin, when set, is served on the gRPC server as Envoy's access
	// log service, to add response statuses to decision records.
	StatusJoin *StatusJoin
	// RequireRules makes the sidecar unready while its rule set is the
	// empty, unversioned one it starts with when its rules come from Redis
	// (sluice serve --rules-redis) and Redis holds none yet: it would allow
	// every request. A set pushed empty on purpose has a version.
	RequireRules bool
	// Records, when set, is where decision records go (the Kafka producer
	// of `sluice serve --brokers`): readiness pings it (at most once a
	// second; the answer is kept) and /readyz shows the answer. Nil:
	// readiness does not look at it.
	Records Pinger
	// RequireRecords makes the sidecar unready while Records does not
	// answer. Default false: a sidecar whose Kafka is down still decides
	// every request and stays ready, and its records are dropped and
	// counted; see docs/enforcement.md, "Sidecar APIs".
	RequireRecords bool
	// Tracer, when set, traces every check: a span (SpanCheck) per request
	// over either API, a child of the trace the request carries, with the
	// limiter's spans (enforcer.Options.Tracer) below it. Nil (the
	// default) traces nothing, at the cost of one comparison per check.
	Tracer trace.Tracer
	// Propagator reads the caller's trace context from gRPC metadata and
	// HTTP headers. Default, with a Tracer: W3C Trace Context and Baggage.
	Propagator propagation.TextMapPropagator
}

// Pinger is a dependency that readiness can check: Ping answers nil while it
// works, within ctx.
type Pinger interface {
	Ping(ctx context.Context) error
}

// RedisProbe is the readiness probe of the decision path: Status answers
// what its last run found (enforcer.Probe).
type RedisProbe interface {
	Status() enforcer.RedisStatus
}

// DefaultOptions returns the defaults that zero fields of Options get.
func DefaultOptions() Options {
	return Options{Headers: enforcer.AllHeaders, UnavailableStatus: http.StatusTooManyRequests, MaxBody: 64 << 10}
}

func (o *Options) validate() error {
	def := DefaultOptions()
	if o.Headers == 0 {
		o.Headers = def.Headers
	}
	if o.UnavailableStatus == 0 {
		o.UnavailableStatus = def.UnavailableStatus
	}
	if o.UnavailableStatus != http.StatusTooManyRequests && o.UnavailableStatus != http.StatusServiceUnavailable {
		return fmt.Errorf("sidecar: UnavailableStatus must be 429 or 503, got %d", o.UnavailableStatus)
	}
	if o.MaxBody == 0 {
		o.MaxBody = def.MaxBody
	}
	if o.MaxBody < 0 {
		return fmt.Errorf("sidecar: MaxBody must be positive (or 0 for the default), got %d", o.MaxBody)
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if err := o.ForwardAuth.validate(); err != nil {
		return err
	}
	if o.Tracer != nil && o.Propagator == nil {
		o.Propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	return nil
}

// The APIs and answer codes that label the metrics.
const (
	apiGRPC = iota
	apiHTTP
	apiForwardAuth
	numAPIs
)

var apiNames = [numAPIs]string{"grpc", "http", "forward_auth"}

const (
	codeOK = iota
	codeOverLimit
	codeInvalid
	numCodes
)

// Server answers rate-limit checks for a Limiter over Envoy's rate limit
// service API (gRPC, envoy.service.ratelimit.v3) and HTTP (/v1/check, the
// same model in JSON), with health, readiness and metrics endpoints.
//
// Build one with New; the zero value is not usable. A Server is safe for
// concurrent use. Most callers want Run, which also builds the limiter and
// listens; embedders serve NewGRPCServer and Handler themselves.
//
// Metrics (on Options.Registry):
//
//	sluice_sidecar_checks_total{api,code}           checks by API (grpc, http, forward_auth) and answer (ok, over_limit, invalid, shed)
//	sluice_sidecar_check_duration_seconds{api}      time from a decoded request to its answer
//	sluice_sidecar_unmatched_descriptors_total      descriptors with a key sluice cannot map
//	sluice_sidecar_unknown_descriptor_keys_total    entries whose key no rule matches (logged once a minute)
//	sluice_sidecar_usage_requests_total{code}       GET /v1/usage by answer
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer

	lim    Limiter
	opts   Options
	health *health.Server

	scratch  sync.Pool // of *scratch
	replies  sync.Pool // of *reply
	draining atomic.Bool

	redisPing, recordsPing cachedPing
	usage                  *usage // GET /v1/usage

	checks    [numAPIs][numCodes]prometheus.Counter
	latency   [numAPIs]prometheus.Observer
	unmatched prometheus.Counter
	// otherDomain counts checks for a domain the rule set does not have
	// (they match no rule: allowed), and otherDomainLog says so at most
	// once a minute: a gateway sending the wrong domain, or a rule file
	// whose domain changed, turns every limit off without an error.
	otherDomain    prometheus.Counter
	otherDomainLog rate.Sometimes
	unknown        *unknownKeys
}

// scratch is one request's working memory, pooled.
type scratch struct {
	in        rlsv3.RateLimitRequest
	req       enforcer.Request
	parts     [enforcer.MaxParts]enforcer.Part
	overrides [enforcer.MaxParts]enforcer.Override
	d         enforcer.Decision
	entity    []byte
	body      []byte
	fa        forwardAuth
}

// reply is a response with the memory of its parts, pooled: the statuses,
// limits, durations and headers point into its slices. Embedding the
// response makes *reply a proto.Message that marshals as it.
type reply struct {
	rlsv3.RateLimitResponse
	statuses []rlsv3.RateLimitResponse_DescriptorStatus
	ptrs     []*rlsv3.RateLimitResponse_DescriptorStatus
	limits   []rlsv3.RateLimitResponse_RateLimit
	resets   []durationpb.Duration
	headers  []corev3.HeaderValue
	hptrs    []*corev3.HeaderValue
	hdrs     []enforcer.Header
}

// reset clears r for a response of n statuses, keeping its memory.
func (r *reply) reset(n int) {
	r.RateLimitResponse.Reset()
	if cap(r.statuses) < n {
		r.statuses = make([]rlsv3.RateLimitResponse_DescriptorStatus, n)
		r.ptrs = make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)
		r.limits = make([]rlsv3.RateLimitResponse_RateLimit, n)
		r.resets = make([]durationpb.Duration, n)
	}
	r.statuses, r.ptrs, r.limits, r.resets = r.statuses[:n], r.ptrs[:n], r.limits[:n], r.resets[:n]
	for i := range n {
		r.statuses[i].Reset()
		r.limits[i].Reset()
		r.resets[i].Reset()
		r.ptrs[i] = &r.statuses[i]
	}
	r.Statuses = r.ptrs
}

// headerValues sizes the response's headers to n.
func (r *reply) headerValues(n int) {
	if cap(r.headers) < n {
		r.headers = make([]corev3.HeaderValue, n)
		r.hptrs = make([]*corev3.HeaderValue, n)
	}
	r.headers, r.hptrs = r.headers[:n], r.hptrs[:n]
	for i := range n {
		r.headers[i].Reset()
		r.hptrs[i] = &r.headers[i]
	}
	r.ResponseHeadersToAdd = r.hptrs
}

// Limiter is what the Server needs of a limiter (*enforcer.Limiter is
// one): decisions and their concurrency slots, the rule set in force (its
// domain and version), what readiness reads (the breaker, a misrouted
// Redis, how many dynamic rules apply), whether a dynamic rule names a
// custom descriptor key (the unknown-key count), and a key's usage for
// /v1/usage.
type Limiter interface {
	Decide(ctx context.Context, req *enforcer.Request, d *enforcer.Decision) error
	Release(ctx context.Context, d *enforcer.Decision) error
	Rules() *rules.Set
	DynamicRules() int
	DynamicNamesKey(name string) bool
	BreakerOpen() bool
	Misrouted() error
	Usage(ctx context.Context, d rules.Descriptors, now time.Time) (*enforcer.Usage, error)
}

// New returns a Server that decides with l.
func New(l Limiter, opts Options) (*Server, error) {
	if l == nil {
		return nil, errors.New("sidecar: nil limiter")
	}
	if err := opts.validate(); err != nil {
		return nil, err
	}
	s := &Server{lim: l, opts: opts, health: health.NewServer()}
	s.scratch.New = func() any { return new(scratch) }
	s.replies.New = func() any { return new(reply) }
	checks := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_sidecar_checks_total", Help: "Rate-limit checks by API (grpc, http, forward_auth) and answer (ok, over_limit, invalid). A check the limiter shed because it was saturated is answered by its rules' failure modes (ok or over_limit; see sluice_enforcer_shed_total).",
	}, []string{"api", "code"})
	lat := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "sluice_sidecar_check_duration_seconds",
		Help:    "Time from a decoded request to its answer, Redis round trip included, transport excluded.",
		Buckets: prometheus.ExponentialBuckets(25e-6, 2, 14), // 25 µs to 205 ms
	}, []string{"api"})
	s.otherDomain = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_sidecar_other_domain_checks_total",
		Help: "Checks for a domain other than the rule set's: no rule matches them, so they are allowed.",
	})
	s.otherDomainLog = rate.Sometimes{First: 1, Interval: time.Minute}
	s.unknown = newUnknownKeys()
	s.unmatched = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_sidecar_unmatched_descriptors_total",
		Help: "Descriptors with an entry key sluice cannot map to a descriptor key; they match no rule and are answered OK.",
	})
	for a, api := range apiNames {
		for c, code := range []string{"ok", "over_limit", "invalid"} {
			s.checks[a][c] = checks.WithLabelValues(api, code)
		}
		s.latency[a] = lat.WithLabelValues(api)
	}
	for _, c := range []prometheus.Collector{checks, lat, s.unmatched, s.otherDomain, s.unknown.count} {
		if err := opts.Registry.Register(c); err != nil {
			return nil, fmt.Errorf("sidecar: registering metrics: %w", err)
		}
	}
	if err := s.initUsage(); err != nil {
		return nil, err
	}
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	return s, nil
}

// Registry returns the registry the Server's metrics are on.
func (s *Server) Registry() *prometheus.Registry { return s.opts.Registry }

// check decides in into r: the shared core of both APIs.
func (s *Server) check(ctx context.Context, in *rlsv3.RateLimitRequest, sc *scratch, r *reply, api int) error {
	if s.opts.Tracer != nil {
		return s.checkTraced(ctx, in, sc, r, api)
	}
	return s.checkRequest(ctx, in, sc, r, api)
}

func (s *Server) checkRequest(ctx context.Context, in *rlsv3.RateLimitRequest, sc *scratch, r *reply, api int) error {
	start := time.Now()
	err := checkLengths(in)
	var unmatched int
	if err == nil {
		set := s.lim.Rules()
		domain := set.Domain
		unmatched, err = toRequest(in, domain, sc)
		if err == nil && in.GetDomain() == domain {
			s.checkUnknownKeys(set, sc)
		}
		if err == nil && in.GetDomain() != domain {
			s.otherDomain.Inc()
			s.otherDomainLog.Do(func() {
				s.opts.Logger.Warn("a check for a domain the rule set does not have: no rule matches it, and it is allowed (the gateway's rate limit filter and the rule file must name the same domain); at most one such line a minute",
					"domain", in.GetDomain(), "rules_domain", domain)
			})
		}
	}
	if err == nil {
		err = s.lim.Decide(ctx, &sc.req, &sc.d)
	}
	if err != nil {
		s.checks[api][codeInvalid].Inc()
		if errors.Is(err, rules.ErrNotAnAddress) {
			err = namedIPError(in, err)
		}
		return err
	}
	if unmatched > 0 {
		s.unmatched.Add(float64(unmatched))
	}
	if len(sc.d.Leases) > 0 {
		// Envoy's API has no call at the end of a request: a concurrency
		// slot is given back at once (see docs/enforcement.md).
		_ = s.lim.Release(context.WithoutCancel(ctx), &sc.d)
	}
	s.fill(r, &sc.d, len(in.GetDescriptors()))
	if r.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		s.checks[api][codeOverLimit].Inc()
	} else {
		s.checks[api][codeOK].Inc()
	}
	s.latency[api].Observe(time.Since(start).Seconds())
	return nil
}

// ShouldRateLimit implements envoy.service.ratelimit.v3.RateLimitService
// for direct callers: the response is the caller's. Servers built by
// NewGRPCServer answer through a path that reuses the response's memory.
// A request the limiter refuses is answered with codes.InvalidArgument.
func (s *Server) ShouldRateLimit(ctx context.Context, in *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	sc := s.scratch.Get().(*scratch)
	defer s.scratch.Put(sc)
	r := new(reply)
	if err := s.check(ctx, in, sc, r, apiGRPC); err != nil {
		return nil, grpcError(err)
	}
	return &r.RateLimitResponse, nil
}

// handle is the pooled gRPC path: the request is decoded into pooled
// memory and the reply comes from a pool, to which codec returns it once
// it is marshaled.
func (s *Server) handle(ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
	sc := s.scratch.Get().(*scratch)
	defer s.scratch.Put(sc)
	if err := dec(&sc.in); err != nil {
		return nil, err
	}
	if icpt == nil {
		return s.answer(ctx, &sc.in, sc)
	}
	info := &grpc.UnaryServerInfo{Server: s, FullMethod: rlsv3.RateLimitService_ShouldRateLimit_FullMethodName}
	return icpt(ctx, &sc.in, info, func(ctx context.Context, req any) (any, error) {
		in, ok := req.(*rlsv3.RateLimitRequest)
		if !ok {
			return nil, status.Errorf(codes.Internal, "sidecar: an interceptor passed a %T, want *RateLimitRequest", req)
		}
		return s.answer(ctx, in, sc)
	})
}

// answer decides in into a pooled reply.
func (s *Server) answer(ctx context.Context, in *rlsv3.RateLimitRequest, sc *scratch) (any, error) {
	r := s.replies.Get().(*reply)
	if err := s.check(ctx, in, sc, r, apiGRPC); err != nil {
		s.replies.Put(r)
		return nil, grpcError(err)
	}
	return r, nil
}

// checkHTTP decides sc.in for api (apiHTTP or apiForwardAuth) within hr's
// context (and its trace, with a Tracer) into a pooled reply, and sets the
// decision's headers on w. The caller puts the reply back. A request the
// limiter refuses (enforcer.ErrBadRequest) has its 400 written and gives nil.
func (s *Server) checkHTTP(w http.ResponseWriter, hr *http.Request, sc *scratch, api int) *reply {
	r := s.replies.Get().(*reply)
	ctx := hr.Context()
	if s.opts.Tracer != nil {
		ctx = s.opts.Propagator.Extract(ctx, propagation.HeaderCarrier(hr.Header))
	}
	if err := s.check(ctx, &sc.in, sc, r, api); err != nil {
		s.replies.Put(r)
		writeError(w, http.StatusBadRequest, err.Error())
		return nil
	}
	h := w.Header()
	for _, x := range r.hdrs {
		h.Set(x.Name, x.Value)
	}
	return r
}

func grpcError(err error) error {
	if errors.Is(err, enforcer.ErrBadRequest) {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

// serviceDesc is envoy.service.ratelimit.v3.RateLimitService with the
// pooled handler.
var serviceDesc = grpc.ServiceDesc{
	ServiceName: rlsv3.RateLimitService_ServiceDesc.ServiceName,
	HandlerType: (*rlsv3.RateLimitServiceServer)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "ShouldRateLimit",
		Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			return srv.(*Server).handle(ctx, dec, icpt)
		},
	}},
	Metadata: rlsv3.RateLimitService_ServiceDesc.Metadata,
}

// codec is gRPC's protobuf codec that also returns a reply to its pool
// once it is marshaled: the last moment gRPC reads it.
type codec struct {
	s    *Server
	base encoding.CodecV2
}

func (c codec) Name() string                                { return c.base.Name() }
func (c codec) Unmarshal(data mem.BufferSlice, v any) error { return c.base.Unmarshal(data, v) }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	r, ok := v.(*reply)
	if !ok {
		return c.base.Marshal(v)
	}
	out, err := c.base.Marshal(&r.RateLimitResponse)
	c.s.replies.Put(r)
	return out, err
}

// NewGRPCServer returns a gRPC server with the rate limit service and gRPC
// health (grpc.health.v1) registered. Its answers reuse pooled memory,
// returned by a codec once each is marshaled, so opt must not hold a stats
// handler that reads messages after they are sent (sizes are fine), nor
// enable golang.org/x/net/trace tracing; it serves RPCs on 64 × GOMAXPROCS
// worker goroutines (more in a burst); unary interceptors get the
// request as a *RateLimitRequest and an answer of another type. It has the
// bounds of the HTTP API: a request of at most Options.MaxBody (larger:
// ResourceExhausted, unread), MaxStreams RPCs per connection, and the
// handshake, idle and keepalive timeouts (HandshakeTimeout, IdleTimeout,
// PingInterval); opt may override them. To serve on a grpc.Server of your
// own, use Register.
func (s *Server) NewGRPCServer(opt ...grpc.ServerOption) *grpc.Server {
	base := encoding.GetCodecV2(proto.Name)
	g := grpc.NewServer(append(append([]grpc.ServerOption{
		grpc.ForceServerCodecV2(codec{s: s, base: base}),
		// Goroutines that serve one RPC after another keep the stacks they
		// grew (gRPC, the limiter, go-redis), where a goroutine per RPC
		// grows a fresh one each time: in a profile at 10 000 checks/s,
		// stack growth was 13% of the sidecar's CPU.
		grpc.NumStreamWorkers(uint32(streamWorkers * runtime.GOMAXPROCS(0))),
	}, s.boundOptions()...), opt...)...)
	g.RegisterService(&serviceDesc, s)
	healthpb.RegisterHealthServer(g, s.health)
	if s.opts.StatusJoin != nil {
		alsv3.RegisterAccessLogServiceServer(g, s.opts.StatusJoin)
	}
	return g
}

// streamWorkers × GOMAXPROCS goroutines serve RPCs (NewGRPCServer): as many
// as the limiter's default MaxInFlight, since an RPC holds its worker while
// it waits for Redis or for a place.
const streamWorkers = 64

// Register registers the rate limit service (ShouldRateLimit, a fresh
// response per call), gRPC health and, with Options.StatusJoin, Envoy's
// access log service on g.
func (s *Server) Register(g grpc.ServiceRegistrar) {
	rlsv3.RegisterRateLimitServiceServer(g, s)
	healthpb.RegisterHealthServer(g, s.health)
	if s.opts.StatusJoin != nil {
		alsv3.RegisterAccessLogServiceServer(g, s.opts.StatusJoin)
	}
}

// Handler returns the HTTP API:
//
//	POST /v1/check   a RateLimitRequest in JSON; the RateLimitResponse in JSON, 200 or 429
//	POST /json       the same, at envoyproxy/ratelimit's path
//	ANY  /v1/forward-auth  a gateway's forward-auth call: 200, or 429 with Retry-After (ForwardAuthOptions)
//	GET  /v1/usage   the caller's API key's rules and usage, read without charging (UsageOptions)
//	GET  /healthz    200 while the process serves
//	GET  /readyz     200 when ready (see Ready), else 503
//	GET  /metrics    Prometheus metrics of Options.Registry
//	GET  /debug/pprof/...  Go's profiles, with Options.Pprof
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/check", s.serveCheck)
	mux.HandleFunc("POST /json", s.serveCheck)
	if !s.opts.Usage.Off {
		mux.HandleFunc("GET /v1/usage", s.serveUsage)
	}
	if !s.opts.ForwardAuth.Off {
		mux.HandleFunc(ForwardAuthPath, s.serveForwardAuth)
	}
	s.probes(mux)
	if s.opts.Pprof {
		// No /debug/pprof/cmdline: the command line can hold a Redis
		// URL's password (pprof.Index answers it 404, unknown profile);
		// go tool pprof needs only profile and symbol.
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// AdminHandler returns the probes and metrics alone, for a listener that
// the kubelet and Prometheus reach and nothing else should (sluice serve
// --admin-http): GET /healthz, /readyz and /metrics, as Handler serves them.
// No check, no usage, no profiles.
func (s *Server) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	s.probes(mux)
	return mux
}

// probes adds /healthz, /readyz and /metrics to mux.
func (s *Server) probes(mux *http.ServeMux) {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", s.serveReady)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.opts.Registry, promhttp.HandlerOpts{}))
}

func (s *Server) serveCheck(w http.ResponseWriter, hr *http.Request) {
	sc := s.scratch.Get().(*scratch)
	defer s.scratch.Put(sc)
	body, err := readBody(http.MaxBytesReader(w, hr.Body, s.opts.MaxBody), sc.body[:0])
	sc.body = body[:0]
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body larger than %d bytes", tooBig.Limit))
			return
		}
		writeError(w, http.StatusBadRequest, "reading the body: "+err.Error())
		return
	}
	if err := protojson.Unmarshal(body, &sc.in); err != nil {
		s.checks[apiHTTP][codeInvalid].Inc()
		writeError(w, http.StatusBadRequest, "the body is not a RateLimitRequest in JSON: "+err.Error())
		return
	}
	r := s.checkHTTP(w, hr, sc, apiHTTP)
	if r == nil {
		return
	}
	defer s.replies.Put(r)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	code := http.StatusOK
	if r.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		code = http.StatusTooManyRequests
		switch sc.d.Reason {
		case decision.ReasonLimiterUnavailable:
			code = s.opts.UnavailableStatus
		case decision.ReasonShed:
			code = http.StatusServiceUnavailable // load shedding: the backend is overloaded
		}
	}
	out, err := protojson.MarshalOptions{}.MarshalAppend(body[:0], &r.RateLimitResponse)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	out = append(out, '\n')
	sc.body = out[:0]
	w.WriteHeader(code)
	_, _ = w.Write(out)
}

// readBody appends all of rd to buf.
func readBody(rd io.Reader, buf []byte) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := rd.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

func writeError(w http.ResponseWriter, code int, msg string) {
	b, _ := json.Marshal(struct {
		Error string `json:"error"`
	}{msg})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}

// ErrDraining is Ready's answer once Drain was called.
var ErrDraining = errors.New("sidecar: draining: shutting down")

// ErrBreakerOpen is Ready's answer, with Options.RequireRedis, while the
// limiter's Redis circuit breaker is open.
var ErrBreakerOpen = errors.New("sidecar: the Redis circuit breaker is open: decisions follow the failure modes")

// ErrDecisionPath is wrapped by Ready's answer, with Options.RequireRedis,
// while the readiness probe's decisions fail in Redis (Options.Probe).
var ErrDecisionPath = errors.New("sidecar: Redis refuses the decision script")

// ErrNoRecords is wrapped by Ready's answer, with Options.RequireRecords,
// while the decision records' sink (Kafka) does not answer.
var ErrNoRecords = errors.New("sidecar: decision records cannot be delivered")

// ErrNoRules is Ready's answer, with Options.RequireRules, while no rule
// set has been loaded.
var ErrNoRules = errors.New("sidecar: no rule set loaded yet (sluice rules push)")

// Ready reports whether the sidecar should get traffic: nil unless it is
// draining, or its Redis answered MOVED (enforcer.Limiter.Misrouted: a
// Cluster node given as a single node), or, with Options.RequireRedis, Redis did not answer a PING (one
// at most every second; the answer is kept in between) or the Redis circuit
// breaker is open (Redis too slow for the budget), or, with
// Options.RequireRules, no rule set was loaded.
func (s *Server) Ready(ctx context.Context) error { return s.ready(ctx, true) }

// ready is Ready; without wait it answers from the pings' kept answers
// and leaves a stale one to be renewed in the background (cachedPing).
func (s *Server) ready(ctx context.Context, wait bool) error {
	if s.draining.Load() {
		return ErrDraining
	}
	if err := s.lim.Misrouted(); err != nil {
		// A misconfiguration, not an outage: most decisions degrade for
		// ever, and only a restart with a Cluster client cures it.
		return err
	}
	if set := s.lim.Rules(); s.opts.RequireRules && set.Version == 0 && len(set.Rules) == 0 {
		return ErrNoRules
	}
	if err := s.pingRedis(ctx, wait); err != nil && s.opts.RequireRedis {
		return err
	}
	if s.opts.RequireRedis && s.opts.Probe != nil {
		// Redis answers a PING, but refuses the script (NOPERM, OOM, ...).
		if st := s.opts.Probe.Status(); st.Err != nil {
			return fmt.Errorf("%w (%s): %w", ErrDecisionPath, st.Cause, st.Err)
		}
	}
	if s.opts.RequireRedis && s.lim.BreakerOpen() {
		// Redis answers a PING, but not within the decisions' budget.
		return ErrBreakerOpen
	}
	if err := s.pingRecords(ctx, wait); err != nil && s.opts.RequireRecords {
		return err
	}
	return nil
}

// UpdateHealth sets the gRPC health status from Ready; sluice serve calls it every
// refresh interval.
func (s *Server) UpdateHealth(ctx context.Context) {
	st := healthpb.HealthCheckResponse_SERVING
	if s.Ready(ctx) != nil {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	if s.draining.Load() {
		return // Drain has shut the health server down for good
	}
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, st)
}

// Drain marks the sidecar as shutting down: /readyz answers 503 and gRPC
// health NOT_SERVING from now on, while checks are still answered.
func (s *Server) Drain() {
	s.draining.Store(true)
	s.health.Shutdown()
}

// cachedPing keeps the answer of a readiness ping (Redis's, the records
// sink's) and runs one ping at a time, in a goroutine of its own, so that
// no caller holds another up while it waits.
type cachedPing struct {
	mu       sync.Mutex
	at       time.Time     // when the kept answer's ping began; zero: none yet
	err      error         // the kept answer
	inflight chan struct{} // closed when the ping under way ends; nil: none
}

// ping returns the answer of a ping begun less than maxAge ago. Else it
// starts one (f, 500 ms at most, unless one is under way) and, when wait
// is set or no answer is kept yet, waits for it (or ctx's end); without
// wait it answers what is kept (/readyz: found by a fresh user, it took 1 to
// 2.5 s while Redis was frozen, two pings in a row and the probes queued on
// each other, past Kubernetes' 1 s probe timeout). sluice serve's health
// update waits, every --refresh, so what is kept is at most that old.
func (c *cachedPing) ping(ctx context.Context, maxAge time.Duration, wait bool, f func(ctx context.Context) error) error {
	c.mu.Lock()
	if !c.at.IsZero() && time.Since(c.at) < maxAge {
		err := c.err
		c.mu.Unlock()
		return err
	}
	done := c.inflight
	if done == nil {
		done = make(chan struct{})
		c.inflight = done
		go func() {
			start := time.Now()
			pctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			err := f(pctx)
			cancel()
			c.mu.Lock()
			c.at, c.err, c.inflight = start, err, nil
			c.mu.Unlock()
			close(done)
		}()
	}
	kept := !c.at.IsZero()
	err := c.err
	c.mu.Unlock()
	if kept && !wait {
		return err
	}
	select {
	case <-done:
	case <-ctx.Done():
		if !kept {
			return fmt.Errorf("not checked yet: %w", ctx.Err())
		}
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// pingRedis PINGs Redis (every master of a Cluster) at most once a second;
// ten times a second while the circuit breaker is open, whose opening a
// PING answered before it says nothing about (found by a fresh user: a
// Redis refusing connections read "answers PING, but the circuit breaker is
// open: too slow" for up to a second).
func (s *Server) pingRedis(ctx context.Context, wait bool) error {
	if s.opts.Redis == nil {
		return nil
	}
	maxAge := time.Second
	if s.lim.BreakerOpen() {
		maxAge = 100 * time.Millisecond
	}
	return s.redisPing.ping(ctx, maxAge, wait, func(ctx context.Context) error {
		var err error
		if c, ok := s.opts.Redis.(*redis.ClusterClient); ok {
			err = c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return n.Ping(ctx).Err() })
		} else {
			err = s.opts.Redis.Ping(ctx).Err()
		}
		switch cause := enforcer.ClassifyRedisError(err); {
		case err == nil:
		case cause.Refusal() || cause == enforcer.CauseTLS:
			err = fmt.Errorf("redis refuses sluice (cause %s): %w", cause, err)
		case errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission):
			// A file read to connect (a rotated password, a TLS key): this
			// host's, not Redis's (found by a fresh user: a deleted
			// --redis-password-file read "redis does not answer").
			err = fmt.Errorf("sluice cannot read a file it connects to redis with: %w", err)
		case enforcer.ClosedOnConnect(err) && plainAddr(s.opts.Redis) != "":
			// A Redis at its maxclients says so to a new connection and
			// closes it: go-redis reports the write that met the closed
			// socket (found by a fresh user: "write: broken pipe").
			if reply := enforcer.ReplyOnConnect(ctx, plainAddr(s.opts.Redis)); reply != "" {
				err = fmt.Errorf("redis closes new connections: %s: %w", reply, err)
			} else {
				err = fmt.Errorf("redis does not answer: %w", err)
			}
		default:
			err = fmt.Errorf("redis does not answer: %w", err)
		}
		return err
	})
}

// plainAddr is the address of a single-node client without TLS, else "".
func plainAddr(rdb redis.UniversalClient) string {
	if c, ok := rdb.(*redis.Client); ok && c.Options().TLSConfig == nil {
		return c.Options().Addr
	}
	return ""
}

// pingRecords pings the decision records' sink at most once a second.
func (s *Server) pingRecords(ctx context.Context, wait bool) error {
	if s.opts.Records == nil {
		return nil
	}
	return s.recordsPing.ping(ctx, time.Second, wait, func(ctx context.Context) error {
		if err := s.opts.Records.Ping(ctx); err != nil {
			return fmt.Errorf("%w: %w", ErrNoRecords, err)
		}
		return nil
	})
}

func (s *Server) serveReady(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	set := s.lim.Rules()
	rulesLine := fmt.Sprintf("rules: domain %q, version %d, %s, %d dynamic\n", set.Domain, set.Version, count(len(set.Rules), "rule"), s.lim.DynamicRules())
	redisLine := "redis: not checked\n"
	if s.opts.Redis != nil {
		var probe enforcer.RedisStatus
		if s.opts.Probe != nil {
			probe = s.opts.Probe.Status()
		}
		switch err := s.pingRedis(r.Context(), false); {
		case s.lim.Misrouted() != nil:
			redisLine = "redis: answers MOVED: a Redis Cluster node given as a single node; restart with --redis-cluster (decisions of other nodes' slots follow each rule's failure mode)\n"
		case err != nil:
			redisLine = "redis: " + err.Error()
			if h := enforcer.CauseHint(enforcer.ClassifyRedisError(err)); h != "" {
				redisLine += "; " + h
			}
			redisLine += " (decisions follow each rule's failure mode)\n"
		case probe.Err != nil:
			redisLine = probeLine(probe)
		case s.lim.BreakerOpen():
			redisLine = "redis: answers PING, but the circuit breaker is open: too slow for the budget (decisions follow each rule's failure mode)\n"
		case s.opts.InProcessRedis:
			redisLine = "redis: ok, in-process (a try-out: this sidecar counts alone; give --redis for a shared Redis)\n"
		default:
			redisLine = "redis: ok\n"
		}
	}
	if s.opts.Probe != nil {
		redisLine += policyLine(s.opts.Probe.Status().Memory)
	}
	for _, region := range slices.Sorted(maps.Keys(s.opts.HomeProbes)) {
		redisLine += homeLine(region, s.opts.HomeProbes[region].Status())
	}
	recordsLine := ""
	if s.opts.Records != nil {
		if err := s.pingRecords(r.Context(), false); err != nil {
			recordsLine = "decision records: " + err.Error() + " (records are dropped and counted; decisions go on)\n"
		} else {
			recordsLine = "decision records: ok\n"
		}
	}
	if err := s.ready(r.Context(), false); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "not ready: "+err.Error()+"\n"+rulesLine+redisLine+recordsLine)
		return
	}
	_, _ = io.WriteString(w, "ready\n"+rulesLine+redisLine+recordsLine)
}

// namedIPError names, in the limiter's refusal of a client_ip that is no
// address, the Envoy entry it came from (remote_address,
// masked_remote_address or client_ip).
func namedIPError(in *rlsv3.RateLimitRequest, err error) error {
	for i, d := range in.GetDescriptors() {
		for _, e := range d.GetEntries() {
			if k, _ := rules.KeyFor(e.GetKey()); k != rules.KeyClientIP {
				continue
			}
			if _, bad := rules.CheckClientIP(e.GetValue()); bad != nil {
				return badRequest("descriptor %d: entry %s: %v", i+1, e.GetKey(), bad)
			}
		}
	}
	return err
}

// count writes n with the noun, singular for 1: "1 rule", "2 rules". noun
// is the singular; an s makes the plural.
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
