package enforcer

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/rules"
)

//go:embed tokenbucket.lua
var tokenBucketLua string

// ErrBadRequest is returned for a request the limiter cannot decide (for
// example a negative cost).
var ErrBadRequest = errors.New("bad request")

// Request is one request to decide.
type Request struct {
	Domain      string
	Descriptors rules.Descriptors
	// Cost in tokens (hits_addend); 0 means 1.
	Cost uint32
	// Now is the caller's clock (replays, tests). The zero value uses Redis
	// TIME: one clock per Redis shard, immune to gateway skew.
	Now time.Time
	// Optional, copied into the decision record.
	RequestID string
	UserAgent string
	Status    uint32
}

// Options configure a Limiter. The zero value is usable; see each field.
type Options struct {
	// Region this enforcer runs in, e.g. "eu-west". Default "local".
	Region string
	// Instance names this enforcer within its region. Default "0".
	Instance string
	// Regions is how many regions share a global rule; a global rule with no
	// fresh share gets 1/Regions of its limit (the static split). Default 1.
	Regions int
	// ShareTTL is how old a share may be (against the decision's time) before
	// the static split replaces it. Default 30 s.
	ShareTTL time.Duration
	// Sink receives every decision record; nil logs nothing.
	Sink Sink
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Registerer for the limiter's metrics; nil registers none.
	Registerer prometheus.Registerer
}

func (o *Options) validate() error {
	if o.Region == "" {
		o.Region = "local"
	}
	if o.Instance == "" {
		o.Instance = "0"
	}
	if o.Regions == 0 {
		o.Regions = 1
	}
	if o.Regions < 0 {
		return fmt.Errorf("enforcer: Regions must be >= 1, got %d", o.Regions)
	}
	if o.ShareTTL == 0 {
		o.ShareTTL = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return nil
}

// Limiter decides requests against a rule set with one Redis script call per
// request: every matching rule is a token bucket, checked all at once and
// committed only if all allow.
//
// Its zero value is not usable: build one with New. A Limiter is safe for
// concurrent use. Most callers want Check.
//
// Metrics (on Options.Registerer):
//
//	sluice_enforcer_decisions_total{outcome}   decisions by outcome
//	sluice_enforcer_redis_errors_total         failed script calls
//	sluice_enforcer_control_refreshes_total{result} dynamic rule / share loads
type Limiter struct {
	rdb    redis.UniversalClient
	script *redis.Script
	store  *rules.Store
	opts   Options

	static  atomic.Pointer[rules.Set]
	control atomic.Pointer[rules.Control]
	lastLog atomic.Int64 // unix ns of the last storage-error log line

	decisions  [len(outcomeNames)]prometheus.Counter
	redisErrs  prometheus.Counter
	refreshOK  prometheus.Counter
	refreshBad prometheus.Counter
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
	l := &Limiter{rdb: rdb, script: redis.NewScript(tokenBucketLua), store: rules.NewStore(rdb), opts: opts}
	l.static.Store(set)
	l.control.Store(&rules.Control{})
	dec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_enforcer_decisions_total", Help: "Decisions by outcome.",
	}, []string{"outcome"})
	for o := Allowed; o <= DegradedClosed; o++ {
		l.decisions[o] = dec.WithLabelValues(o.String())
	}
	l.redisErrs = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_enforcer_redis_errors_total", Help: "Redis script calls that failed and were handed to the rules' failure modes.",
	})
	ref := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_enforcer_control_refreshes_total", Help: "Loads of dynamic rules and shares from Redis, by result.",
	}, []string{"result"})
	l.refreshOK, l.refreshBad = ref.WithLabelValues("ok"), ref.WithLabelValues("error")
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{dec, l.redisErrs, ref} {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("enforcer: registering metrics: %w", err)
			}
		}
	}
	return l, nil
}

// SetRules swaps the static rule set; requests see the whole old or the whole
// new set.
func (l *Limiter) SetRules(s *rules.Set) { l.static.Store(s) }

// Rules returns the static rule set in force.
func (l *Limiter) Rules() *rules.Set { return l.static.Load() }

// Control returns the dynamic rules and shares in force.
func (l *Limiter) Control() *rules.Control { return l.control.Load() }

// Refresh loads dynamic rules (those not expired at now) and shares from
// Redis and swaps them in. Production calls it every second; replays call it
// at event-time barriers. On error the previous control state stays.
func (l *Limiter) Refresh(ctx context.Context, now time.Time) error {
	c, err := l.store.Load(ctx, now)
	if err != nil {
		l.refreshBad.Inc()
		return err
	}
	if c.Bad > 0 {
		l.opts.Logger.Warn("skipped undecodable control entries", "count", c.Bad)
	}
	l.refreshOK.Inc()
	l.control.Store(c)
	return nil
}

// maxRules caps the rules one request may match: the script's argument list
// grows with it.
const maxRules = 64

// Check decides req. It never returns an error for a storage failure: the
// matching rules' failure modes decide, and Decision.Err says why. It returns
// ErrBadRequest for a request it cannot decide.
func (l *Limiter) Check(ctx context.Context, req *Request) (Decision, error) {
	start := time.Now()
	static, ctl := l.static.Load(), l.control.Load()
	var buf [16]*rules.Rule
	matched := static.Match(&req.Descriptors, buf[:0])
	for _, r := range ctl.Rules {
		if r.Matches(&req.Descriptors) {
			matched = append(matched, r)
		}
	}
	if len(matched) > maxRules {
		return Decision{}, fmt.Errorf("%w: %d rules match, more than %d", ErrBadRequest, len(matched), maxRules)
	}
	cost := int64(req.Cost)
	if cost == 0 {
		cost = 1
	}
	d := Decision{Outcome: Allowed, Remaining: -1, Now: req.Now}
	if len(matched) > 0 {
		d.Matched = make([]string, len(matched))
		for i, r := range matched {
			d.Matched[i] = r.ID
		}
		l.decide(ctx, req, cost, matched, ctl, &d)
	}
	l.decisions[d.Outcome].Inc()
	if l.opts.Sink != nil {
		rec := Record{
			Time: d.Now, Region: l.opts.Region, Instance: l.opts.Instance, RequestID: req.RequestID,
			Domain: req.Domain, Descriptors: req.Descriptors, UserAgent: req.UserAgent, Matched: d.Matched,
			Outcome: d.Outcome, Cost: uint32(cost), Remaining: d.Remaining, Latency: time.Since(start), Status: req.Status,
		}
		if rec.Time.IsZero() {
			rec.Time = start
		}
		if d.Rule != nil {
			rec.DenyingRule = d.Rule.ID
		}
		l.opts.Sink.Log(rec)
	}
	return d, nil
}

func (l *Limiter) decide(ctx context.Context, req *Request, cost int64, matched []*rules.Rule, ctl *rules.Control, d *Decision) {
	n := len(matched)
	keys := make([]string, n)
	args := make([]any, 0, 2+5*n)
	var nowMS int64
	if !req.Now.IsZero() {
		nowMS = req.Now.UnixMilli()
	}
	args = append(args, nowMS, n)
	limits := make([]int64, n)
	for i, r := range matched {
		tag := rules.EntityTag(r, &req.Descriptors)
		keys[i] = "sl:{" + tag + "}:" + r.ID
		limit, burst := r.Limit, r.Burst
		if r.Global {
			f, fresh := l.share(r, tag, ctl, req.Now)
			limit, burst = scale(limit, f), scale(burst, f)
			d.Shared = d.Shared || fresh
		}
		limits[i] = burst
		shadow := 0
		if r.Mode == rules.Shadow {
			shadow = 1
		}
		args = append(args, limit, r.Period.Milliseconds(), burst, cost, shadow)
	}
	res, err := l.script.Run(ctx, l.rdb, keys, args...).Int64Slice()
	if err == nil && len(res) != 5+n {
		err = fmt.Errorf("enforcer: script returned %d values, want %d", len(res), 5+n)
	}
	if err != nil {
		l.redisErrs.Inc()
		// One log line per 10 s at most: the counter has the rate.
		if now, last := time.Now().UnixNano(), l.lastLog.Load(); now-last > int64(10*time.Second) && l.lastLog.CompareAndSwap(last, now) {
			l.opts.Logger.Warn("rate limit script failed; using failure modes", "err", err)
		}
		d.Err = err
		d.Outcome = DegradedOpen
		for _, r := range matched {
			if r.FailureMode == rules.FailClosed {
				d.Outcome, d.Reason, d.Rule = DegradedClosed, ReasonLimiterUnavailable, r
				d.RetryAfter = time.Second
				break
			}
		}
		if d.Now.IsZero() {
			d.Now = time.Now()
		}
		return
	}
	d.Now = time.UnixMilli(res[4])
	rem := res[5:]
	if res[0] == 0 {
		i := res[1] - 1
		d.Outcome, d.Rule, d.Remaining, d.Limit = Denied, matched[i], rem[i], limits[i]
		if res[2] < 0 {
			d.Reason = ReasonCostExceedsCapacity
		} else {
			d.Reason = ReasonOverLimit
			d.Wait = time.Duration(res[2]) * time.Millisecond
			d.RetryAfter = time.Duration(max(1, (res[2]+999)/1000)) * time.Second
		}
		return
	}
	if res[3] > 0 {
		d.Outcome, d.Rule = ShadowDenied, matched[res[3]-1]
	}
	d.Remaining = math.MaxInt64
	for i, r := range matched {
		if r.Mode == rules.Enforce && rem[i] < d.Remaining {
			d.Remaining, d.Limit = rem[i], limits[i]
		}
	}
	if d.Remaining == math.MaxInt64 { // only shadow rules matched
		d.Remaining, d.Limit = rem[0], limits[0]
	}
}

// share returns this region's fraction of global rule r for the entity tag:
// the entity's own share, else the rule's default share, else 1/Regions (the
// static split, fresh = false). A share older than ShareTTL at now is ignored.
func (l *Limiter) share(r *rules.Rule, tag string, ctl *rules.Control, now time.Time) (f float64, fresh bool) {
	if now.IsZero() {
		now = time.Now()
	}
	if s, ok := ctl.Shares[r.ID+"|"+tag]; ok && now.Sub(s.ComputedAt) <= l.opts.ShareTTL {
		return s.Fraction, true
	}
	if s, ok := ctl.Shares[r.ID+"|"]; ok && now.Sub(s.ComputedAt) <= l.opts.ShareTTL {
		return s.Fraction, true
	}
	return 1 / float64(l.opts.Regions), false
}

// scale returns x*f rounded, at least 1.
func scale(x int64, f float64) int64 {
	return max(1, int64(math.Round(float64(x)*f)))
}

// FormatRetryAfter writes a Retry-After value in whole seconds.
func FormatRetryAfter(d time.Duration) string { return strconv.FormatInt(int64(d/time.Second), 10) }
