package detector

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cespare/xxhash/v2"

	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/detector/enrich"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/sketch"
)

// ClusterOptions configure the Cluster signals. Zero fields take the
// defaults named on each.
type ClusterOptions struct {
	// Window is the event-time window the signals count in. Default 10 s.
	Window time.Duration
	// MinRequests is the least a scope must send in a window to be judged.
	// Default 100.
	MinRequests uint64
	// MinShare is the least share of its route's requests (of all
	// requests, for a JA4 anywhere) an anomalous scope must have: a flash
	// crowd lifts many browsers' shares a little, an attack one scope's a
	// lot. Default 0.25.
	MinShare float64
	// RouteLift is how many times its share of the other routes' requests
	// a JA4's share of a route must be for the JA4 on that route to be
	// judged: a popular browser on a viral page has about the share there
	// that it has everywhere, which is not unusual; bots of one JA4 on one
	// route have far more. Default 2.
	RouteLift float64
	// MinIPs is the least distinct client IPs a scope must have to be a
	// cluster: fewer is one client's business (the heavy-hitter signal's).
	// Default 50.
	MinIPs uint64
	// Trigger is the robust z-score (against the scope's median and median
	// absolute deviation over past windows) above which a window counts as
	// anomalous; Clear the one below which an active scope clears. Defaults
	// 8 and 3.
	Trigger, Clear float64
	// Persist is how many anomalous windows in a row make a rule
	// (hysteresis); an anomalous window with Persist times the floors
	// (MinRequests and MinIPs) holds the evidence of Persist windows and
	// makes a rule by itself, so that an attack that starts late in a
	// window is flagged at the end of the next one. Default 2.
	Persist int
	// Baseline is how many past windows a scope's baseline keeps, and
	// Warmup how many it needs; a scope not warm yet is judged against the
	// population of its kind. Defaults 60 and 6.
	Baseline, Warmup int
	// MaxScopes bounds the scopes with a baseline; past it the least recently
	// seen go, down to nine tenths of it. Default 10 000.
	MaxScopes int
	// LimitFactor sets a rule's limit: LimitFactor times the scope's
	// baseline requests per window, at least MinLimit. Defaults 2, 10.
	LimitFactor float64
	MinLimit    int64
	// TTL of an emitted rule; a scope is not emitted again while its rule
	// has more than half of it left (cool-down). Default 10 min.
	TTL time.Duration
	// Enforce emits rules in enforce mode; default shadow.
	Enforce bool
}

func (o *ClusterOptions) defaults() error {
	orDefault(&o.Window, 10*time.Second)
	orDefault(&o.MinRequests, 100)
	orDefault(&o.MinIPs, 50)
	orDefault(&o.MinShare, 0.25)
	orDefault(&o.RouteLift, 2)
	orDefault(&o.LimitFactor, 2)
	orDefault(&o.MaxScopes, 10_000)
	orDefault(&o.MinLimit, 10)
	orDefault(&o.TTL, 10*time.Minute)
	c := optCheck{signal: "clusters"}
	c.window(o.Window)
	c.ttl(o.TTL, o.Window)
	c.fraction("MinShare", o.MinShare)
	c.baseline(&o.Trigger, &o.Clear, &o.Persist, &o.Baseline, &o.Warmup)
	c.positive("LimitFactor", o.LimitFactor)
	c.positive("RouteLift", o.RouteLift)
	c.count("MaxScopes", o.MaxScopes, 1<<24)
	c.limit("MinLimit", o.MinLimit)
	return c.err()
}

// Scope kinds of the Cluster signals, the first byte of a scope's key.
const (
	scopeASNRoute = 'a' // one ASN on one route: ASN concentration
	scopeJA4Route = 'j' // one JA4 on one route: JA4 concentration, low and slow
	scopeJA4      = 'J' // one JA4 anywhere: JA4 clustering across IPs
)

// Cluster flags groups of clients that act together: one ASN or one JA4
// fingerprint sending far more of a route's requests, from far more
// addresses, than its baseline, including the low-and-slow case of many
// addresses each under any per-IP limit. Each flagged scope becomes one
// dynamic rule, shadow by default, limited to a multiple of the scope's
// baseline.
//
// Per window and partition it keeps a Space-Saving top-k of scopes (ASN on
// a route, JA4 on a route, JA4 anywhere: 512 counters) and of routes (64),
// and one sketch.Spread of the distinct client IPs of every scope. On the
// merge tier each heavy scope is judged by a robust z-score of its requests
// against the median and median absolute deviation of its past windows
// (sketch.MAD); a scope new since the warm-up, with no baseline of its own
// yet, is anomalous when it passes the gates (MinShare, MinIPs,
// MinRequests, RouteLift) at all. A rule needs Persist anomalous windows
// in a row (or one with Persist times the floors MinRequests and MinIPs),
// and the scope clears below Clear (hysteresis).
//
// Cluster is a stage.Stage and Checkpointer, not safe for concurrent
// use. Build it with NewCluster.
type Cluster struct {
	badJA4 atomic.Uint64
	o      ClusterOptions
	scopes map[string]*scopeState
	seen   uint64 // windows of event time passed, for the warm-up and least-recently-seen eviction
	// lastEnd is the end of the last window finished (not checkpointed:
	// after a restore the next window counts as one).
	lastEnd time.Time
	pop     [3]*sketch.MAD
}

type scopeState struct {
	// first is the window the scope was first seen in: one seen during
	// the stage's own warm-up is established traffic, judged only against
	// its own baseline; one that appears later is new, judged against its
	// kind's until its own is ready.
	first uint64
	base  *sketch.MAD
	// addrs is the baseline of the scope's distinct addresses per window:
	// a cluster's rise comes from many more addresses, not from one busy
	// address (a corporate proxy) among the scope's usual ones.
	addrs   *sketch.MAD
	streak  int
	expires time.Time // of its last rule
	last    uint64    // the window it was last seen in
}

// NewCluster returns the signals with o's zero fields defaulted, or an
// error wrapping ErrBadOptions.
func NewCluster(o ClusterOptions) (*Cluster, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	c := &Cluster{o: o, scopes: map[string]*scopeState{}}
	for i := range c.pop {
		c.pop[i] = sketch.NewMAD(o.Baseline*8, o.Warmup)
	}
	return c, nil
}

// Name is the stage's name in the pipeline.
func (c *Cluster) Name() string { return "clusters" }

// InvalidJA4 counts the records, over finished windows, whose JA4 was not
// a JA4 fingerprint (enrich.ValidJA4): they were treated as having none.
// Safe to call from any goroutine.
func (c *Cluster) InvalidJA4() uint64 { return c.badJA4.Load() }

// Window is the event-time window the signals count in.
func (c *Cluster) Window() time.Duration { return c.o.Window }

type clusterPartial struct {
	n      uint64
	badJA4 uint64 // records whose JA4 is not one (enrich.ValidJA4): treated as absent
	routes *sketch.TopK
	scopes *sketch.TopK
	ips    *sketch.Spread
	buf    []byte
}

func newSpread() *sketch.Spread {
	s, err := sketch.NewSpread(0.005, 0.01, 5)
	if err != nil {
		panic(err) // constants
	}
	return s
}

// NewPartial returns an empty window state.
func (c *Cluster) NewPartial() stage.Partial {
	return &clusterPartial{routes: sketch.NewTopK(64), scopes: sketch.NewTopK(512), ips: newSpread()}
}

// Observe counts one record against its scopes.
func (p *clusterPartial) Observe(d *decisionpb.Decision) {
	x := d.GetDescriptors()
	ip := x.GetClientIp()
	if ip == "" {
		return
	}
	route, ok := recordRoute(x)
	if !ok {
		return
	}
	p.n++
	p.routes.Add(route, 1)
	ipHash := sketch.Hash64(ip)
	if asn := x.GetAsn(); asn != 0 {
		p.scope(ipHash, scopeASNRoute, strconv.FormatUint(uint64(asn), 10), route)
	}
	if ja4 := x.GetJa4(); ja4 != "" && !enrich.ValidJA4(ja4) {
		p.badJA4++
	} else if ja4 != "" {
		p.scope(ipHash, scopeJA4Route, ja4, route)
		p.scope(ipHash, scopeJA4, ja4, "")
	}
}

// scope counts one request of the scope (kind, a, b) from the client whose
// IP hashes to ipHash. The key is built in a reused buffer; TopK copies it
// only when it takes over a counter.
func (p *clusterPartial) scope(ipHash uint64, kind byte, a, b string) {
	p.buf = append(append(append(append(p.buf[:0], kind, 0), a...), 0), b...)
	h := xxhash.Sum64(p.buf)
	p.scopes.AddHash(h, unsafe.String(unsafe.SliceData(p.buf), len(p.buf)), 1)
	p.ips.Add(h, ipHash)
}

// Merge folds in another partition's state of the same window.
func (p *clusterPartial) Merge(o stage.Partial) error {
	x, ok := o.(*clusterPartial)
	if !ok {
		return fmt.Errorf("detector: clusters cannot merge a %T", o)
	}
	p.n += x.n
	p.badJA4 += x.badJA4
	p.routes.Merge(x.routes)
	p.scopes.Merge(x.scopes)
	return p.ips.Merge(x.ips)
}

// MarshalBinary encodes the state: the count, then the two top-ks and the
// spread, each with its length.
func (p *clusterPartial) MarshalBinary() ([]byte, error) {
	b := binary.AppendUvarint(nil, p.n)
	b = binary.AppendUvarint(b, p.badJA4)
	for _, m := range []interface{ MarshalBinary() ([]byte, error) }{p.routes, p.scopes, p.ips} {
		x, err := m.MarshalBinary()
		if err != nil {
			return nil, err
		}
		b = stage.AppendBytes(b, x)
	}
	return b, nil
}

// DecodePartial decodes what a partial's MarshalBinary wrote.
func (c *Cluster) DecodePartial(b []byte) (stage.Partial, error) {
	r := stage.NewStateReader(b)
	p := &clusterPartial{routes: new(sketch.TopK), scopes: new(sketch.TopK), ips: new(sketch.Spread)}
	p.n = r.Uvarint()
	p.badJA4 = r.Uvarint()
	routes, scopes, ips := r.Bytes(), r.Bytes(), r.Bytes()
	if err := r.Done(); err != nil {
		return nil, fmt.Errorf("detector: cluster window state: %w", err)
	}
	for _, x := range []struct {
		what string
		u    interface{ UnmarshalBinary([]byte) error }
		b    []byte
	}{{"routes", p.routes, routes}, {"scopes", p.scopes, scopes}, {"spread", p.ips, ips}} {
		if err := x.u.UnmarshalBinary(x.b); err != nil {
			return nil, fmt.Errorf("detector: cluster window %s: %w", x.what, err)
		}
	}
	return p, nil
}

// scopeKind indexes the per-kind population baselines.
func scopeKind(k byte) int {
	switch k {
	case scopeASNRoute:
		return 0
	case scopeJA4Route:
		return 1
	}
	return 2
}

// Finish judges a window merged over every partition and returns the rules
// of the scopes that have been anomalous for Persist windows.
func (c *Cluster) Finish(w stage.Window, merged stage.Partial) stage.Output {
	p, ok := merged.(*clusterPartial)
	if !ok {
		return stage.Output{}
	}
	// seen counts windows of event time, empty ones included: on a sparse
	// site six windows with traffic can take an hour, and an attack ten
	// minutes in must still count as new, not as traffic of the warm-up.
	step := uint64(1)
	if !c.lastEnd.IsZero() && w.Start.After(c.lastEnd) {
		step += uint64(w.Start.Sub(c.lastEnd) / c.o.Window)
	}
	c.seen += step
	c.lastEnd = w.End
	c.badJA4.Add(p.badJA4)
	routeN := map[string]uint64{}
	for _, it := range p.routes.List() {
		routeN[it.Key] = it.Count - it.Err
	}
	// Each JA4's requests on every route, for the route lift.
	ja4N := map[string]uint64{}
	items := p.scopes.List()
	for _, it := range items {
		if it.Key[0] == scopeJA4 {
			ja4N[strings.TrimSuffix(it.Key[2:], "\x00")] = it.Count - it.Err
		}
	}
	var out stage.Output
	var popSeen [3][]float64
	for _, it := range items {
		key := it.Key
		// The scope's share of its route's requests (of all requests for
		// a JA4 anywhere): a flash crowd raises every scope's count, an
		// attack one scope's share.
		of := p.n
		if key[0] != scopeJA4 {
			_, route, _ := strings.Cut(key[2:], "\x00")
			if of = routeN[route]; of == 0 {
				continue // not a heavy route: no share to judge
			}
		}
		x := math.Min(1, float64(it.Count-it.Err)/float64(of))
		st := c.scopes[key]
		if st == nil {
			st = &scopeState{first: c.seen, base: sketch.NewMAD(c.o.Baseline, c.o.Warmup), addrs: sketch.NewMAD(c.o.Baseline, c.o.Warmup)}
			c.scopes[key] = st
		}
		st.last = c.seen
		kind := scopeKind(key[0])
		base := st.base
		if !base.Ready() && st.first > uint64(c.o.Warmup) {
			base = c.pop[kind]
		}
		// No more addresses than requests, whatever the estimate.
		ips := min(p.ips.Estimate(xxhash.Sum64String(key)), it.Count)
		// Every tracked scope teaches its baseline; only one with
		// MinRequests and MinIPs, and many more addresses than usual (not
		// one busy address among its usual ones), can be anomalous.
		more := !st.addrs.Ready() || float64(ips) >= 2*st.addrs.Median()
		gate := x >= c.o.MinShare && ips >= c.o.MinIPs && more && it.Count-it.Err >= c.o.MinRequests
		if n := it.Count - it.Err; key[0] == scopeJA4Route && p.n > of {
			// Its share of the other routes' requests.
			ja4, _, _ := strings.Cut(key[2:], "\x00")
			elsewhere := float64(ja4N[ja4]-min(ja4N[ja4], n)) / float64(p.n-of)
			gate = gate && x >= c.o.RouteLift*elsewhere
		}
		var anomalous bool
		if !st.base.Ready() && st.first > uint64(c.o.Warmup) {
			// A new scope (first seen after the warm-up, no baseline of
			// its own yet) that passes every gate has never been this
			// big: a share of MinShare from MinIPs addresses it never
			// had. It is anomalous by itself, not by a z-score against
			// the population of its kind, which the traffic before it
			// taught (credential stuffing was caught after a botnet and
			// missed after a flash crowd). Only its ordinary windows
			// teach its baseline, so an attack cannot make itself usual
			// within its own duration.
			anomalous = gate && c.seen > uint64(c.o.Warmup)
			switch {
			case anomalous:
				st.streak++
			default:
				st.streak = 0
				st.base.Update(x)
			}
		} else {
			anomalous = judge(st.base, base, x, c.seen > uint64(c.o.Warmup), gate, true, thresholds{c.o.Trigger, c.o.Clear}, &st.streak)
		}
		if !anomalous {
			st.addrs.Update(float64(ips))
			popSeen[kind] = append(popSeen[kind], x)
		}
		// A rule needs this window anomalous too: a streak that hysteresis
		// keeps above Clear outlives the attack (a scope seen once in a
		// while, alone, on a sparse site), and must not re-emit its rule on
		// a window that passes no gate once the cool-down is over.
		// A window with Persist times the floors holds the evidence of
		// Persist windows: an attack that begins 2 s before a window ends
		// passes no gate there, and waiting for a second full window put
		// its time to detect at 22 s over a 10 s window.
		n := it.Count - it.Err
		strong := n >= uint64(c.o.Persist)*c.o.MinRequests && ips >= uint64(c.o.Persist)*c.o.MinIPs
		if !anomalous || (st.streak < c.o.Persist && !strong) || st.expires.Sub(w.End) > c.o.TTL/2 {
			continue
		}
		r := c.rule(w, key, it, ips, base, of, !st.base.Ready())
		st.expires = r.ExpiresAt
		out.Rules = append(out.Rules, r)
	}
	for kind, xs := range popSeen {
		for _, x := range xs {
			c.pop[kind].Update(x)
		}
	}
	c.evict()
	out.Rules = narrowest(out.Rules)
	return out
}

// narrowest drops a rule on a JA4 anywhere when a rule on that JA4 on a
// route comes in the same window: the route explains the cluster, and a
// rule on the JA4 alone would limit every client of that browser.
func narrowest(rs []rules.Rule) []rules.Rule {
	onRoute := map[string]bool{}
	for _, r := range rs {
		if r.Origin == "detector/ja4-route" {
			onRoute[r.Match[0].Value] = true
		}
	}
	return slices.DeleteFunc(rs, func(r rules.Rule) bool {
		return r.Origin == "detector/ja4-cluster" && onRoute[r.Match[0].Value]
	})
}

// rule is the dynamic rule for an anomalous scope.
func (c *Cluster) rule(w stage.Window, key string, it sketch.Item, ips uint64, base *sketch.MAD, of uint64, isNew bool) rules.Rule {
	parts := strings.Split(key[2:], "\x00")
	var match []rules.Match
	var what, signal string
	switch key[0] {
	case scopeASNRoute:
		match = []rules.Match{{Key: rules.KeyASN, Value: parts[0]}, {Key: rules.KeyRoute, Value: parts[1]}}
		what, signal = "ASN "+parts[0]+" on route "+parts[1], "asn-concentration"
	case scopeJA4Route:
		match = []rules.Match{{Key: rules.KeyJA4, Value: parts[0]}, {Key: rules.KeyRoute, Value: parts[1]}}
		what, signal = "JA4 "+parts[0]+" on route "+parts[1], "ja4-route"
	default:
		match = []rules.Match{{Key: rules.KeyJA4, Value: parts[0]}}
		what, signal = "JA4 "+parts[0], "ja4-cluster"
	}
	// The limit: LimitFactor times the requests the scope's baseline share
	// of this window's traffic would have been.
	limit := max(c.o.MinLimit, int64(math.Ceil(c.o.LimitFactor*base.Median()*float64(of))))
	baseline := fmt.Sprintf("its baseline share is %.1f%%", 100*base.Median())
	if isNew {
		// A new scope's "baseline" is its kind's or its first windows':
		// "its baseline share is 100%" read as if the traffic were usual.
		baseline = fmt.Sprintf("it is new, with no baseline of its own yet (limit from a share of %.1f%%)", 100*base.Median())
	}
	r := dynamicRule(w, c.o.TTL, c.o.Enforce, rules.Rule{
		ID:     "dyn-cl-" + strconv.FormatUint(xxhash.Sum64String(key), 16),
		Match:  match,
		Limit:  limit,
		Period: c.o.Window,
		Origin: "detector/" + signal,
		Reason: fmt.Sprintf("%s sent %d of %d requests (%.0f%%) from about %d addresses in the %s window from %s; %s",
			what, it.Count, of, 100*float64(it.Count)/float64(of), ips, c.o.Window, w.Start.UTC().Format(time.RFC3339), baseline),
		Evidence: map[string]string{
			"signal":         signal,
			"count":          strconv.FormatUint(it.Count, 10),
			"count_error":    strconv.FormatUint(it.Err, 10),
			"distinct_ips":   strconv.FormatUint(ips, 10),
			"of_requests":    strconv.FormatUint(of, 10),
			"baseline_share": strconv.FormatFloat(base.Median(), 'f', 4, 64),
			"baseline_mad":   strconv.FormatFloat(base.MAD(), 'f', 4, 64),
		},
	})
	return r
}

// evict drops the baselines of the least recently seen scopes when there
// are more than MaxScopes, down to nine tenths of it: a sort of every scope
// once per MaxScopes/10 new ones, not once a window (which, on a log whose
// every window brings new scopes, was 39% of a replay's CPU).
func (c *Cluster) evict() {
	if len(c.scopes) <= c.o.MaxScopes {
		return
	}
	type aged struct {
		last uint64
		key  string
	}
	all := make([]aged, 0, len(c.scopes))
	for k, st := range c.scopes {
		all = append(all, aged{st.last, k})
	}
	slices.SortFunc(all, func(a, b aged) int {
		if c := cmp.Compare(a.last, b.last); c != 0 {
			return c
		}
		return strings.Compare(a.key, b.key)
	})
	for _, a := range all[:len(all)-(c.o.MaxScopes-c.o.MaxScopes/10)] {
		delete(c.scopes, a.key)
	}
}

// MarshalState encodes the state kept across windows: the population
// baselines and, per scope, its baseline, streak, activity, rule expiry and
// last window, sorted by scope.
func (c *Cluster) MarshalState() ([]byte, error) {
	b := binary.AppendUvarint(nil, c.seen)
	for _, m := range c.pop {
		x, err := m.MarshalBinary()
		if err != nil {
			return nil, err
		}
		b = stage.AppendBytes(b, x)
	}
	b = binary.AppendUvarint(b, uint64(len(c.scopes)))
	for _, k := range slices.Sorted(maps.Keys(c.scopes)) {
		st := c.scopes[k]
		x, err := st.base.MarshalBinary()
		if err != nil {
			return nil, err
		}
		ax, err := st.addrs.MarshalBinary()
		if err != nil {
			return nil, err
		}
		b = stage.AppendString(b, k)
		b = stage.AppendBytes(b, x)
		b = stage.AppendBytes(b, ax)
		b = binary.AppendUvarint(b, uint64(st.streak))
		b = binary.AppendVarint(b, st.expires.UnixMilli())
		b = binary.AppendUvarint(b, st.last)
		b = binary.AppendUvarint(b, st.first)
	}
	return b, nil
}

// UnmarshalState restores what MarshalState wrote.
func (c *Cluster) UnmarshalState(b []byte) error {
	r := stage.NewStateReader(b)
	seen := r.Uvarint()
	var pop [3]*sketch.MAD
	for i := range pop {
		pop[i] = new(sketch.MAD)
		if err := pop[i].UnmarshalBinary(r.Bytes()); err != nil {
			return fmt.Errorf("detector: cluster baseline: %w", err)
		}
	}
	scopes := map[string]*scopeState{}
	for range r.Count(9) {
		k := r.String()
		st := &scopeState{base: new(sketch.MAD), addrs: new(sketch.MAD)}
		if err := st.base.UnmarshalBinary(r.Bytes()); err != nil {
			return fmt.Errorf("detector: cluster scope baseline: %w", err)
		}
		if err := st.addrs.UnmarshalBinary(r.Bytes()); err != nil {
			return fmt.Errorf("detector: cluster scope addresses baseline: %w", err)
		}
		st.streak = int(min(r.Uvarint(), math.MaxInt32))
		st.expires, st.last = time.UnixMilli(r.Varint()), r.Uvarint()
		st.first = r.Uvarint()
		if len(k) < 2 {
			return fmt.Errorf("detector: cluster scope %q is not a scope", k)
		}
		scopes[k] = st
	}
	if err := r.Done(); err != nil {
		return fmt.Errorf("detector: cluster state: %w", err)
	}
	c.seen, c.pop, c.scopes = seen, pop, scopes
	return nil
}
