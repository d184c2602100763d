package backoff

import (
	"math/rand/v2"
	"testing"
	"time"

	retry "github.com/cenkalti/backoff/v5"
)

// TestDecorrelatedBounds: over many seeded draws every sleep lies in
// [max(base, floor), min(cap, 3 × max(previous, base, floor))], and the draws
// fill that range rather than sitting at one end.
func TestDecorrelatedBounds(t *testing.T) {
	const base, cap = 100 * time.Millisecond, 20 * time.Second
	for _, floor := range []time.Duration{0, 50 * time.Millisecond, time.Second, 7 * time.Second, cap} {
		d := Decorrelated{Base: base, Cap: cap, Rand: rand.NewPCG(1, uint64(floor))}
		var firstLow, firstHigh, atCap int
		for run := range 2000 {
			d.Reset()
			prev := time.Duration(0)
			for step := range 10 {
				lo := max(base, floor)
				hi := min(cap, 3*max(prev, lo))
				s := d.NextAfter(floor)
				if s < lo || s > hi {
					t.Fatalf("floor %v, run %d, step %d: sleep %v outside [%v, %v] (previous %v)", floor, run, step, s, lo, hi, prev)
				}
				if step == 0 && hi > lo {
					// The first draw is uniform over [lo, 3·lo): each half gets about half.
					if s < lo+(min(cap, 3*lo)-lo)/2 {
						firstLow++
					} else {
						firstHigh++
					}
				}
				if s == cap {
					atCap++
				}
				prev = s
			}
		}
		if floor < cap && (firstLow < 900 || firstHigh < 900) {
			t.Errorf("floor %v: first draws %d in the lower half, %d in the upper: not uniform", floor, firstLow, firstHigh)
		}
		if atCap == 0 {
			t.Errorf("floor %v: no sleep reached the cap in 20 000 draws", floor)
		}
	}
}

// TestDecorrelatedNoHerd: a floor spreads sleeps over [floor, 3·floor), the
// whole point; a source that always draws 0 gives exactly the floor.
func TestDecorrelatedNoHerd(t *testing.T) {
	d := Decorrelated{Base: 100 * time.Millisecond, Cap: 20 * time.Second, Rand: rand.NewPCG(2, 2)}
	var lo, hi time.Duration = time.Hour, 0
	for range 1000 {
		d.Reset()
		s := d.NextAfter(time.Second)
		lo, hi = min(lo, s), max(hi, s)
	}
	if lo > 1050*time.Millisecond || hi < 2950*time.Millisecond {
		t.Errorf("1 000 first sleeps after Retry-After 1 s span [%v, %v], want about [1 s, 3 s)", lo, hi)
	}
	z := Decorrelated{Base: 100 * time.Millisecond, Cap: 20 * time.Second, Rand: zeroSource{}}
	if s := z.NextAfter(time.Second); s != time.Second {
		t.Errorf("zero source: %v, want the floor", s)
	}
}

// TestDecorrelatedStop: a floor above the cap is not waited for; the policy
// is a backoff.BackOff that Retry can use.
func TestDecorrelatedStop(t *testing.T) {
	d := Decorrelated{Base: time.Millisecond, Cap: time.Second}
	if s := d.NextAfter(time.Second + 1); s != retry.Stop {
		t.Errorf("floor above the cap: %v, want Stop", s)
	}
	if s := d.NextAfter(time.Second); s != time.Second {
		t.Errorf("floor at the cap: %v, want the cap", s)
	}
	var _ retry.BackOff = &d
	huge := Decorrelated{Base: time.Hour, Cap: maxDuration, Rand: rand.NewPCG(3, 3)}
	for range 100 {
		if s := huge.NextBackOff(); s < time.Hour || s > maxDuration {
			t.Fatalf("near the longest duration: %v", s)
		}
	}
}

// zeroSource always draws 0: every jittered sleep is its lower bound.
type zeroSource struct{}

func (zeroSource) Uint64() uint64 { return 0 }
