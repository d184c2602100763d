package aggregator

import (
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/sketch"
)

// Options configure Shares. Zero fields take the defaults named on each.
type Options struct {
	// Regions that share every global rule. Required.
	Regions []string
	// Rules: the global rules to split; others are ignored, as are pinned
	// and G-Counter rules, which are global without shares (counted in a
	// home region, or in every region's G-Counter).
	Rules []*rules.Rule
	// Interval is the event-time window over which demand is measured and
	// after which shares are recomputed. Default 250 ms. Shares follow
	// demand only as fast as the pipeline closes windows: run it with a
	// Lateness of a few intervals (sluice pipeline: --lateness 1s), not the
	// library's 10 s (see docs/global-quotas.md).
	Interval time.Duration
	// Floor is the least share of every region, so a quiet region can still
	// serve its first requests. Must be < 1/len(Regions). Default 0.05.
	Floor float64
	// Alpha smooths demand across intervals (EWMA weight of the newest).
	// Default 0.8: after a step in demand, 96% of the step is in the shares
	// two intervals later.
	Alpha float64
	// Silent: a region with no demand for a key in this many intervals in a
	// row has its smoothed demand for the key set to zero, so its share is
	// the floor and the other regions reclaim the rest, rather than waiting
	// for the EWMA to decay. Default 2.
	Silent int
	// DefaultSplit, when set, fixes the long tail's split (the rule's
	// default share, entity tag "") from configuration: region name to
	// fraction, each in [0, 1], summing to at most 1; regions not named get
	// 0. Unset, the default split follows the regions' overall traffic for
	// the rule, as heavy keys' shares follow theirs.
	DefaultSplit map[string]float64
	// K heavy keys per rule get shares of their own, when their demand in
	// an interval is at least MinDemand; the rest share the rule's default
	// split. Defaults 32 and 20.
	K         int
	MinDemand uint64
	// MinChange: a key's shares are written (all regions together) only
	// when one moves by more than this, or when they were last written
	// Heartbeat ago (so that enforcers, which ignore shares older than their
	// ShareTTL, 30 s by default, keep them). Defaults 0.01 and the larger of
	// 2 intervals and 5 s.
	MinChange float64
	Heartbeat time.Duration
}

func (o *Options) validate() error {
	if len(o.Regions) == 0 {
		return fmt.Errorf("aggregator: no regions")
	}
	if o.Interval <= 0 {
		o.Interval = 250 * time.Millisecond
	}
	if o.Floor == 0 {
		o.Floor = 0.05
	}
	if o.Floor < 0 || o.Floor*float64(len(o.Regions)) >= 1 {
		return fmt.Errorf("aggregator: every region keeps a floor share of %.3f, so %d regions take %.2f of the limit: use at most %d regions or a smaller floor (--share-floor)",
			o.Floor, len(o.Regions), o.Floor*float64(len(o.Regions)), int(math.Ceil(1/o.Floor))-1)
	}
	if o.Alpha <= 0 || o.Alpha > 1 {
		o.Alpha = 0.8
	}
	if o.Silent <= 0 {
		o.Silent = 2
	}
	if o.DefaultSplit != nil {
		sum := 0.0
		for r, f := range o.DefaultSplit {
			if !slices.Contains(o.Regions, r) {
				return fmt.Errorf("aggregator: the default split names region %q, which is not one of %v", r, o.Regions)
			}
			if !(f >= 0 && f <= 1) {
				return fmt.Errorf("aggregator: the default split gives region %s %v: want a fraction from 0 to 1", r, f)
			}
			sum += f
		}
		if sum > 1+1e-9 {
			return fmt.Errorf("aggregator: the default split sums to %.4f: the regions' fractions must sum to at most 1", sum)
		}
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
		o.Heartbeat = max(2*o.Interval, 5*time.Second)
	}
	return nil
}

// Shares computes demand-weighted per-region shares of global rules from the
// decision stream.
//
// Per rule and interval it counts demand (allowed plus denied, in cost
// units) per region: a Space-Saving top-k over entity tags (Metwally,
// Agrawal and El Abbadi 2005) finds the heavy keys, and one count-min sketch
// (Cormode and Muthukrishnan 2005) over (entity tag, region) gives each heavy
// key's demand in each region; region totals give the default split (or
// Options.DefaultSplit fixes it). Demand is smoothed by an EWMA across
// intervals, and a region's share is
//
//	share_r = Floor + (1 - R*Floor) * demand_r / sum(demand)
//
// (1/R each when no region has demand); should floating-point rounding take
// their sum above 1, the largest gives up the excess, so a key's shares sum
// to at most 1 and no region drops below Floor. A region silent for a key
// for Options.Silent intervals has its smoothed demand zeroed: its share
// falls to Floor and the others take the rest. A key's shares are written
// together, versioned by the interval's end (Version, in Unix ms, and
// ComputedAt).
//
// Shares is a stage.Stage and Checkpointer: not safe for concurrent use.
// Build it with New.
type Shares struct {
	o       Options
	region  map[string]int
	salt    []uint64 // per region, mixed into a tag's hash for the count-min
	global  []*rules.Rule
	demand  map[string][]float64 // rule id "|" tag -> smoothed demand per region
	silent  map[string][]int     // rule id "|" tag -> intervals in a row without demand, per region
	written map[string]*written  // rule id "|" tag -> last written shares
	idle    map[string]int       // intervals since a heavy key was last heavy
	fixed   []float64            // Options.DefaultSplit per region, nil if unset
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
	cms    *sketch.CountMin // keyed by regionHash(tag, region)
	totals []uint64         // per region
}

// cmsEpsilon and cmsDelta size each rule's count-min: 2 719 x 5 counters,
// 106 KiB per rule in each open interval of each partition (sparse in the
// partial it sends, see appendSparse). A heavy key's demand in a
// region is overestimated by at most 0.1% of the rule's demand in the
// interval, with probability 99%.
const cmsEpsilon, cmsDelta = 0.001, 0.01

// New returns the stage.
func New(o Options) (*Shares, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	s := &Shares{o: o, region: map[string]int{}, demand: map[string][]float64{}, silent: map[string][]int{},
		written: map[string]*written{}, idle: map[string]int{}}
	for i, r := range o.Regions {
		if _, dup := s.region[r]; dup {
			return nil, fmt.Errorf("aggregator: region %q is named twice", r)
		}
		s.region[r] = i
		s.salt = append(s.salt, sketch.Hash64("region\x00"+r))
	}
	if o.DefaultSplit != nil {
		s.fixed = make([]float64, len(o.Regions))
		for r, f := range o.DefaultSplit {
			s.fixed[s.region[r]] = f
		}
	}
	for _, r := range o.Rules {
		if r.Global && !r.Pinned && !r.GCounter {
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
func (s *Shares) NewPartial() stage.Partial {
	iv := &interval{s: s, rules: make([]*ruleDemand, len(s.global))}
	for i := range iv.rules {
		cms, _ := sketch.NewCountMin(cmsEpsilon, cmsDelta) // valid constants
		iv.rules[i] = &ruleDemand{top: sketch.NewTopK(s.o.K * 4), cms: cms, totals: make([]uint64, len(s.o.Regions))}
	}
	return iv
}

// regionHash is the count-min key of a tag's demand in region j.
func (s *Shares) regionHash(h uint64, j int) uint64 { return h ^ s.salt[j] }

// Observe counts one record's demand against every global rule it matches.
// It allocates nothing beyond decision.Descriptors (an ASN's text).
func (iv *interval) Observe(d *decisionpb.Decision) {
	s := iv.s
	if len(s.global) == 0 {
		return
	}
	ri, ok := s.region[d.Region]
	if !ok {
		return
	}
	desc := decision.Descriptors(d)
	cost := uint64(max(d.Cost, 1))
	for i, r := range s.global {
		if !r.Matches(&desc) {
			continue
		}
		tag := rules.EntityTag(r, &desc) // inlined: the tag stays on the stack
		rd := iv.rules[i]
		h := sketch.Hash64(tag)
		rd.top.AddHash(h, tag, cost)
		rd.cms.Add(s.regionHash(h, ri), cost)
		rd.totals[ri] += cost
	}
}

// Merge folds in another partition's demand for the same interval.
func (iv *interval) Merge(o stage.Partial) error {
	x, ok := o.(*interval)
	if !ok || len(x.rules) != len(iv.rules) {
		return fmt.Errorf("aggregator: cannot merge a %T into an interval of %d rules", o, len(iv.rules))
	}
	for i, rd := range iv.rules {
		xr := x.rules[i]
		if len(xr.totals) != len(rd.totals) {
			return fmt.Errorf("aggregator: interval of %d regions cannot merge one of %d", len(rd.totals), len(xr.totals))
		}
		if err := rd.cms.Merge(xr.cms); err != nil {
			return err
		}
		rd.top.Merge(xr.top)
		for j := range rd.totals {
			rd.totals[j] += xr.totals[j]
		}
	}
	return nil
}

// MarshalBinary encodes the interval: per global rule, its top-k, its
// count-min (sparse, see appendSparse), then the number of regions and each
// region's total.
func (iv *interval) MarshalBinary() ([]byte, error) {
	b := binary.AppendUvarint(nil, uint64(len(iv.rules)))
	for _, rd := range iv.rules {
		top, err := rd.top.MarshalBinary()
		if err != nil {
			return nil, err
		}
		b = stage.AppendBytes(b, top)
		if b, err = appendSparse(b, rd.cms); err != nil {
			return nil, err
		}
		b = binary.AppendUvarint(b, uint64(len(rd.totals)))
		for _, t := range rd.totals {
			b = binary.AppendUvarint(b, t)
		}
	}
	return b, nil
}

// DecodePartial decodes what an interval's MarshalBinary wrote.
func (s *Shares) DecodePartial(b []byte) (stage.Partial, error) {
	r := stage.NewStateReader(b)
	iv := &interval{s: s}
	for range r.Count(3) {
		rd := &ruleDemand{top: new(sketch.TopK), cms: new(sketch.CountMin)}
		if err := rd.top.UnmarshalBinary(r.Bytes()); err != nil {
			return nil, fmt.Errorf("aggregator: interval top-k: %w", err)
		}
		if err := readSparse(r, rd.cms); err != nil {
			return nil, fmt.Errorf("aggregator: interval count-min: %w", err)
		}
		rd.totals = make([]uint64, r.Count(1))
		for j := range rd.totals {
			rd.totals[j] = r.Uvarint()
		}
		iv.rules = append(iv.rules, rd)
	}
	if err := r.Done(); err != nil {
		return nil, fmt.Errorf("aggregator: interval: %w", err)
	}
	return iv, nil
}

// countMinHeader is the length of sketch.CountMin's encoding before its
// counters (which are little-endian uint64s).
const countMinHeader = 24

// appendSparse appends cm's encoding with its counters sparse: the header of
// CountMin.MarshalBinary, then the number of non-zero counters and, for
// each, its index (as the gap from the previous one) and its value, in
// uvarints. An interval of 250 ms touches few of the 13 595 counters, so the
// partial is tens of KiB rather than 106 KiB; a full sketch whose counts
// are below 2^35 costs at most 6 bytes a counter, less than the dense 8.
func appendSparse(b []byte, cm *sketch.CountMin) ([]byte, error) {
	dense, err := cm.MarshalBinary()
	if err != nil {
		return nil, err
	}
	b = stage.AppendBytes(b, dense[:countMinHeader])
	cells := dense[countMinHeader:]
	n := 0
	for i := 0; i < len(cells); i += 8 {
		if binary.LittleEndian.Uint64(cells[i:]) != 0 {
			n++
		}
	}
	b = binary.AppendUvarint(b, uint64(n))
	last := -1
	for i := 0; i < len(cells); i += 8 {
		if v := binary.LittleEndian.Uint64(cells[i:]); v != 0 {
			b = binary.AppendUvarint(b, uint64(i/8-last))
			b = binary.AppendUvarint(b, v)
			last = i / 8
		}
	}
	return b, nil
}

// cmsWidth and cmsDepth are the dimensions NewCountMin gives cmsEpsilon and
// cmsDelta: ceil(e/epsilon) and ceil(ln(1/delta)).
var cmsWidth, cmsDepth = func() (int, int) {
	cm, _ := sketch.NewCountMin(cmsEpsilon, cmsDelta) // valid constants
	return cm.Width(), cm.Depth()
}()

// denseBufs recycles readSparse's dense encodings (106 KiB each), which
// CountMin.UnmarshalBinary copies from.
var denseBufs = sync.Pool{New: func() any { return new([]byte) }}

// readSparse decodes what appendSparse wrote into cm. The sketch must have
// the dimensions this stage builds (cmsEpsilon, cmsDelta): a corrupt header
// cannot make it allocate more.
func readSparse(r *stage.StateReader, cm *sketch.CountMin) error {
	head := r.Bytes()
	if len(head) != countMinHeader || binary.LittleEndian.Uint32(head[8:]) != uint32(cmsDepth) || binary.LittleEndian.Uint32(head[12:]) != uint32(cmsWidth) {
		return fmt.Errorf("a count-min header of %d bytes, not this stage's %dx%d", len(head), cmsWidth, cmsDepth)
	}
	cells := cmsWidth * cmsDepth
	buf := denseBufs.Get().(*[]byte)
	defer denseBufs.Put(buf)
	if cap(*buf) < countMinHeader+8*cells {
		*buf = make([]byte, countMinHeader+8*cells)
	}
	dense := (*buf)[:countMinHeader+8*cells]
	clear(dense)
	copy(dense, head)
	at := -1 // the previous counter's index
	for range r.Count(2) {
		gap := r.Uvarint()
		if gap == 0 || gap >= uint64(cells-at) {
			return fmt.Errorf("a counter index out of order or past the %d counters", cells)
		}
		at += int(gap)
		binary.LittleEndian.PutUint64(dense[countMinHeader+8*at:], r.Uvarint())
	}
	return cm.UnmarshalBinary(dense)
}

// Finish recomputes shares from an interval merged over every partition
// and returns the shares that changed, sorted by rule, key and region. An
// interval of another shape (not this stage's) produces nothing.
func (s *Shares) Finish(w stage.Window, merged stage.Partial) stage.Output {
	iv, ok := merged.(*interval)
	if !ok || len(iv.rules) != len(s.global) {
		return stage.Output{}
	}
	for _, rd := range iv.rules {
		if len(rd.totals) != len(s.o.Regions) {
			return stage.Output{}
		}
	}
	return stage.Output{Shares: s.closeInterval(w.End, iv)}
}

// MarshalState encodes the state kept across intervals: per key, its
// smoothed demand, its last written shares and when, its idle count and,
// per region, its intervals in a row without demand.
func (s *Shares) MarshalState() ([]byte, error) {
	b := binary.AppendUvarint(nil, uint64(len(s.demand)))
	for _, k := range slices.Sorted(maps.Keys(s.demand)) {
		b = stage.AppendString(b, k)
		b = appendFloats(b, s.demand[k])
		w := s.written[k]
		if w == nil {
			w = &written{}
		}
		b = appendFloats(b, w.f)
		b = binary.AppendVarint(b, w.at.UnixMilli())
		b = binary.AppendUvarint(b, uint64(s.idle[k]))
		sil := s.silent[k]
		b = binary.AppendUvarint(b, uint64(len(sil)))
		for _, n := range sil {
			b = binary.AppendUvarint(b, uint64(n))
		}
	}
	return b, nil
}

func appendFloats(b []byte, f []float64) []byte {
	b = binary.AppendUvarint(b, uint64(len(f)))
	for _, x := range f {
		b = stage.AppendFloat(b, x)
	}
	return b
}

func readFloats(r *stage.StateReader) []float64 {
	f := make([]float64, r.Count(8))
	for i := range f {
		f[i] = r.Float()
	}
	return f
}

// UnmarshalState restores what MarshalState wrote.
func (s *Shares) UnmarshalState(b []byte) error {
	r := stage.NewStateReader(b)
	demand, wr, idle, silent := map[string][]float64{}, map[string]*written{}, map[string]int{}, map[string][]int{}
	R := len(s.o.Regions)
	for range r.Count(5) {
		k := r.String()
		d, f := readFloats(r), readFloats(r)
		at := r.Varint()
		n := r.Uvarint()
		sil := make([]int, r.Count(1))
		for j := range sil {
			sil[j] = int(min(r.Uvarint(), uint64(s.o.Silent)))
		}
		if len(d) != R || len(f) != 0 && len(f) != R || len(sil) != R {
			return fmt.Errorf("aggregator: state for %d regions, this stage has %d", len(d), R)
		}
		for _, x := range d {
			if !(x >= 0) || math.IsInf(x, 0) {
				return fmt.Errorf("aggregator: state: key %q has demand %v", k, x)
			}
		}
		demand[k], idle[k], silent[k] = d, int(min(n, maxIdle+1)), sil
		if len(f) == R {
			wr[k] = &written{f: f, at: time.UnixMilli(at)}
		}
	}
	if err := r.Done(); err != nil {
		return fmt.Errorf("aggregator: state: %w", err)
	}
	s.demand, s.written, s.idle, s.silent = demand, wr, idle, silent
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
			for j := range d {
				d[j] = float64(rd.cms.Estimate(s.regionHash(h, j)))
			}
			now[r.ID+"|"+it.Key] = d
		}
		for k := range now {
			s.idle[k] = 0
		}
		// Keys heavy before but not now decay with zero demand, then retire.
		// Their demand is not measured (they are out of the top-k), so it is
		// not taken for silence.
		decaying := map[string]bool{}
		for k := range s.demand {
			if _, ok := now[k]; !ok && strings.HasPrefix(k, r.ID+"|") {
				if s.idle[k]++; s.idle[k] > maxIdle {
					delete(s.demand, k)
					delete(s.written, k)
					delete(s.idle, k)
					delete(s.silent, k)
					continue
				}
				now[k] = make([]float64, R)
				decaying[k] = true
			}
		}
		keys := make([]string, 0, len(now))
		for k := range now {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			sm, sil := s.demand[k], s.silent[k]
			if sil == nil {
				sil = make([]int, R)
				s.silent[k] = sil
			}
			if sm == nil {
				sm = now[k] // first sight: no history to smooth with
			} else {
				for j := range sm {
					sm[j] = s.o.Alpha*now[k][j] + (1-s.o.Alpha)*sm[j]
				}
			}
			for j, x := range now[k] {
				if decaying[k] {
					break
				}
				if x > 0 {
					sil[j] = 0
					continue
				}
				if sil[j] = min(sil[j]+1, s.o.Silent); sil[j] >= s.o.Silent {
					sm[j] = 0 // silent: down to the floor, the others reclaim the rest
				}
			}
			s.demand[k] = sm
			var shares []float64
			if k == r.ID+"|" && s.fixed != nil {
				shares = slices.Clone(s.fixed)
			} else {
				shares = s.split(sm)
			}
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

// split turns smoothed demand per region into shares: Floor each plus the
// rest in proportion to demand (1/R each when there is none). Their exact
// sum is 1; should floating-point rounding take the computed sum above 1,
// the largest share gives up the excess, so that the shares sum to at most 1
// (the property enforcers rely on to hold the global limit) and none drops
// below Floor.
func (s *Shares) split(d []float64) []float64 {
	R := float64(len(d))
	total := 0.0
	for _, x := range d {
		total += x
	}
	out := make([]float64, len(d))
	for j, x := range d {
		out[j] = 1 / R
		if total > 0 {
			out[j] = s.o.Floor + (1-R*s.o.Floor)*(x/total)
		}
	}
	for {
		sum, big := 0.0, 0
		for j, f := range out {
			sum += f
			if f > out[big] {
				big = j
			}
		}
		if sum <= 1 {
			return out
		}
		out[big] = math.Nextafter(out[big]-(sum-1), 0)
	}
}

func toFloat(v []uint64) []float64 {
	f := make([]float64, len(v))
	for i, x := range v {
		f[i] = float64(x)
	}
	return f
}
