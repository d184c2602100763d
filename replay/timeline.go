package replay

import "time"

// DynamicSeries is the Timeline series that sums every dynamic rule's
// decisions: there may be thousands of dynamic rules, each short-lived.
const DynamicSeries = "(detector rules)"

// MaxBuckets bounds a Timeline's buckets per series.
const MaxBuckets = 600

// Timeline counts each rule's decisions (as RuleCounts) in event-time
// buckets of Step from Start, bucket i holding [Start+i·Step, Start+(i+1)·Step).
// It starts at one-second buckets; when an event falls past MaxBuckets of
// them, Step doubles and neighbouring buckets are added together, so a
// replay of any length keeps at most MaxBuckets buckets per rule, with the
// finest step that fits (one second for up to 10 minutes, 256 s for a
// day). An event before Start (the reorder horizon lets a few come
// slightly late) counts in the first bucket.
//
// Static rules have a series each, by id; all dynamic rules share
// DynamicSeries. The zero value is empty and ready to use; it is not safe for
// concurrent use.
type Timeline struct {
	Start time.Time
	Step  time.Duration
	// Series are the counts by rule id, each of the same length, Len().
	Series map[string][]RuleCounts
	n      int
}

// Len returns the number of buckets.
func (tl *Timeline) Len() int { return tl.n }

// At returns the start of bucket i.
func (tl *Timeline) At(i int) time.Time { return tl.Start.Add(time.Duration(i) * tl.Step) }

// bucket returns the counts of rule id at t, growing or coarsening the
// timeline as needed.
func (tl *Timeline) bucket(id string, t time.Time) *RuleCounts {
	if tl.Series == nil {
		tl.Series = map[string][]RuleCounts{}
		tl.Step = time.Second
		tl.Start = t.Truncate(tl.Step)
	}
	i := 0
	if t.After(tl.Start) {
		for {
			i = int(t.Sub(tl.Start) / tl.Step)
			if i < MaxBuckets {
				break
			}
			tl.coarsen()
		}
	}
	if i >= tl.n {
		tl.n = i + 1
		for k, s := range tl.Series {
			tl.Series[k] = grow(s, tl.n)
		}
	}
	s := tl.Series[id]
	if s == nil {
		s = make([]RuleCounts, tl.n, MaxBuckets)
		tl.Series[id] = s
	}
	return &s[i]
}

// coarsen doubles Step, adding bucket pairs together.
func (tl *Timeline) coarsen() {
	tl.Step *= 2
	n := (tl.n + 1) / 2
	for k, s := range tl.Series {
		for i := range n {
			c := s[2*i]
			if 2*i+1 < len(s) {
				c.add(s[2*i+1])
			}
			s[i] = c
		}
		tl.Series[k] = s[:n]
	}
	tl.n = n
}

func grow(s []RuleCounts, n int) []RuleCounts {
	for len(s) < n {
		s = append(s, RuleCounts{})
	}
	return s
}

func (c *RuleCounts) add(o RuleCounts) {
	c.Matched += o.Matched
	c.Allowed += o.Allowed
	c.Denied += o.Denied
	c.ShadowDenied += o.ShadowDenied
	c.Degraded += o.Degraded
}
