package pipeline

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
	parts  []*partState
	merge  *mergeState
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
	l := &Local{merge: newMergeState(stages, int32(partitions)), in: make([]int64, len(stages))}
	for range partitions {
		l.parts = append(l.parts, newPartState(stages, lateness.Milliseconds(), (24*time.Hour).Milliseconds(), freshCheckpoint))
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
	if s.observe(d, l.offset, 0, l.in) == latePast {
		l.late++
	}
}

// Advance closes every partition's windows the watermark has passed, where
// each partition's watermark is at least wm (a punctuation), merges them
// and returns what finished windows produced. Partials that fail to encode,
// decode or merge are counted in Errors and left out.
func (l *Local) Advance(wm time.Time) Output {
	for i, s := range l.parts {
		s.punctuate(wm.UnixMilli())
		for _, c := range s.due() {
			body, err := c.p.MarshalBinary()
			if err != nil {
				l.errors++
				continue
			}
			r := partialRecord{kind: kindPartial, source: int32(i), stage: l.merge.stages[c.stage].Name(), start: c.start, end: c.end, body: body}
			l.merge.add(&r, l.offset)
		}
		l.merge.add(&partialRecord{kind: kindMarker, source: int32(i), wm: s.watermark()}, l.offset)
	}
	var out Output
	for _, f := range l.merge.advance() {
		l.errors += len(f.errs)
		out.add(f.out)
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
	return fmt.Sprintf("pipeline.Local{partitions: %d, late: %d, errors: %d}", len(l.parts), l.late, l.errors)
}
