package enforcer

// Concurrency slots (rules.Concurrency): a lease per allowed request, in a
// sorted set scored by its expiry, taken by decide.lua with the request's
// other rules and given back by Release when the request ends (or by its TTL
// when it never calls). These are the decision's slot bookkeeping around the
// script call.

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/sluice-rl/sluice/rules"
)

// keepLeases records the concurrency slots the allowed request took.
func (c *call) keepLeases(matched []*rules.Rule, d *Decision) {
	for gi := range c.groups {
		g := &c.groups[gi]
		if g.err != nil || !g.out.anyTook {
			continue
		}
		for _, i := range c.order[g.from:g.to] {
			if matched[i].Algorithm == rules.Concurrency && c.rc[i].res.took {
				d.Leases = append(d.Leases, Lease{Key: string(c.rc[i].key.b), ID: string(c.rc[i].leaseID.b), TTL: matched[i].Period})
			}
		}
	}
}

// dropSentLeases removes the concurrency leases that the calls which got no
// answer (a timeout, a broken connection) sent: such a script may have
// committed just before its deadline, its reply arriving after the caller
// gave up. One that runs later commits nothing (decide.lua's deadline), so a
// removal that Redis runs before the script leaves nothing either. Each
// removal has the budget, apart from the request's own deadline; a failed one
// is counted and its lease frees itself at its TTL.
func (l *Limiter) dropSentLeases(ctx context.Context, c *call, matched []*rules.Rule) {
	for gi := range c.groups {
		g := &c.groups[gi]
		if !mayHaveRun(g.err) {
			continue
		}
		for _, i := range c.order[g.from:g.to] {
			if matched[i].Algorithm != rules.Concurrency {
				continue
			}
			rdb := l.rdb
			if g.remote != nil {
				rdb = g.remote.rdb
			}
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.opts.Budget)
			err := rdb.ZRem(rctx, string(c.rc[i].key.b), string(c.rc[i].leaseID.b)).Err()
			cancel()
			l.roundTrips.Add(1)
			if err != nil {
				l.leaseDropBad.Inc()
				l.slotRetry.add(l, []Lease{{Key: string(c.rc[i].key.b), ID: string(c.rc[i].leaseID.b), TTL: matched[i].Period}}, time.Now())
			} else {
				l.leaseDropOK.Inc()
			}
		}
	}
}

// mayHaveRun reports whether a failed script call may have run in Redis: it
// got no answer (a timeout, a broken connection), as opposed to an error
// reply, a call never made (the breaker, a connection that could not be
// dialled, a decision still queued in the batcher), or a late script's
// refusal.
func mayHaveRun(err error) bool {
	var op *net.OpError
	return err != nil && !isReply(err) && !errors.Is(err, ErrBreakerOpen) && !errors.Is(err, ErrLate) &&
		!errors.Is(err, context.Canceled) && !errors.Is(err, errQueued) && // queued, never sent
		!(errors.As(err, &op) && op.Op == "dial") // a connection never made sent nothing
}
