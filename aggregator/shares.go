package aggregator

import (
	"fmt"
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
// Shares is a pipeline.Stage: not safe for concurrent use. Build it with New.
type Shares struct {
	o       Options
	region  map[string]int
	global  []*rules.Rule
	win     *pipeline.Windows[*interval]
	demand  map[string][]float64 // rule id "|" tag -> smoothed demand per region
	written map[string]*written  // rule id "|" tag -> last written shares
	idle    map[string]int       // intervals since a heavy key was last heavy
}

type written struct {
	f  []float64 // per region
	at time.Time
}

type interval struct {
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
	s.win = pipeline.NewWindows(o.Interval, func() *interval {
		iv := &interval{rules: make([]*ruleDemand, len(s.global))}
		for i := range iv.rules {
			rd := &ruleDemand{top: sketch.NewTopK(o.K * 4), cms: make([]*sketch.CountMin, len(o.Regions)), totals: make([]uint64, len(o.Regions))}
			for j := range rd.cms {
				rd.cms[j], _ = sketch.NewCountMin(0.001, 0.01) // valid constants
			}
			iv.rules[i] = rd
		}
		return iv
	})
	return s, nil
}

// Observe counts one record's demand against every global rule it matches.
func (s *Shares) Observe(d *decisionpb.Decision) {
	if len(s.global) == 0 {
		return
	}
	ri, ok := s.region[d.Region]
	if !ok {
		return
	}
	iv, ok := s.win.For(d.EventTimeMs)
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
		rd.top.Add(tag, cost)
		rd.cms[ri].Add(sketch.Hash64(tag), cost)
		rd.totals[ri] += cost
	}
}

// Advance closes intervals that end at or before wm and returns the shares
// that changed, sorted by rule, key and region.
func (s *Shares) Advance(wm time.Time) pipeline.Output {
	var out pipeline.Output
	s.win.Close(wm.UnixMilli(), func(_, end time.Time, iv *interval) {
		out.Shares = append(out.Shares, s.closeInterval(end, iv)...)
	})
	return out
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
