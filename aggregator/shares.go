package aggregator

import (
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/pipeline"
	"github.com/sluice-rl/sluice/pipeline/decisionpb"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/sketch"
)

// Options configure Shares. Zero fields take the defaults named on each.
type Options struct {
	// Regions that share every global rule. Required.
	Regions []string
	// Rules: the global rules to split; others are ignored.
	Rules []*rules.Rule
	// Interval is the event-time window over which demand is measured and
	// after which shares are recomputed. Default 10 s.
	Interval time.Duration
	// Floor is the least share of every region, so a quiet region can still
	// serve its first requests. Must be < 1/len(Regions). Default 0.05.
	Floor float64
	// Alpha smooths demand across intervals (EWMA weight of the newest).
	// Default 0.5.
	Alpha float64
	// K heavy keys per rule get shares of their own, when their demand in
	// an interval is at least MinDemand; the rest share the rule's default
	// split. Defaults 32 and 20.
	K         int
	MinDemand uint64
	// MinChange: a key's shares are written (all regions together) only
	// when one moves by more than this, or when they were last written
	// Heartbeat ago (so that enforcers, which ignore shares older than their
	// ShareTTL, keep them). Defaults 0.01 and 2 intervals.
	MinChange float64
	Heartbeat time.Duration
}

func (o *Options) validate() error {
	if len(o.Regions) == 0 {
		return fmt.Errorf("aggregator: no regions")
	}
	if o.Interval <= 0 {
		o.Interval = 10 * time.Second
	}
	if o.Floor == 0 {
		o.Floor = 0.05
	}
	if o.Floor < 0 || o.Floor*float64(len(o.Regions)) >= 1 {
		return fmt.Errorf("aggregator: every region keeps a floor share of %.3f, so %d regions take %.2f of the limit: use at most %d regions or a smaller floor",
			o.Floor, len(o.Regions), o.Floor*float64(len(o.Regions)), int(math.Ceil(1/o.Floor))-1)
	}
	if o.Alpha <= 0 || o.Alpha > 1 {
		o.Alpha = 0.5
	}
	if o.K <= 0 {
		o.K = 32
	}
	if o.MinDemand == 0 {
		o.MinDemand = 20
	}
	if o.MinChange <= 0 {
		o.MinChange = 0.01
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = 2 * o.Interval
	}
	return nil
}

// Shares computes demand-weighted per-region shares of global rules from the
// decision stream.
//
// Per rule and interval it counts demand (allowed plus denied) per region:
// a Space-Saving top-k over entity tags finds the heavy keys, and one
// count-min sketch per region (Cormode and Muthukrishnan 2005) gives each
// heavy key's demand in that region; region totals give the default split.
// Demand is smoothed by an EWMA across intervals, and a region's share is
//
//	share_r = Floor + (1 - R*Floor) * demand_r / sum(demand)
//
// so shares sum to 1 and no region drops below Floor. A region with no
// demand decays towards Floor. Shares are versioned by the interval's end.
//
// Shares is a pipeline.Stage and Checkpointer: not safe for concurrent use.
// Build it with New.
type Shares struct {
	o       Options
	region  map[string]int
	global  []*rules.Rule
	demand  map[string][]float64 // rule id "|" tag -> smoothed demand per region
	written map[string]*written  // rule id "|" tag -> last written shares
	idle    map[string]int       // intervals since a heavy key was last heavy
}

type written struct {
	f  []float64 // per region
	at time.Time
}

// interval is one interval's demand on one partition, per global rule.
type interval struct {
	s     *Shares
	rules []*ruleDemand
}

type ruleDemand struct {
	top    *sketch.TopK
	cms    []*sketch.CountMin // per region
	totals []uint64           // per region
}

// New returns the stage.
func New(o Options) (*Shares, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	s := &Shares{o: o, region: map[string]int{}, demand: map[string][]float64{}, written: map[string]*written{}, idle: map[string]int{}}
	for i, r := range o.Regions {
		s.region[r] = i
	}
	for _, r := range o.Rules {
		if r.Global {
			s.global = append(s.global, r)
		}
	}
	return s, nil
}

// Name is the stage's name in the pipeline.
func (s *Shares) Name() string { return "shares" }

// Window is the interval demand is measured over.
func (s *Shares) Window() time.Duration { return s.o.Interval }

// NewPartial returns an empty interval.
func (s *Shares) NewPartial() pipeline.Partial {
	iv := &interval{s: s, rules: make([]*ruleDemand, len(s.global))}
	for i := range iv.rules {
		rd := &ruleDemand{top: sketch.NewTopK(s.o.K * 4), cms: make([]*sketch.CountMin, len(s.o.Regions)), totals: make([]uint64, len(s.o.Regions))}
		for j := range rd.cms {
			rd.cms[j], _ = sketch.NewCountMin(0.001, 0.01) // valid constants
		}
		iv.rules[i] = rd
	}
	return iv
}

// Observe counts one record's demand against every global rule it matches.
func (iv *interval) Observe(d *decisionpb.Decision) {
	s := iv.s
	if len(s.global) == 0 {
		return
	}
	ri, ok := s.region[d.Region]
	if !ok {
		return
	}
	desc := pipeline.Descriptors(d)
	cost := uint64(max(d.Cost, 1))
	for i, r := range s.global {
		if !r.Matches(&desc) {
			continue
		}
		tag := rules.EntityTag(r, &desc)
		rd := iv.rules[i]
		h := sketch.Hash64(tag)
		rd.top.AddHash(h, tag, cost)
		rd.cms[ri].Add(h, cost)
		rd.totals[ri] += cost
	}
}

// Merge folds in another partition's demand for the same interval.
func (iv *interval) Merge(o pipeline.Partial) error {
	x, ok := o.(*interval)
	if !ok || len(x.rules) != len(iv.rules) {
		return fmt.Errorf("aggregator: cannot merge a %T into an interval of %d rules", o, len(iv.rules))
	}
	for i, rd := range iv.rules {
		xr := x.rules[i]
		if len(xr.cms) != len(rd.cms) {
			return fmt.Errorf("aggregator: interval of %d regions cannot merge one of %d", len(rd.cms), len(xr.cms))
		}
		rd.top.Merge(xr.top)
		for j := range rd.cms {
			if err := rd.cms[j].Merge(xr.cms[j]); err != nil {
				return err
			}
			rd.totals[j] += xr.totals[j]
		}
	}
	return nil
}

// MarshalBinary encodes the interval: per global rule, its top-k, then per
// region its count-min and its total.
func (iv *interval) MarshalBinary() ([]byte, error) {
	b := binary.AppendUvarint(nil, uint64(len(iv.rules)))
	for _, rd := range iv.rules {
		top, err := rd.top.MarshalBinary()
		if err != nil {
			return nil, err
		}
		b = pipeline.AppendBytes(b, top)
		b = binary.AppendUvarint(b, uint64(len(rd.cms)))
		for j, cm := range rd.cms {
			x, err := cm.MarshalBinary()
			if err != nil {
				return nil, err
			}
			b = pipeline.AppendBytes(b, x)
			b = binary.AppendUvarint(b, rd.totals[j])
		}
	}
	return b, nil
}

// DecodePartial decodes what an interval's MarshalBinary wrote.
func (s *Shares) DecodePartial(b []byte) (pipeline.Partial, error) {
	r := pipeline.NewStateReader(b)
	iv := &interval{s: s}
	for range r.Count(2) {
		rd := &ruleDemand{top: new(sketch.TopK)}
		if err := rd.top.UnmarshalBinary(r.Bytes()); err != nil {
			return nil, fmt.Errorf("aggregator: interval top-k: %w", err)
		}
		for range r.Count(2) {
			cm := new(sketch.CountMin)
			if err := cm.UnmarshalBinary(r.Bytes()); err != nil {
				return nil, fmt.Errorf("aggregator: interval count-min: %w", err)
			}
			rd.cms = append(rd.cms, cm)
			rd.totals = append(rd.totals, r.Uvarint())
		}
		iv.rules = append(iv.rules, rd)
	}
	if err := r.Done(); err != nil {
		return nil, fmt.Errorf("aggregator: interval: %w", err)
	}
	return iv, nil
}

// Finish recomputes shares from an interval merged over every partition
// and returns the shares that changed, sorted by rule, key and region.
func (s *Shares) Finish(w pipeline.Window, merged pipeline.Partial) pipeline.Output {
	iv, ok := merged.(*interval)
	if !ok || len(iv.rules) != len(s.global) {
		return pipeline.Output{}
	}
	return pipeline.Output{Shares: s.closeInterval(w.End, iv)}
}

// MarshalState encodes the state kept across intervals: per key, its
// smoothed demand, its last written shares and when, and its idle count.
func (s *Shares) MarshalState() ([]byte, error) {
	b := binary.AppendUvarint(nil, uint64(len(s.demand)))
	for _, k := range slices.Sorted(maps.Keys(s.demand)) {
		b = pipeline.AppendString(b, k)
		b = appendFloats(b, s.demand[k])
		w := s.written[k]
		if w == nil {
			w = &written{}
		}
		b = appendFloats(b, w.f)
		b = binary.AppendVarint(b, w.at.UnixMilli())
		b = binary.AppendUvarint(b, uint64(s.idle[k]))
	}
	return b, nil
}

func appendFloats(b []byte, f []float64) []byte {
	b = binary.AppendUvarint(b, uint64(len(f)))
	for _, x := range f {
		b = pipeline.AppendFloat(b, x)
	}
	return b
}

func readFloats(r *pipeline.StateReader) []float64 {
	f := make([]float64, r.Count(8))
	for i := range f {
		f[i] = r.Float()
	}
	return f
}

// UnmarshalState restores what MarshalState wrote.
func (s *Shares) UnmarshalState(b []byte) error {
	r := pipeline.NewStateReader(b)
	demand, wr, idle := map[string][]float64{}, map[string]*written{}, map[string]int{}
	R := len(s.o.Regions)
	for range r.Count(3) {
		k := r.String()
		d, f := readFloats(r), readFloats(r)
		at := r.Varint()
		n := r.Uvarint()
		if len(d) != R || len(f) != 0 && len(f) != R {
			return fmt.Errorf("aggregator: state for %d regions, this stage has %d", len(d), R)
		}
		demand[k], idle[k] = d, int(min(n, maxIdle+1))
		if len(f) == R {
			wr[k] = &written{f: f, at: time.UnixMilli(at)}
		}
	}
	if err := r.Done(); err != nil {
		return fmt.Errorf("aggregator: state: %w", err)
	}
	s.demand, s.written, s.idle = demand, wr, idle
	return nil
}

const maxIdle = 6

func (s *Shares) closeInterval(end time.Time, iv *interval) []rules.Share {
	var out []rules.Share
	R := len(s.o.Regions)
	for i, r := range s.global {
		rd := iv.rules[i]
		now := map[string][]float64{r.ID + "|": toFloat(rd.totals)}
		items := rd.top.List()
		for _, it := range items[:min(len(items), s.o.K)] {
			if it.Count < s.o.MinDemand {
				break // sorted by count
			}
			d := make([]float64, R)
			h := sketch.Hash64(it.Key)
			for j, cm := range rd.cms {
				d[j] = float64(cm.Estimate(h))
			}
			now[r.ID+"|"+it.Key] = d
		}
		for k := range now {
			s.idle[k] = 0
		}
		// Keys heavy before but not now decay with zero demand, then retire.
		for k := range s.demand {
			if _, ok := now[k]; !ok && strings.HasPrefix(k, r.ID+"|") {
				if s.idle[k]++; s.idle[k] > maxIdle {
					delete(s.demand, k)
					delete(s.written, k)
					delete(s.idle, k)
					continue
				}
				now[k] = make([]float64, R)
			}
		}
		keys := make([]string, 0, len(now))
		for k := range now {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			sm := s.demand[k]
			if sm == nil {
				sm = now[k] // first sight: no history to smooth with
			} else {
				for j := range sm {
					sm[j] = s.o.Alpha*now[k][j] + (1-s.o.Alpha)*sm[j]
				}
			}
			s.demand[k] = sm
			shares := s.split(sm)
			last := s.written[k]
			if last == nil {
				last = &written{f: make([]float64, R)}
				s.written[k] = last
			}
			// A key's shares are written together, all regions at one
			// version, so the newest set always sums to at most 1.
			write := end.Sub(last.at) >= s.o.Heartbeat
			for j, f := range shares {
				write = write || math.Abs(last.f[j]-f) > s.o.MinChange
			}
			if !write {
				continue
			}
			for j, f := range shares {
				out = append(out, rules.Share{
					RuleID: r.ID, Key: k[len(r.ID)+1:], Region: s.o.Regions[j],
					Fraction: f, Version: end.UnixMilli(), ComputedAt: end,
				})
			}
			last.f, last.at = shares, end
		}
	}
	return out
}

// split turns smoothed demand per region into shares summing to 1.
func (s *Shares) split(d []float64) []float64 {
	R := float64(len(d))
	total := 0.0
	for _, x := range d {
		total += x
	}
	out := make([]float64, len(d))
	for j, x := range d {
		if total == 0 {
			out[j] = 1 / R
			continue
		}
		out[j] = s.o.Floor + (1-R*s.o.Floor)*x/total
	}
	return out
}

func toFloat(v []uint64) []float64 {
	f := make([]float64, len(v))
	for i, x := range v {
		f[i] = float64(x)
	}
	return f
}
