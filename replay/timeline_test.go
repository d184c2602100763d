package replay

import (
	"testing"
	"time"
)

// TestTimeline: events land in the bucket of their event time; past
// MaxBuckets the step doubles and pairs of buckets are added together, and
// nothing is lost on the way.
func TestTimeline(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name     string
		offsets  []time.Duration // of each event from t0, rule "a"
		step     time.Duration
		buckets  int
		wantHits map[int]int // bucket -> Matched
	}{
		{"one second buckets", []time.Duration{0, 300 * time.Millisecond, time.Second, 5 * time.Second}, time.Second, 6,
			map[int]int{0: 2, 1: 1, 5: 1}},
		{"early event in the first bucket", []time.Duration{2 * time.Second, -3 * time.Second}, time.Second, 1,
			map[int]int{0: 2}},
		{"last fine bucket", []time.Duration{0, (MaxBuckets - 1) * time.Second}, time.Second, MaxBuckets,
			map[int]int{0: 1, MaxBuckets - 1: 1}},
		{"one past: doubled", []time.Duration{0, time.Second, MaxBuckets * time.Second}, 2 * time.Second, MaxBuckets/2 + 1,
			map[int]int{0: 2, MaxBuckets / 2: 1}},
		{"a day", []time.Duration{0, 24 * time.Hour}, 256 * time.Second, 338,
			map[int]int{0: 1, 337: 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var tl Timeline
			for _, d := range c.offsets {
				tl.bucket("a", t0.Add(d)).Matched++
			}
			start := t0.Add(c.offsets[0]) // the first event's second
			tl.bucket("b", start)         // a second series stays as long as the first
			if tl.Step != c.step || tl.Len() != c.buckets || !tl.Start.Equal(start) {
				t.Fatalf("step %v, %d buckets from %v; want %v, %d from %v", tl.Step, tl.Len(), tl.Start, c.step, c.buckets, start)
			}
			total := 0
			for i, rc := range tl.Series["a"] {
				total += rc.Matched
				if rc.Matched != c.wantHits[i] {
					t.Errorf("bucket %d (%v): %d, want %d", i, tl.At(i), rc.Matched, c.wantHits[i])
				}
			}
			if total != len(c.offsets) || len(tl.Series["b"]) != tl.Len() {
				t.Errorf("%d events counted of %d; series b has %d buckets of %d", total, len(c.offsets), len(tl.Series["b"]), tl.Len())
			}
		})
	}
}
