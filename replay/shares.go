package replay

import (
	"strings"
	"time"

	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/sketch"
)

// MaxSharePoints bounds the points of a ShareSeries per region.
const MaxSharePoints = 500

// MaxShareSeries bounds how many rule|key pairs have a ShareSeries besides
// the global rules' default splits: the ones with the most shares written
// (Space-Saving over the shares written, sketch.TopK).
const MaxShareSeries = 32

// SharePoint is one share of a region at the event time its aggregator
// computed it.
type SharePoint struct {
	At       time.Time
	Fraction float64 // of the global limit, in [0, 1]
}

// ShareSeries is one rule|key's shares over event time, per region, for the
// charts of the HTML page: a fixed-size summary of every share written.
// Points holds, by region name, the shares that changed the region's
// fraction, in order, at most MaxSharePoints of them: when full, every
// other point is dropped, so a day keeps its shape at a coarser grain. Last
// is the newest share of each region, changed or not (a chart's line runs
// to it). Written counts the shares written for the pair, every region.
//
// The zero value is empty; Report.ShareSeries fills it, and it is not safe
// for concurrent use.
type ShareSeries struct {
	Points  map[string][]SharePoint
	Last    map[string]SharePoint
	Written int
}

func (s *ShareSeries) add(sh rules.Share) {
	if s.Points == nil {
		s.Points, s.Last = map[string][]SharePoint{}, map[string]SharePoint{}
	}
	s.Written++
	p := SharePoint{At: sh.ComputedAt, Fraction: sh.Fraction}
	s.Last[sh.Region] = p
	ps := s.Points[sh.Region]
	if n := len(ps); n > 0 && ps[n-1].Fraction == p.Fraction {
		return
	}
	if len(ps) == MaxSharePoints {
		for i := range MaxSharePoints / 2 {
			ps[i] = ps[2*i]
		}
		ps = ps[:MaxSharePoints/2]
	}
	s.Points[sh.Region] = append(ps, p)
}

// shareSeries keeps the ShareSeries of the default splits and of the
// busiest rule|key pairs.
type shareSeries struct {
	busy   *sketch.TopK
	series map[string]*ShareSeries // by "rule|key"
}

func (ss *shareSeries) add(sh rules.Share) {
	if ss.series == nil {
		ss.busy = sketch.NewTopK(MaxShareSeries)
		ss.series = map[string]*ShareSeries{}
	}
	k := sh.RuleID + "|" + sh.Key
	if sh.Key != "" { // a default split is always kept
		h := sketch.Hash64(k)
		ss.busy.AddHash(h, k, 1)
		if !ss.busy.Tracked(h, k) {
			return
		}
	}
	s := ss.series[k]
	if s == nil {
		if len(ss.series) >= 4*MaxShareSeries {
			ss.prune()
		}
		s = &ShareSeries{}
		ss.series[k] = s
	}
	s.add(sh)
}

// prune drops the series of keys the top-k no longer tracks.
func (ss *shareSeries) prune() {
	for k := range ss.series {
		if _, key, _ := strings.Cut(k, "|"); key != "" && !ss.busy.Tracked(sketch.Hash64(k), k) {
			delete(ss.series, k)
		}
	}
}
