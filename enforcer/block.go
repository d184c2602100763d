package enforcer

import (
	"time"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/rules"
)

// replaced drops the matched rules that another matched rule replaces (see
// rules.Rule.Replaces), across all parts of the request, as
// envoyproxy/ratelimit does.
func (c *call) replaced(matched []*rules.Rule) []*rules.Rule {
	if !rules.AnyReplaces(matched) {
		return matched
	}
	for i := range matched {
		c.rc[i].drop = rules.IsReplaced(matched, i)
	}
	return c.compact(matched)
}

// compact removes the matched rules marked to drop, keeping each rule's
// ruleCall beside it.
func (c *call) compact(matched []*rules.Rule) []*rules.Rule {
	n := 0
	for i, r := range matched {
		if c.rc[i].drop {
			continue
		}
		if n != i {
			matched[n], c.rc[n] = r, c.rc[i]
		}
		n++
	}
	return matched[:n]
}

// blocks decides the blocking rules (limit 0) without Redis: an enforced
// one denies the request at once (and nothing else is counted); shadow ones
// are set aside for shadowBlocks. It returns the rules left to decide.
func (l *Limiter) blocks(c *call, matched []*rules.Rule, clock func() time.Time, d *Decision) []*rules.Rule {
	c.nblk = 0
	any := false
	for _, r := range matched {
		if r.Blocks() {
			any = true
			break
		}
	}
	if !any {
		return matched
	}
	for i, r := range matched {
		if !r.Blocks() {
			c.rc[i].drop = false
			continue
		}
		reset, window := blockWindow(r, clock())
		if r.Mode != rules.Shadow && !l.opts.Shadow {
			d.Now = clock()
			d.Outcome, d.Reason, d.Rule, d.Path = decision.Denied, decision.ReasonBlocked, r, decision.PathBlocked
			d.Statuses = append(d.Statuses[:0], Status{Rule: r, Reset: reset, Window: window, Part: int(c.rc[i].part), Denied: true})
			d.Limit, d.Remaining, d.Reset, d.bind = 0, 0, reset, 1
			return matched[:0]
		}
		c.rc[i].drop = true
		c.blk[c.nblk] = Status{Rule: r, Reset: reset, Window: window, Part: int(c.rc[i].part), Denied: true, Shadow: true}
		c.nblk++
	}
	return c.compact(matched)
}

// shadowBlocks records the shadow blocking rules set aside by blocks, and
// the shadow rules noShares set aside (a share of 0): each would have
// denied.
func (l *Limiter) shadowBlocks(c *call, d *Decision) {
	for _, st := range c.blk[:c.nblk] {
		d.Statuses = append(d.Statuses, st)
		if d.Shadow == nil {
			d.Shadow = st.Rule
		}
		if d.Outcome == decision.Allowed {
			d.Outcome, d.Rule = decision.ShadowDenied, st.Rule
			if d.Path == decision.PathNone {
				d.Path = decision.PathBlocked
				if st.Rule.Limit > 0 { // set aside by noShares: a share of 0, not a block
					d.Path = decision.PathNoShare
				}
			}
		}
	}
	if d.Now.IsZero() && c.nblk > 0 {
		d.Now = l.opts.Clock()
	}
}

// blockWindow is a blocking rule's time until its window ends (the reset a
// client is told; waiting does not help) and its window.
func blockWindow(r *rules.Rule, now time.Time) (reset, window time.Duration) {
	if r.Algorithm == rules.FixedWindow {
		start, end := r.Window(now)
		// Whole milliseconds, rounded up, as every other reset.
		return (end.Sub(now) + time.Millisecond - 1).Truncate(time.Millisecond), end.Sub(start)
	}
	return r.Period, r.Period
}
