package enforcer

import (
	"context"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/rules"
)

// homeRegions are the regions of pinned rules (rules.Rule.Pinned): their
// names (rules.Homes, which hashes an entity to its home), this region's
// index in them, and a client, breaker and batchers per other region (nil at
// this region's index). The zero value: no home regions, every pinned rule
// counted here.
type homeRegions struct {
	set    *rules.Homes
	own    int
	remote []*home
}

// home is another region's Redis, where the pinned rules of the entities
// whose home it is are decided.
type home struct {
	name    string
	rdb     redis.UniversalClient
	cluster *redis.ClusterClient // when the region's Redis is a Cluster
	breaker *breaker
	batch   *batcher     // decide calls to a single node (or Sentinel group)
	nodes   nodeBatchers // to a Cluster's masters
}

// setHomes builds the home regions from Options.Homes: the regions named
// there and this one, a client and a circuit breaker per other region.
func (l *Limiter) setHomes() error {
	if len(l.opts.Homes) == 0 {
		return nil
	}
	names := []string{l.opts.Region}
	for name, rdb := range l.opts.Homes {
		if name == l.opts.Region {
			continue
		}
		if rdb == nil {
			return fmt.Errorf("enforcer: Homes: region %q has no client", name)
		}
		switch rdb.(type) {
		case *redis.Client, *redis.ClusterClient:
		default:
			return fmt.Errorf("enforcer: Homes: region %q: a home region's Redis must be a single node, Sentinel or a Cluster (redis.NewClient, NewFailoverClient, NewClusterClient), not %T", name, rdb)
		}
		ho := l.opts
		ho.Budget = l.opts.HomeBudget / 2 // its wait is HomeBudget (exec)
		checkClient(rdb, ho)
		names = append(names, name)
	}
	h, err := rules.NewHomes(names)
	if err != nil {
		return fmt.Errorf("enforcer: Homes: %w", err)
	}
	switch n := len(h.Regions()); {
	case l.opts.Regions == 1:
		l.opts.Regions = n
	case l.opts.Regions != n:
		return fmt.Errorf("enforcer: Regions is %d but Homes names %d regions (this one included): leave Regions 0 or make them agree", l.opts.Regions, n)
	}
	l.homes.set, l.homes.own = h, h.Index(l.opts.Region)
	l.homes.remote = make([]*home, len(h.Regions()))
	for i, name := range h.Regions() {
		if i == l.homes.own {
			continue
		}
		h := &home{name: name, rdb: l.opts.Homes[name], breaker: newBreaker("home "+name, &l.opts, &l.trips)}
		h.cluster, _ = h.rdb.(*redis.ClusterClient)
		h.nodes.l = l
		if h.cluster == nil {
			h.batch = newBatcher(l, h.rdb, false, h.breaker)
		}
		h.nodes.breaker = func(string) *breaker { return h.breaker }
		l.homes.remote[i] = h
	}
	return nil
}

// warnPinned warns when a rule set has pinned rules but no home regions
// while several regions share global rules: each region then counts the
// whole limit for itself.
func (hr *homeRegions) warnPinned(s *rules.Set, opts *Options) {
	if s == nil || hr.set != nil || opts.Regions <= 1 {
		return
	}
	for _, r := range s.Rules {
		if r.Pinned {
			opts.Logger.Warn("a pinned rule without Options.Homes is counted in this region alone, with its whole limit", "rule", r.ID, "regions", opts.Regions)
			return
		}
	}
}

// of returns the index of the region that holds rule r's counter for
// the entity tag: -1 for this region (the rule is not pinned, there are no
// home regions, or this region is the entity's home).
func (hr *homeRegions) of(r *rules.Rule, tag []byte) int8 {
	if !r.Pinned || hr.set == nil {
		return -1
	}
	if h := hr.set.Of(tag); h != hr.own {
		return int8(h)
	}
	return -1
}

// exec runs the groups' script calls: this region's groups (those first in
// c.groups; unless local is false: their breaker is open) within ctx,
// through l.run, and each other region's
// group on that region's Redis within HomeBudget of base, in parallel with
// them. With only this region's groups it allocates nothing of its own.
func (l *Limiter) exec(ctx, base context.Context, c *call, s script, parse func(c *call, g *group, text string) error, local bool) {
	split := len(c.groups)
	for gi := range c.groups {
		if c.groups[gi].remote != nil {
			split = gi
			break
		}
	}
	if split == len(c.groups) {
		if local {
			l.run(ctx, c, s, parse)
		}
		return
	}
	all := c.groups
	var wg sync.WaitGroup
	hctx, cancel := context.WithTimeout(base, l.opts.HomeBudget)
	defer cancel()
	if dl, ok := hctx.Deadline(); ok {
		c.homeDeadline = dl.UnixMicro()
	}
	for gi := split; gi < len(all); gi++ {
		wg.Add(1)
		go func(g *group) {
			defer wg.Done()
			l.runHome(hctx, c, g, s, parse)
		}(&all[gi])
	}
	if split > 0 && local {
		c.groups = all[:split]
		l.run(ctx, c, s, parse)
		c.groups = all
	}
	wg.Wait()
}

// runHome sends group g's script call to its home region's Redis, through
// that region's circuit breaker. On a Cluster (one group per slot) it goes
// to the slot's master itself, as runCluster sends this region's, so that
// a timed-out call is never retried; a call refused without running
// (MOVED, ASK) is sent once more through the ClusterClient, which follows
// the redirection, and NOSCRIPT once more with EVAL.
func (l *Limiter) runHome(ctx context.Context, c *call, g *group, s script, parse func(c *call, g *group, text string) error) {
	h := g.remote
	if l.isDecide(s) { // the home's batchers ask its breaker
		if g.err = h.breaker.ramped(); g.err == nil {
			l.decideHome(ctx, c, g, h)
		}
		return
	}
	done, err := h.breaker.Allow()
	if err != nil {
		g.err = err
		return
	}
	args := c.args[g.argFrom:g.argTo]
	var node interface {
		Do(ctx context.Context, args ...any) *redis.Cmd
	} = h.rdb
	if h.cluster != nil {
		n, err := h.cluster.MasterForKey(ctx, args[3].(*byteArg).String())
		if err != nil {
			g.err = err
			done(err)
			return
		}
		node = n
	}
	cmd := node.Do(ctx, args...)
	l.roundTrips.Add(1)
	switch err := cmd.Err(); {
	case isNoScript(err):
		args[0], args[1] = "eval", s.src
		cmd = node.Do(ctx, args...)
		l.roundTrips.Add(1)
	case h.cluster != nil && isMoved(err):
		args[0], args[1] = "eval", s.src // the new master may not have it cached
		cmd = h.cluster.Do(ctx, args...)
		l.roundTrips.Add(1)
	}
	g.err = l.result(cmd, c, g, parse)
	if h.cluster == nil && isMoved(g.err) {
		l.misrouted(g.err)
	}
	if h.cluster != nil && staleRoute(g.err) {
		h.cluster.ReloadState(ctx)
	}
	done(g.err)
}

// decideHome decides group g in its home region's Redis, in a batch with
// other decisions' groups for that node; on a Cluster a group refused by a
// moved slot is sent once more through the ClusterClient, with EVAL.
func (l *Limiter) decideHome(ctx context.Context, c *call, g *group, h *home) {
	gi := g.index
	t := c.ticket(gi)
	t.groups = append(t.groups, g)
	t.until, _ = ctx.Deadline()
	if h.cluster == nil {
		h.batch.decide(ctx, t)
		if isMoved(g.err) {
			l.misrouted(g.err)
		}
		return
	}
	node, err := h.cluster.MasterForKey(ctx, string(c.rc[c.order[g.from]].key.b))
	if err != nil {
		g.err = err
		return
	}
	h.nodes.get(node).decide(ctx, t)
	if isMoved(g.err) {
		sc := c.single(gi)
		sc.add(g)
		sc.build(l)
		sc.args[0], sc.args[1] = "eval", l.decide.src // the new master may not have it cached
		cmd := redis.NewIntSliceCmd(ctx, sc.args...)
		_ = h.cluster.Process(ctx, cmd)
		l.roundTrips.Add(1)
		g.err = nil
		sc.result(cmd)
	}
	if staleRoute(g.err) {
		h.cluster.ReloadState(ctx)
	}
}
