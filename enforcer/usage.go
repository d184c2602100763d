package enforcer

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

//go:embed usage.lua
var usageLua string

// usageScript is usage.lua, run with EVALSHA_RO (EVAL_RO when Redis has not
// cached it): Redis refuses any write from it.
var usageScript = redis.NewScript(usageLua)

// Usage is what the rules that match one set of descriptors hold now, read
// without charging anything (Limiter.Usage).
type Usage struct {
	// Now is the time the state was read at: the request's, else the
	// enforcer's clock (Redis TIME decided the token buckets, sliding
	// windows and leases, as in Decide).
	Now time.Time
	// Descriptors are the descriptors as they were matched: with the API
	// key's account, organisation and tier from the key store
	// (Options.Keys) when the caller gave none.
	Descriptors rules.Descriptors
	// Rules are the matching rules, static first then dynamic, in the
	// order Decide checks them; rules another matching rule replaces are
	// left out, as Decide leaves them out.
	Rules []RuleUsage
}

// RuleUsage is one rule's state for the entity a Usage read.
type RuleUsage struct {
	Rule *rules.Rule
	// Dynamic is true for a dynamic rule (the detector's or an operator's,
	// from Redis), Shadow for a rule in shadow mode (it never denies).
	Dynamic, Shadow bool
	// Limit is the rule's capacity in this region after any share or hot-key
	// split: burst for a token bucket, else the limit; Status.Limit's value.
	Limit int64
	// Remaining is the whole units a request could take now; -1 when Redis
	// could not be read (Err says why).
	Remaining int64
	// Reset is the time until the rule is back to its full capacity (token
	// bucket, sliding window), its window ends (fixed window, g_counter),
	// or a slot frees (concurrency; 0 while one is free).
	Reset time.Duration
	// Window is the policy's window, as Status.Window.
	Window time.Duration
	// Share is this region's fraction of a global rule's limit (1 for
	// every other rule); ShareFresh says it came from the aggregator, not
	// the static split 1/Regions.
	Share      float64
	ShareFresh bool
	// Home is the region whose Redis counts a pinned rule for this entity
	// ("" for this region, and for every other rule).
	Home string
	// Split is how many sub-keys a hot key is split into (0: none); Limit
	// and Remaining are then this instance's sub-key's.
	Split int
	// Err is why Remaining is unknown.
	Err error
}

// Usage reads, for descriptors d, the state of every rule a request with
// them would be checked against, as Decide would see it for a request of
// cost 0 — without charging, refilling, or taking a concurrency slot: the
// state is read by a script run with EVALSHA_RO, which Redis refuses to let
// write. No decision record is logged and no decision metric counted. A
// zero now uses Redis TIME (fixed windows: the enforcer's clock), as a
// Request without Now does.
//
// It costs one Redis round trip (one pipeline; on a Cluster one per node,
// and one per home region of a pinned rule), however many rules match, so
// that its time does not depend on them; it allocates freely (a customer's
// usage page, not the request path). A rule whose Redis cannot be
// read (an error, the circuit breaker open) has Remaining -1 and Err set;
// Usage itself returns an error only for descriptors Decide would refuse
// (ErrBadRequest: a client_ip that looks like an address but is none, more
// than MaxRules rules).
//
// What a token bucket's hot key leases locally (Options.HotKeys.LeaseBlock) was
// taken from Redis: Remaining does not count it.
func (l *Limiter) Usage(ctx context.Context, d rules.Descriptors, now time.Time) (*Usage, error) {
	st := l.state.Load()
	if err := l.normalize(&d, st.static); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	if l.opts.Keys != nil && d[rules.KeyAPIKey] != "" {
		l.identify(ctx, &d)
	}
	u := &Usage{Now: now, Descriptors: d}
	if u.Now.IsZero() {
		u.Now = l.opts.Clock()
	}
	wall := u.Now // fixed windows are chosen on it; u.Now may become Redis's time
	clock := func() time.Time { return wall }
	var matched []*rules.Rule
	if st.static != nil {
		matched = st.static.Match(&d, matched)
	}
	nStatic := len(matched)
	if st.dyn != nil {
		matched = st.matchDynamic(&d, clock, matched)
	}
	if len(matched) > MaxRules {
		return nil, fmt.Errorf("%w: %d rules match, more than %d", ErrBadRequest, len(matched), MaxRules)
	}
	c := new(call) // for share and hotKey's scratch
	var nowMs int64
	if !now.IsZero() {
		nowMs = now.UnixMilli()
	}
	breaker := l.BreakerOpen()
	var reads []usageRead
	for i, r := range matched {
		if rules.IsReplaced(matched, i) {
			continue
		}
		ru := RuleUsage{Rule: r, Dynamic: i >= nStatic, Shadow: r.Mode == rules.Shadow || l.opts.Shadow, Share: 1}
		key := append([]byte(store.BucketKeyPrefix), nil...)
		tagAt := len(key)
		key = rules.AppendEntityTag(key, r, &d)
		tag := key[tagAt:]
		key = append(key, "}:"...)
		key = append(key, r.ID...)
		key = append(key, ':', '0'+byte(r.Algorithm))
		limit, burst := r.Limit, r.Burst
		var rdb redis.UniversalClient = l.rdb
		switch {
		case r.Pinned:
			if h := l.homes.of(r, tag); h >= 0 {
				ru.Home, rdb = l.homes.remote[h].name, l.homes.remote[h].rdb
			}
		case r.GCounter:
		case r.Global:
			f, fresh := l.share(c, r, tag, st.ctl, now)
			ru.Share, ru.ShareFresh = f, fresh
			limit, burst = scale(limit, f), scale(burst, f)
		}
		if len(st.ctl.Hot) > 0 && !r.Pinned && !r.GCounter && r.Algorithm != rules.Concurrency {
			if hk, ok := l.hotKey(c, r, tag, st.ctl, now); ok && hk.Split > 1 {
				key = append(key, ":s"...)
				key = strconv.AppendInt(key, int64(l.instanceIdx%hk.Split), 10)
				limit, burst = scale(limit, 1/float64(hk.Split)), scale(burst, 1/float64(hk.Split))
				ru.Split = hk.Split
			}
		}
		period := r.Period.Milliseconds()
		alg := int64(r.Algorithm)
		var left int64
		switch r.Algorithm {
		case rules.TokenBucket:
			ru.Window = msDuration((burst*period + limit - 1) / max(limit, 1))
		case rules.SlidingWindow:
			ru.Window = msDuration(period)
		case rules.FixedWindow:
			start, end := r.Window(wall)
			key = append(key, ':')
			key = strconv.AppendInt(key, start.UnixMilli(), 10)
			left = max(1, end.UnixMilli()-wall.UnixMilli())
			period = end.UnixMilli() - start.UnixMilli()
			ru.Window = msDuration(period)
			if r.GCounter {
				key = append(key, ":g"...)
				alg = algGCounter
			}
		}
		ru.Limit = burst
		switch {
		case r.Blocks(): // limit 0: denied without Redis
			ru.Limit, ru.Remaining = 0, 0
		case breaker && ru.Home == "":
			ru.Remaining, ru.Err = -1, ErrBreakerOpen
		default:
			reads = append(reads, usageRead{rule: len(u.Rules), rdb: rdb, key: string(key), args: []any{nowMs, alg, limit, period, burst, left}})
		}
		u.Rules = append(u.Rules, ru)
	}
	l.readUsage(ctx, reads, u, now.IsZero())
	return u, nil
}

// usageRead is one rule's read: usage.lua's key and arguments.
type usageRead struct {
	rule int // index in Usage.Rules
	rdb  redis.UniversalClient
	key  string
	args []any
	cmd  *redis.Cmd
}

// readUsage runs the reads, one pipeline per Redis, and fills u's rules.
func (l *Limiter) readUsage(ctx context.Context, reads []usageRead, u *Usage, redisTime bool) {
	for len(reads) > 0 {
		rdb := reads[0].rdb
		var mine, rest []usageRead
		for _, rd := range reads {
			if rd.rdb == rdb {
				mine = append(mine, rd)
			} else {
				rest = append(rest, rd)
			}
		}
		reads = rest
		src := false
		for attempt := 0; attempt < 3 && len(mine) > 0; attempt++ {
			l.pipeUsage(ctx, rdb, mine, src)
			var again []usageRead
			needTime := false
			for _, rd := range mine {
				if err := rd.cmd.Err(); err != nil && attempt < 2 {
					switch {
					case isNoScript(err): // not cached: send the source
						src = true
						again = append(again, rd)
						continue
					case redisTime && strings.Contains(err.Error(), "Write commands are not allowed"):
						// The in-process Redis (miniredis) counts TIME as a
						// write in a read-only script: its time, read first.
						needTime = true
						again = append(again, rd)
						continue
					}
				}
				parseUsage(rd, u, redisTime)
			}
			if needTime {
				if t, err := rdb.Time(ctx).Result(); err == nil {
					for _, rd := range again {
						rd.args[0] = t.UnixMilli()
					}
				}
			}
			mine = again
		}
	}
}

// pipeUsage sends reads to rdb in one pipeline: EVALSHA_RO, or with src
// EVAL_RO (the script not cached: a restart, SCRIPT FLUSH).
func (l *Limiter) pipeUsage(ctx context.Context, rdb redis.UniversalClient, reads []usageRead, src bool) {
	pipe := rdb.Pipeline()
	for i := range reads {
		rd := &reads[i]
		if src {
			rd.cmd = usageScript.EvalRO(ctx, pipe, []string{rd.key}, rd.args...)
		} else {
			rd.cmd = usageScript.EvalShaRO(ctx, pipe, []string{rd.key}, rd.args...)
		}
	}
	_, _ = pipe.Exec(ctx) // errors are per command
	l.roundTrips.Add(1)
}

// parseUsage reads usage.lua's reply "rem reset now" into u.
func parseUsage(rd usageRead, u *Usage, redisTime bool) {
	ru := &u.Rules[rd.rule]
	text, err := rd.cmd.Text()
	if err == nil {
		var p intParser
		p.s = text
		rem, reset, at := p.next(), p.next(), p.next()
		if p.err || p.s != "" {
			err = fmt.Errorf("enforcer: malformed usage reply %q", text)
		} else {
			ru.Remaining, ru.Reset = rem, msDuration(reset)
			if redisTime && at > 0 {
				u.Now = time.UnixMilli(at)
			}
			return
		}
	}
	ru.Remaining, ru.Err = -1, err
}
