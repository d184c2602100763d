package enforcer

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

//go:embed merge.lua
var mergeLua string

// algGCounter is decide.lua's and refund.lua's algorithm number for a
// G-Counter fixed window (rules.Rule.GCounter).
const algGCounter = 4

// gcSlack is how long a G-Counter window's hash outlives the window, as a
// fixed window's counter does: a late write or merge finds it still there.
const gcSlack = 60 * time.Second

// QuotaKey is the Redis key that holds q's window's per-region counts.
func QuotaKey(q *decision.QuotaCount) string {
	return store.BucketKeyPrefix + q.Tag + "}:" + q.Rule + ":" + strconv.Itoa(int(rules.FixedWindow)) + ":" +
		strconv.FormatInt(q.Window.UnixMilli(), 10) + ":g"
}

// gcDirty is the set of G-Counter windows this enforcer has counted in since
// the last QuotaCounts: key → window end (ms).
type gcDirty struct {
	mu   sync.Mutex
	keys map[string]int64
}

// MaxQuotaWindows bounds the G-Counter windows a Limiter remembers between
// two QuotaCounts calls: more are left out and counted
// (sluice_enforcer_quota_windows_dropped_total).
const MaxQuotaWindows = 1 << 20

// mark records the G-Counter windows the decision counted in (in the groups
// that answered and were not refunded). A window already marked costs a map
// lookup; a new one its key's string.
func (g *gcDirty) mark(c *call, matched []*rules.Rule, dropped *atomic.Uint64) {
	for gi := range c.groups {
		grp := &c.groups[gi]
		if grp.err != nil {
			continue
		}
		for _, i := range c.order[grp.from:grp.to] {
			if !matched[i].GCounter || !c.rc[i].res.took {
				continue
			}
			g.mu.Lock()
			if _, ok := g.keys[string(c.rc[i].key.b)]; !ok {
				switch {
				case len(g.keys) >= MaxQuotaWindows:
					dropped.Add(1)
				case g.keys == nil:
					g.keys = map[string]int64{}
					fallthrough
				default:
					g.keys[string(c.rc[i].key.b)] = c.rc[i].wend
				}
			}
			g.mu.Unlock()
		}
	}
}

func (g *gcDirty) take() map[string]int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := g.keys
	g.keys = nil
	return k
}

// parseQuotaKey reads a G-Counter key, "sl:{<tag>}:<rule>:2:<start ms>:g",
// back into a count's rule, tag and window.
func parseQuotaKey(key string, end int64) (decision.QuotaCount, bool) {
	var q decision.QuotaCount
	rest, ok := strings.CutPrefix(key, store.BucketKeyPrefix)
	if !ok || len(rest) < rules.EntityTagLen+2 {
		return q, false
	}
	q.Tag, rest = rest[:rules.EntityTagLen], rest[rules.EntityTagLen:]
	rest, ok = strings.CutPrefix(rest, "}:")
	if !ok {
		return q, false
	}
	rest, ok = strings.CutSuffix(rest, ":g")
	if !ok {
		return q, false
	}
	i := strings.LastIndexByte(rest, ':')
	if i < 0 {
		return q, false
	}
	start, err := strconv.ParseInt(rest[i+1:], 10, 64)
	if err != nil {
		return q, false
	}
	rule, ok := strings.CutSuffix(rest[:i], ":2")
	if !ok {
		return q, false
	}
	q.Rule, q.Window, q.End = rule, time.UnixMilli(start), time.UnixMilli(end)
	return q, true
}

// QuotaCounts returns this region's counts of the G-Counter windows this
// enforcer has counted in since the last call, read from this region's
// Redis (so that they include the other enforcers' of the region), for the
// other regions to merge (MergeQuotaCounts). Call it every exchange
// interval (gcounter.QuotaPublisher does). On error the windows are kept
// for the next call. Safe for concurrent use.
func (l *Limiter) QuotaCounts(ctx context.Context) ([]decision.QuotaCount, error) {
	keys := l.gc.take()
	if len(keys) == 0 {
		return nil, nil
	}
	out := make([]decision.QuotaCount, 0, len(keys))
	cmds := make([]*redis.StringCmd, 0, len(keys))
	pipe := l.rdb.Pipeline()
	for k, end := range keys {
		q, ok := parseQuotaKey(k, end)
		if !ok {
			continue // not one of ours: cannot happen
		}
		q.Region = l.opts.Region
		out = append(out, q)
		cmds = append(cmds, pipe.HGet(ctx, k, l.opts.Region))
	}
	_, err := pipe.Exec(ctx)
	l.roundTrips.Add(1)
	if err != nil && err != redis.Nil {
		l.gc.mu.Lock()
		if l.gc.keys == nil {
			l.gc.keys = map[string]int64{}
		}
		for k, end := range keys {
			if _, ok := l.gc.keys[k]; !ok {
				l.gc.keys[k] = end
			}
		}
		l.gc.mu.Unlock()
		return nil, fmt.Errorf("enforcer: reading G-Counter counts: %w", err)
	}
	n := 0
	for i := range out {
		c, err := cmds[i].Int64()
		if err != nil { // the window expired, or a refund's field: nothing to send
			continue
		}
		out[i].Count = c
		out[n] = out[i]
		n++
	}
	return out[:n], nil
}

var mergeScript = redis.NewScript(mergeLua)

// MergeQuotaCounts merges counts into one region's Redis (rdb) by
// element-wise maximum: each count raises its region's field of its
// window's hash to Count if that is higher, and never lowers it, so
// applying counts again, in any order, changes nothing (Shapiro et al.
// 2011, the G-Counter's merge). Counts of region own are skipped (its
// field is written by its enforcers); own "" merges every region's,
// which restores a region's own counts after its Redis lost them (a refund
// merged over is then counted, as the other regions count it). Counts of
// windows that ended more than a minute before now are skipped, as are
// invalid ones (see QuotaCount.Validate; the first error is returned after
// the rest are merged). It returns how many fields were raised.
//
// Counts are merged one script call each, in one pipeline, which on a
// Cluster go-redis routes by key.
func MergeQuotaCounts(ctx context.Context, rdb redis.UniversalClient, own string, counts []decision.QuotaCount, now time.Time) (int, error) {
	var bad error
	pipe := rdb.Pipeline()
	var cmds []*redis.Cmd
	for i := range counts {
		q := &counts[i]
		if err := q.Validate(); err != nil {
			if bad == nil {
				bad = err
			}
			continue
		}
		ttl := q.End.Add(gcSlack).Sub(now).Milliseconds()
		if q.Region == own || ttl <= 0 {
			continue
		}
		// EVAL, not EVALSHA: a pipeline cannot fall back on NOSCRIPT, and
		// merges are a batch a second, off the request path.
		cmds = append(cmds, mergeScript.Eval(ctx, pipe, []string{QuotaKey(q)}, 1, q.Region, q.Count, ttl))
	}
	if len(cmds) == 0 {
		return 0, bad
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("enforcer: merging G-Counter counts: %w", err)
	}
	raised := 0
	for _, cmd := range cmds {
		s, err := cmd.Text()
		if err != nil {
			return raised, fmt.Errorf("enforcer: merging G-Counter counts: %w", err)
		}
		n, _ := strconv.Atoi(s)
		raised += n
	}
	return raised, bad
}
