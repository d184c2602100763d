package sidecar

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/rules"
)

// UsageOptions configure GET /v1/usage, the endpoint where an API's
// customers read what their own API key's rules hold (see
// docs/customers.md). The zero value serves it with the defaults that
// DefaultUsageOptions shows.
type UsageOptions struct {
	// Off turns the endpoint off (404).
	Off bool
	// KeyHeader is the request header that carries the caller's API key,
	// the one the gateway maps to the api_key descriptor. Default
	// "x-api-key".
	KeyHeader string
	// Limit requests per Period per client address: the endpoint's own
	// rule, a fixed window counted in Redis (an enforcer.Override, as
	// Envoy's per-descriptor limit override), checked before anything else,
	// so that trying keys one after another gets 429s. It charges none of
	// the rule set's rules. Defaults 30 per minute.
	Limit  int64
	Period time.Duration
	// ClientIPHeader names a header that a trusted proxy in front of the
	// sidecar sets to the client's address (Envoy's
	// x-envoy-external-address); its first address keys the endpoint's
	// rule, when the request comes from a trusted proxy
	// (ForwardAuthOptions.TrustedProxies, loopback by default); from any
	// other address, the header is ignored. "" (the default): the
	// connection's remote address. Never name a header that clients can set
	// themselves past the proxy.
	ClientIPHeader string
	// Denials, when set, adds the key's denials per rule over the last
	// hour and day (ClickHouse, in sluice serve --clickhouse). Nil: the
	// answer's denial counts are null.
	Denials Denials
	// Timeout bounds one answer: the Redis reads and the denials' query,
	// which gets a quarter of it (a slow analytics store costs an answer
	// at most that, and the answer says the counts are unavailable).
	// Default 2 s.
	Timeout time.Duration
}

// Denials reads an API key's past denials.
type Denials interface {
	// KeyDenials returns, by rule id, the key's denied requests with an
	// event time in [now-1h, now) and [now-24h, now). A rule without
	// denials may be missing from the map.
	KeyDenials(ctx context.Context, apiKey string, now time.Time) (map[string]DenialCount, error)
}

// DenialCount is one rule's denials of one key.
type DenialCount struct {
	LastHour, LastDay int64
}

// DefaultUsageOptions returns the defaults that zero fields of UsageOptions
// get.
func DefaultUsageOptions() UsageOptions {
	return UsageOptions{KeyHeader: "x-api-key", Limit: 30, Period: time.Minute, Timeout: 2 * time.Second}
}

func (o *UsageOptions) validate() error {
	def := DefaultUsageOptions()
	if o.KeyHeader == "" {
		o.KeyHeader = def.KeyHeader
	}
	if o.Limit == 0 {
		o.Limit = def.Limit
	}
	if o.Period == 0 {
		o.Period = def.Period
	}
	if o.Timeout == 0 {
		o.Timeout = def.Timeout
	}
	if o.Limit < 0 || o.Period < time.Second || o.Timeout < 0 {
		return fmt.Errorf("sidecar: usage endpoint: limit %d per %v: want a positive limit per at least 1s, and a positive timeout", o.Limit, o.Period)
	}
	if http.CanonicalHeaderKey(o.KeyHeader) == http.CanonicalHeaderKey(o.ClientIPHeader) {
		return fmt.Errorf("sidecar: usage endpoint: the key header and the client address header are both %q", o.KeyHeader)
	}
	return nil
}

// maxUsageKey is the longest API key /v1/usage reads (longer: 400).
const maxUsageKey = 512

// usage is the state of GET /v1/usage.
type usage struct {
	opts  UsageOptions
	limit enforcer.Override // Entity set per request
	codes *prometheus.CounterVec
}

// UsageResponse is GET /v1/usage's answer, in JSON. Rules in shadow mode
// are left out: they deny nothing, and the headers never show them either.
// Every field is present
// for every key, known to the key store or not: an unknown key's answer
// has the same fields (empty account, org and tier, and the rules that
// match any key).
type UsageResponse struct {
	// Time the state was read at (Redis's clock), RFC 3339 in UTC.
	Time time.Time `json:"time"`
	// Domain of the rule set.
	Domain string `json:"domain"`
	// Account, Org and Tier are the key's parents in the key store.
	Account string `json:"account"`
	Org     string `json:"org"`
	Tier    string `json:"tier"`
	// Denials says where the denial counts come from: "clickhouse", or
	// "none" (not configured; the counts are null), or "unavailable" (the
	// query failed; null).
	Denials string      `json:"denials"`
	Rules   []UsageRule `json:"rules"`
	// Errors says what could not be read, in words; empty when all was.
	Errors []string `json:"errors"`
}

// UsageRule is one rule in UsageResponse.
type UsageRule struct {
	ID          string `json:"id"`
	Description string `json:"description"`
	Algorithm   string `json:"algorithm"`
	// Dynamic is true for a rule the abuse detector or an operator added
	// for a while; Expires is then its end.
	Dynamic bool       `json:"dynamic"`
	Expires *time.Time `json:"expires"`
	// Limit, PeriodSeconds and Burst are the rule's own (the whole
	// limit, over every region for a global rule); Capacity is what this
	// region holds of it (burst for a token bucket, scaled by the share).
	Limit         int64   `json:"limit"`
	PeriodSeconds float64 `json:"period_seconds"`
	Burst         int64   `json:"burst"`
	Capacity      int64   `json:"capacity"`
	// WindowSeconds is RateLimit-Policy's window: the time to refill from
	// empty (token bucket), the window (sliding, fixed), 0 (concurrency).
	WindowSeconds float64 `json:"window_seconds"`
	// Remaining is the whole requests (cost units) the key could spend now,
	// ResetSeconds the time until the rule is back to full (token bucket,
	// sliding window), its window ends (fixed window) or a slot frees
	// (concurrency). Both null when not shown: the rule's count is shared
	// beyond the key's account and organisation (CountedPer), or Redis
	// could not be read (Errors says so).
	Remaining    *int64   `json:"remaining"`
	ResetSeconds *float64 `json:"reset_seconds"`
	// CountedPer names what one count is kept for: "api_key", "account",
	// "org", or "shared" (a count that other customers' requests also
	// spend, such as a whole tier's or a route's).
	CountedPer string `json:"counted_per"`
	// Global rules are one limit over every region, of which this region
	// holds Share; Pinned ones are counted in one home region (HomeRegion,
	// "" for this one); GCounter ones count every region's requests.
	Global     bool    `json:"global"`
	Share      float64 `json:"share"`
	Pinned     bool    `json:"pinned"`
	HomeRegion string  `json:"home_region"`
	GCounter   bool    `json:"g_counter"`
	// DeniedLastHour and DeniedLastDay count the key's requests this rule
	// denied (null without ClickHouse).
	DeniedLastHour *int64 `json:"denied_last_hour"`
	DeniedLastDay  *int64 `json:"denied_last_day"`
}

// initUsage sets up /v1/usage; New calls it.
func (s *Server) initUsage() error {
	o := s.opts.Usage
	if err := o.validate(); err != nil {
		return err
	}
	u := &usage{opts: o, limit: enforcer.Override{Limit: o.Limit, Period: o.Period}}
	u.codes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_sidecar_usage_requests_total",
		Help: "GET /v1/usage requests by answer: ok, over_limit (the endpoint's own rule), no_key, bad_request, unavailable.",
	}, []string{"code"})
	for _, c := range []string{"ok", "over_limit", "no_key", "bad_request", "unavailable"} {
		u.codes.WithLabelValues(c)
	}
	if err := s.opts.Registry.Register(u.codes); err != nil {
		return fmt.Errorf("sidecar: registering metrics: %w", err)
	}
	s.usage = u
	return nil
}

// serveUsage answers GET /v1/usage: the endpoint's own rule first (every
// request counts, with or without a key), then the key's rules, read
// without charging (enforcer.Limiter.Usage), and its denials.
func (s *Server) serveUsage(w http.ResponseWriter, hr *http.Request) {
	u := s.usage
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("Vary", u.opts.KeyHeader)
	ctx := hr.Context()
	if s.opts.Tracer != nil {
		var span trace.Span
		ctx, span = s.opts.Tracer.Start(s.opts.Propagator.Extract(ctx, propagation.HeaderCarrier(hr.Header)), SpanUsage, trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
	}
	ctx, cancel := context.WithTimeout(ctx, u.opts.Timeout)
	defer cancel()

	// A key or client address given twice: a gateway that authenticates
	// one copy would let the caller read the other's usage.
	for _, name := range []string{u.opts.KeyHeader, u.opts.ClientIPHeader} {
		if name == "" {
			continue
		}
		if _, err := once(hr.Header, name); err != nil {
			u.codes.WithLabelValues("bad_request").Inc()
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
	}
	ip := clientAddr(hr, u.opts.ClientIPHeader, s.opts.ForwardAuth.TrustedProxies)
	var d enforcer.Decision
	over := u.limit
	over.Entity = "sluice /v1/usage client_ip " + ip
	req := enforcer.Request{Domain: s.lim.Rules().Domain, Parts: []enforcer.Part{{
		Descriptors: rules.Descriptors{rules.KeyClientIP: ip, rules.KeyRoute: "/v1/usage", rules.KeyMethod: http.MethodGet},
		Override:    &over,
	}}}
	if err := s.lim.Decide(ctx, &req, &d); err != nil {
		u.codes.WithLabelValues("bad_request").Inc()
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	// The endpoint's rule is the only one decided here, so a shadow denial
	// (a limiter in shadow mode, sluice serve --shadow) is its: the
	// endpoint's own rule holds whatever mode the customers' rules are in.
	if d.Outcome == decision.Denied || d.Outcome == decision.DegradedClosed || d.Outcome == decision.ShadowDenied {
		d.WriteHeaders(h, s.opts.Headers)
		u.codes.WithLabelValues("over_limit").Inc()
		writeError(w, http.StatusTooManyRequests, fmt.Sprintf("too many usage requests from this address: at most %d per %v", u.opts.Limit, u.opts.Period))
		return
	}

	key := hr.Header.Get(u.opts.KeyHeader)
	switch {
	case key == "":
		u.codes.WithLabelValues("no_key").Inc()
		h.Set("WWW-Authenticate", "ApiKey header="+strconv.Quote(u.opts.KeyHeader))
		writeError(w, http.StatusUnauthorized, "no API key: send yours in the "+u.opts.KeyHeader+" header")
		return
	case len(key) > maxUsageKey:
		u.codes.WithLabelValues("bad_request").Inc()
		writeError(w, http.StatusBadRequest, fmt.Sprintf("the %s header is longer than %d bytes", u.opts.KeyHeader, maxUsageKey))
		return
	}
	resp, err := s.readUsage(ctx, key)
	if err != nil {
		u.codes.WithLabelValues("bad_request").Inc()
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	b, err := json.MarshalIndent(resp, "", "  ")
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	label := "ok"
	if len(resp.Errors) > 0 {
		label = "unavailable" // answered, but Redis or the analytics store did not
	}
	u.codes.WithLabelValues(label).Inc()
	h.Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}

// readUsage builds the answer for key. The key is only ever a descriptor
// value (hashed into Redis keys) and a bound query parameter: it reaches
// no Redis key, query text or log as it is.
func (s *Server) readUsage(ctx context.Context, key string) (*UsageResponse, error) {
	u := s.usage
	us, err := s.lim.Usage(ctx, rules.Descriptors{rules.KeyAPIKey: key}, time.Time{})
	if err != nil {
		return nil, err
	}
	resp := &UsageResponse{
		Time: us.Now.UTC(), Domain: s.lim.Rules().Domain, Denials: "none",
		Account: us.Descriptors[rules.KeyAccount], Org: us.Descriptors[rules.KeyOrg], Tier: us.Descriptors[rules.KeyTier],
		Rules: make([]UsageRule, 0, len(us.Rules)), Errors: []string{},
	}
	var denials map[string]DenialCount
	if u.opts.Denials != nil {
		resp.Denials = "clickhouse"
		dctx, cancel := context.WithTimeout(ctx, u.opts.Timeout/4)
		denials, err = u.opts.Denials.KeyDenials(dctx, key, us.Now)
		cancel()
		if err != nil {
			resp.Denials = "unavailable"
			resp.Errors = append(resp.Errors, "denials: the analytics store did not answer")
			s.opts.Logger.Warn("usage: reading a key's denials", "err", err)
			denials = nil
		}
	}
	redisFailed, refused := false, error(nil)
	for i := range us.Rules {
		ru := &us.Rules[i]
		if ru.Shadow {
			continue // an operator's trial, never denies: hidden, as from the headers
		}
		r := ru.Rule
		out := UsageRule{
			ID: r.ID, Description: r.Description, Algorithm: r.Algorithm.String(),
			Dynamic: ru.Dynamic, Limit: r.Limit, PeriodSeconds: r.Period.Seconds(), Burst: r.Burst,
			Capacity: ru.Limit, WindowSeconds: ru.Window.Seconds(), CountedPer: countedPer(r),
			Global: r.Global, Share: ru.Share, Pinned: r.Pinned, HomeRegion: ru.Home, GCounter: r.GCounter,
		}
		if r.GCounter {
			out.Algorithm = "g_counter"
		}
		if out.Description == "" {
			out.Description = r.Reason // a dynamic rule's
		}
		if !r.ExpiresAt.IsZero() {
			e := r.ExpiresAt.UTC()
			out.Expires = &e
		}
		switch {
		case out.CountedPer == "shared":
		case ru.Err != nil && enforcer.ClassifyRedisError(ru.Err) == enforcer.CauseNoPerm:
			refused = ru.Err
		case ru.Err != nil:
			redisFailed = true
		default:
			rem, reset := ru.Remaining, ru.Reset.Seconds()
			out.Remaining, out.ResetSeconds = &rem, &reset
		}
		if u.opts.Denials != nil && resp.Denials == "clickhouse" {
			dc := denials[r.ID]
			out.DeniedLastHour, out.DeniedLastDay = &dc.LastHour, &dc.LastDay
		}
		resp.Rules = append(resp.Rules, out)
	}
	if redisFailed {
		resp.Errors = append(resp.Errors, "remaining: Redis could not be read; requests are decided by each rule's failure mode")
	}
	if refused != nil {
		// The ACL user may decide but not run the read-only usage script:
		// decisions are not affected (found by a fresh user, told they were).
		resp.Errors = append(resp.Errors, "remaining: Redis refuses the read-only usage script to sluice's ACL user (NOPERM "+
			enforcer.NoPermCommand(refused)+"; docs/operations.md, \"Production Redis\"); decisions are not affected")
	}
	return resp, nil
}

// countedPer names whose count a rule keeps for a request that carries
// only an API key and its parents: the first of api_key, account and org
// that the rule counts per value, else "shared".
func countedPer(r *rules.Rule) string {
	best := "shared"
	rank := 3
	for i := range r.Match {
		m := &r.Match[i]
		if m.Shared {
			continue
		}
		switch {
		case m.Key == rules.KeyAPIKey && rank > 0:
			best, rank = "api_key", 0
		case m.Key == rules.KeyAccount && rank > 1:
			best, rank = "account", 1
		case m.Key == rules.KeyOrg && rank > 2:
			best, rank = "org", 2
		}
	}
	return best
}

// clientAddr is the client's address: the first address of the header a
// trusted proxy sets, when the request comes from one (an address in
// trustedProxies, ForwardAuthOptions.TrustedProxies), else the connection's
// remote address: anyone else could name any address, and so dodge the
// endpoint's own limit.
func clientAddr(hr *http.Request, header string, trustedProxies []netip.Prefix) string {
	host, _, err := net.SplitHostPort(hr.RemoteAddr)
	if err != nil {
		host = hr.RemoteAddr
	}
	if header != "" {
		if peer, perr := netip.ParseAddr(host); perr == nil && trusted(trustedProxies, peer) {
			if v := hr.Header.Get(header); v != "" {
				first, _, _ := strings.Cut(v, ",")
				return strings.TrimSpace(first)
			}
		}
	}
	return host
}
