package detector

import (
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/sketch"
)

// NewIdentityOptions configure the new-versus-returning signal. Zero fields
// take the defaults named on each.
type NewIdentityOptions struct {
	// Window is the event-time window. Default 10 s.
	Window time.Duration
	// K is how many routes are followed. Default 16.
	K int
	// History is how many past windows an address must be absent from to
	// count as new. Default 30 (5 min with the default window).
	History int
	// MinNew is the least new addresses on a route in a window, and
	// MinShare the least share of the route's addresses they must be, for
	// the window to count as anomalous. Defaults 100 and 0.5.
	MinNew   uint64
	MinShare float64
	// MinFailShare is the least share of the route's requests answered
	// 401, 403 or 429 in the window: newcomers that fail are a botnet
	// trying credentials; newcomers that succeed are a flash crowd.
	// Default 0.5.
	MinFailShare float64
	// Trigger and Clear are robust z-scores of the new share against the
	// route's baseline, as for Cluster. Defaults 8 and 3.
	Trigger, Clear float64
	// Persist is how many anomalous windows in a row make a rule. Default 2.
	Persist int
	// Baseline and Warmup: past windows a route's baseline keeps and needs.
	// Defaults 60 and 6.
	Baseline, Warmup int
	// LimitFactor times the requests of the route's returning addresses in
	// the window is the rule's limit, at least MinLimit. Defaults 2 and 10.
	LimitFactor float64
	MinLimit    int64
	// TTL of an emitted rule (cool-down: half of it). Default 10 min.
	TTL time.Duration
	// Enforce emits rules in enforce mode; default shadow.
	Enforce bool
}

func (o *NewIdentityOptions) defaults() error {
	orDefault(&o.Window, 10*time.Second)
	orDefault(&o.K, 16)
	orDefault(&o.History, 30)
	orDefault(&o.MinNew, 100)
	orDefault(&o.MinShare, 0.5)
	orDefault(&o.MinFailShare, 0.5)
	orDefault(&o.LimitFactor, 2)
	orDefault(&o.MinLimit, 10)
	orDefault(&o.TTL, 10*time.Minute)
	c := optCheck{signal: "new identities"}
	c.window(o.Window)
	c.ttl(o.TTL, o.Window)
	// Each followed route keeps History HyperLogLogs of 2 KiB.
	c.count("K", o.K, 4096)
	c.count("History", o.History, 1024)
	c.fraction("MinShare", o.MinShare)
	c.fraction("MinFailShare", o.MinFailShare)
	c.baseline(&o.Trigger, &o.Clear, &o.Persist, &o.Baseline, &o.Warmup)
	c.positive("LimitFactor", o.LimitFactor)
	c.limit("MinLimit", o.MinLimit)
	return c.err()
}

// idPrecision is the precision of the per-route HyperLogLogs: 2 KiB each,
// 2.3% standard error.
const idPrecision = 11

// NewIdentities flags a route whose addresses are suddenly mostly new: a
// surge of addresses not seen on it in the last History windows, far above
// the route's usual share of newcomers, as when a botnet of fresh
// residential addresses turns on a login page, and most of the route's
// answers are failures (401, 403, 429), which tells it from a flash crowd of
// new visitors. Per window and partition it
// keeps a top-k of routes and a HyperLogLog of each followed route's
// addresses; the merge tier keeps the route's last History windows and
// counts the new ones as |window ∪ history| - |history| (both HyperLogLogs,
// Flajolet et al. 2007). The share of new addresses is judged by a robust
// z-score against the route's baseline, with hysteresis and cool-down as
// Cluster does, and a flagged route becomes a rule scoped to it.
//
// NewIdentities is a stage.Stage and Checkpointer, not safe for
// concurrent use. Build it with NewNewIdentities.
type NewIdentities struct {
	o      NewIdentityOptions
	seen   uint64
	routes map[string]*routeHistory
}

type routeHistory struct {
	past    []*sketch.HLL // the last History windows' addresses, oldest first
	at      []uint64      // the window each was in
	base    *sketch.MAD
	streak  int
	expires time.Time
}

// NewNewIdentities returns the signal with o's zero fields defaulted, or
// an error wrapping ErrBadOptions.
func NewNewIdentities(o NewIdentityOptions) (*NewIdentities, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	return &NewIdentities{o: o, routes: map[string]*routeHistory{}}, nil
}

// Name is the stage's name in the pipeline.
func (s *NewIdentities) Name() string { return "new-identities" }

// Window is the event-time window the signal counts in.
func (s *NewIdentities) Window() time.Duration { return s.o.Window }

type newIDPartial struct {
	k      int
	routes *sketch.TopK
	ips    map[string]*sketch.HLL
	fails  map[string]uint64 // 401, 403 and 429 answers, per followed route
}

// NewPartial returns an empty window state.
func (s *NewIdentities) NewPartial() stage.Partial {
	return &newIDPartial{k: s.o.K, routes: sketch.NewTopK(s.o.K), ips: map[string]*sketch.HLL{}, fails: map[string]uint64{}}
}

// Observe counts one record's address on its route.
func (p *newIDPartial) Observe(d *decisionpb.Decision) {
	x := d.GetDescriptors()
	ip := x.GetClientIp()
	if ip == "" {
		return
	}
	route, ok := recordRoute(x)
	if !ok {
		return
	}
	h := sketch.Hash64(route)
	p.routes.AddHash(h, route, 1)
	hll := p.ips[route]
	if hll == nil {
		if len(p.ips) >= 2*p.k {
			p.prune()
		}
		hll = sketch.NewHLL(idPrecision)
		p.ips[route] = hll
	}
	hll.InsertHash(sketch.Hash64(ip))
	if st := d.GetStatus(); st == 401 || st == 403 || st == 429 {
		p.fails[route]++
	}
}

func (p *newIDPartial) prune() {
	for r := range p.ips {
		if !p.routes.Tracked(sketch.Hash64(r), r) {
			delete(p.ips, r)
			delete(p.fails, r)
		}
	}
}

// Merge folds in another partition's state of the same window.
func (p *newIDPartial) Merge(o stage.Partial) error {
	x, ok := o.(*newIDPartial)
	if !ok {
		return fmt.Errorf("detector: new identities cannot merge a %T", o)
	}
	p.routes.Merge(x.routes)
	for _, r := range slices.Sorted(maps.Keys(x.ips)) {
		if mine := p.ips[r]; mine != nil {
			if err := mine.Merge(x.ips[r]); err != nil {
				return err
			}
		} else {
			p.ips[r] = x.ips[r]
		}
		p.fails[r] += x.fails[r]
	}
	p.prune()
	return nil
}

// MarshalBinary encodes the state: K, the routes' top-k, then each followed
// route's HyperLogLog, sorted by route.
func (p *newIDPartial) MarshalBinary() ([]byte, error) {
	p.prune()
	top, err := p.routes.MarshalBinary()
	if err != nil {
		return nil, err
	}
	b := binary.AppendUvarint(nil, uint64(p.k))
	b = stage.AppendBytes(b, top)
	b = binary.AppendUvarint(b, uint64(len(p.ips)))
	for _, r := range slices.Sorted(maps.Keys(p.ips)) {
		x, err := p.ips[r].MarshalBinary()
		if err != nil {
			return nil, err
		}
		b = stage.AppendString(b, r)
		b = stage.AppendBytes(b, x)
		b = binary.AppendUvarint(b, p.fails[r])
	}
	return b, nil
}

// DecodePartial decodes what a partial's MarshalBinary wrote.
func (s *NewIdentities) DecodePartial(b []byte) (stage.Partial, error) {
	r := stage.NewStateReader(b)
	k := r.Uvarint()
	top := r.Bytes()
	p := &newIDPartial{routes: new(sketch.TopK), ips: map[string]*sketch.HLL{}, fails: map[string]uint64{}}
	for range r.Count(3) {
		route := r.String()
		h := new(sketch.HLL)
		if err := h.UnmarshalBinary(r.Bytes()); err != nil {
			return nil, fmt.Errorf("detector: new identities of route %.64q: %w", route, err)
		}
		if h.Precision() != idPrecision {
			return nil, fmt.Errorf("detector: new identities of route %.64q: precision %d, want %d", route, h.Precision(), idPrecision)
		}
		p.ips[route] = h
		p.fails[route] = r.Uvarint()
	}
	if err := r.Done(); err != nil {
		return nil, fmt.Errorf("detector: new-identities window state: %w", err)
	}
	if err := p.routes.UnmarshalBinary(top); err != nil {
		return nil, fmt.Errorf("detector: new-identities routes: %w", err)
	}
	if k == 0 || k != uint64(p.routes.K()) {
		return nil, fmt.Errorf("detector: new-identities window state of %d routes with a top-k of %d", k, p.routes.K())
	}
	p.k = int(k)
	return p, nil
}

// Finish judges each followed route's newcomers and returns the rules of
// the routes anomalous for Persist windows.
func (s *NewIdentities) Finish(w stage.Window, merged stage.Partial) stage.Output {
	p, ok := merged.(*newIDPartial)
	if !ok {
		return stage.Output{}
	}
	s.seen++
	var out stage.Output
	scratch := sketch.NewHLL(idPrecision)
	for _, it := range p.routes.List() {
		cur := p.ips[it.Key]
		if cur == nil {
			continue
		}
		rh := s.routes[it.Key]
		if rh == nil {
			rh = &routeHistory{base: sketch.NewMAD(s.o.Baseline, s.o.Warmup)}
			s.routes[it.Key] = rh
		}
		rh.expire(s.seen, s.o.History)
		scratch.Reset()
		for _, h := range rh.past {
			_ = scratch.Merge(h) // one precision throughout
		}
		before := scratch.Estimate()
		_ = scratch.Merge(cur)
		after := max(scratch.Estimate(), before)
		distinct := max(min(cur.Estimate(), it.Count), 1) // no more addresses than requests
		fresh := min(after-before, distinct)
		share := float64(fresh) / float64(distinct)
		failShare := float64(p.fails[it.Key]) / float64(max(it.Count, 1))
		full := len(rh.past) >= s.o.History/2 // enough history to call anyone new
		gate := share >= s.o.MinShare && fresh >= s.o.MinNew && failShare >= s.o.MinFailShare
		anomalous := judge(rh.base, rh.base, share, full, gate, full, thresholds{s.o.Trigger, s.o.Clear}, &rh.streak)
		rh.past, rh.at = append(rh.past, cur), append(rh.at, s.seen)
		// As for clusters: a rule needs this window anomalous, not only a
		// streak that hysteresis kept alive.
		if !anomalous || rh.streak < s.o.Persist || rh.expires.Sub(w.End) > s.o.TTL/2 {
			continue
		}
		returning := float64(it.Count) * (1 - share)
		limit := max(s.o.MinLimit, int64(math.Ceil(s.o.LimitFactor*returning)))
		r := dynamicRule(w, s.o.TTL, s.o.Enforce, rules.Rule{
			ID:     "dyn-ni-" + strconv.FormatUint(sketch.Hash64(it.Key), 16),
			Match:  []rules.Match{{Key: rules.KeyRoute, Value: it.Key}},
			Limit:  limit,
			Period: s.o.Window,
			Origin: "detector/new-identities",
			Reason: fmt.Sprintf("route %s: %d of its %d addresses (%.0f%%) in the %s window from %s were not seen in the %d windows before; its usual share of newcomers is %.0f%%",
				it.Key, fresh, distinct, 100*share, s.o.Window, w.Start.UTC().Format(time.RFC3339), s.o.History, 100*rh.base.Median()),
			Evidence: map[string]string{
				"signal":         "new-identities",
				"count":          strconv.FormatUint(it.Count, 10),
				"addresses":      strconv.FormatUint(distinct, 10),
				"new_addresses":  strconv.FormatUint(fresh, 10),
				"failed_share":   strconv.FormatFloat(failShare, 'f', 3, 64),
				"baseline_share": strconv.FormatFloat(rh.base.Median(), 'f', 4, 64),
				"baseline_mad":   strconv.FormatFloat(rh.base.MAD(), 'f', 4, 64),
			},
		})
		rh.expires = r.ExpiresAt
		out.Rules = append(out.Rules, r)
	}
	s.forget()
	return out
}

// expire drops the history older than the last n windows before window now.
func (rh *routeHistory) expire(now uint64, n int) {
	i := 0
	for i < len(rh.at) && rh.at[i]+uint64(n) < now {
		i++
	}
	rh.past, rh.at = rh.past[i:], rh.at[i:]
}

// forget drops routes not followed for a whole history, beyond 4K routes.
func (s *NewIdentities) forget() {
	if len(s.routes) <= 4*s.o.K {
		return
	}
	for r, rh := range s.routes {
		rh.expire(s.seen, s.o.History)
		if len(rh.past) == 0 {
			delete(s.routes, r)
		}
	}
}

// MarshalState encodes the routes' histories and baselines, sorted by
// route.
func (s *NewIdentities) MarshalState() ([]byte, error) {
	b := binary.AppendUvarint(nil, s.seen)
	b = binary.AppendUvarint(b, uint64(len(s.routes)))
	for _, r := range slices.Sorted(maps.Keys(s.routes)) {
		rh := s.routes[r]
		base, err := rh.base.MarshalBinary()
		if err != nil {
			return nil, err
		}
		b = stage.AppendString(b, r)
		b = stage.AppendBytes(b, base)
		b = binary.AppendUvarint(b, uint64(rh.streak))
		b = binary.AppendVarint(b, rh.expires.UnixMilli())
		b = binary.AppendUvarint(b, uint64(len(rh.past)))
		for i, h := range rh.past {
			x, err := h.MarshalBinary()
			if err != nil {
				return nil, err
			}
			b = binary.AppendUvarint(b, rh.at[i])
			b = stage.AppendBytes(b, x)
		}
	}
	return b, nil
}

// UnmarshalState restores what MarshalState wrote.
func (s *NewIdentities) UnmarshalState(b []byte) error {
	r := stage.NewStateReader(b)
	seen := r.Uvarint()
	routes := map[string]*routeHistory{}
	for range r.Count(6) {
		name := r.String()
		rh := &routeHistory{base: new(sketch.MAD)}
		if err := rh.base.UnmarshalBinary(r.Bytes()); err != nil {
			return fmt.Errorf("detector: new-identities baseline: %w", err)
		}
		rh.streak = int(min(r.Uvarint(), math.MaxInt32))
		rh.expires = time.UnixMilli(r.Varint())
		for range r.Count(3) {
			at := r.Uvarint()
			h := new(sketch.HLL)
			if err := h.UnmarshalBinary(r.Bytes()); err != nil {
				return fmt.Errorf("detector: new-identities history: %w", err)
			}
			if h.Precision() != idPrecision {
				return fmt.Errorf("detector: new-identities history of precision %d, want %d", h.Precision(), idPrecision)
			}
			rh.past, rh.at = append(rh.past, h), append(rh.at, at)
		}
		routes[name] = rh
	}
	if err := r.Done(); err != nil {
		return fmt.Errorf("detector: new-identities state: %w", err)
	}
	s.seen, s.routes = seen, routes
	return nil
}
