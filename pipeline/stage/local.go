package stage

import (
	"fmt"
	"time"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/decision/decisionpb"
)

// Local runs stages in one goroutine without Kafka, through the same
// partition and merge cores as a Consumer and a Merger: records are
// spread over partitions, each partition's closed windows are encoded with
// MarshalBinary and decoded with DecodePartial, and windows finish once
// every partition's watermark has passed them. Tests, benchmarks and
// embedded callers use it; its output equals the Kafka pipeline's for the
// same records in the same per-partition order.
//
// The zero value is not usable: build one with NewLocal. Not safe for
// concurrent use.
type Local struct {
	parts  []*Partition
	merge  *Merge
	in     []int64
	errors int
	late   int
	bad    int
	offset int64
}

// NewLocal returns a Local with the given number of partitions (fewer than
// 1 count as 1) and lateness (a negative one counts as 0).
func NewLocal(stages []Stage, partitions int, lateness time.Duration) *Local {
	partitions, lateness = max(1, partitions), max(0, lateness)
	l := &Local{merge: NewMerge(stages, int32(partitions)), in: make([]int64, len(stages))}
	for range partitions {
		l.parts = append(l.parts, NewPartition(stages, lateness.Milliseconds(), (24*time.Hour).Milliseconds(), FreshCheckpoint))
	}
	return l
}

// Observe feeds d to partition p (modulo the number of partitions). A late
// record is counted (Late) and left out; so is one that Decode would refuse
// (nil, a bad version, outcome or event time, oversized fields), counted in
// Bad.
func (l *Local) Observe(p int, d *decisionpb.Decision) {
	if d == nil || decision.Check(d) != nil {
		l.bad++
		return
	}
	n := len(l.parts)
	s := l.parts[(p%n+n)%n]
	l.offset++
	if s.Observe(d, l.offset, 0, l.in) == LatePast {
		l.late++
	}
}

// Advance closes every partition's windows the watermark has passed, where
// each partition's watermark is at least wm (a punctuation), merges them
// and returns what finished windows produced. Partials that fail to encode,
// decode or merge are counted in Errors and left out.
func (l *Local) Advance(wm time.Time) Output {
	for i, s := range l.parts {
		s.Punctuate(wm.UnixMilli())
		for _, c := range s.Due() {
			body, err := c.Partial.MarshalBinary()
			if err != nil {
				l.errors++
				continue
			}
			r := PartialRecord{Kind: KindPartial, Source: int32(i), Stage: l.merge.stages[c.Stage].Name(), Start: c.Start, End: c.End, Body: body}
			l.merge.Add(&r, l.offset)
		}
		l.merge.Add(&PartialRecord{Kind: KindMarker, Source: int32(i), WM: s.Watermark()}, l.offset)
	}
	var out Output
	for _, f := range l.merge.Advance() {
		l.errors += len(f.Errs)
		out.Add(f.Out)
	}
	return out
}

// Late is the number of records left out as late, Bad the number refused,
// and Errors the number of partials left out.
func (l *Local) Late() int   { return l.late }
func (l *Local) Bad() int    { return l.bad }
func (l *Local) Errors() int { return l.errors }

// String describes the Local for test failures.
func (l *Local) String() string {
	return fmt.Sprintf("stage.Local{partitions: %d, late: %d, errors: %d}", len(l.parts), l.late, l.errors)
}
