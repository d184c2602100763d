package sketch

import (
	"bytes"
	"errors"
	"math"
	"testing"
	"time"
)

// TestHyperLogLogSeeds checks Distinct (axiomhq, p = 14) and HLL (p = 14),
// at 2 000 to 50 000 keys, against the exact cardinality over 1 000 seeds.
// Distinct: every estimate within three standard errors, 3*1.04/sqrt(m) (its
// sparse form is near exact up to about 12 000 keys). HLL, dense from the
// first key: a normal error exceeds 3 standard errors with probability
// 0.27%, so at most 1% of seeds may, none may exceed 4, and the root mean
// square error must be at most one standard error. -short runs 100 seeds.
func TestHyperLogLogSeeds(t *testing.T) {
	seeds := 1000
	if testing.Short() {
		seeds = 100
	}
	sizes := []int{2_000, 5_000, 20_000, 50_000}
	bound := 3 * 1.04 / math.Sqrt(1<<14)
	h := NewHLL(14)
	var worstD, worstH, sumSqD, sumSqH float64
	overH := 0
	for seed := range seeds {
		n := sizes[seed%len(sizes)]
		d := NewDistinct()
		h.Reset()
		for i := range n {
			// A bijection of (seed, i): distinct keys, well mixed, and cheap
			// under the race detector.
			x := mix64(uint64(seed+1)<<32 | uint64(i))
			d.InsertHash(x)
			h.InsertHash(x)
		}
		ed, eh := relErr(d.Estimate(), n), relErr(h.Estimate(), n)
		worstD, worstH = max(worstD, ed), max(worstH, eh)
		sumSqD += ed * ed
		sumSqH += eh * eh
		if ed > bound {
			t.Errorf("seed %d, n=%d: Distinct estimate %d, relative error %.4f above %.4f", seed, n, d.Estimate(), ed, bound)
		}
		if eh > bound {
			overH++
			t.Logf("seed %d, n=%d: HLL estimate %d, relative error %.4f above %.4f", seed, n, h.Estimate(), eh, bound)
		}
		if eh > bound*4/3 {
			t.Errorf("seed %d, n=%d: HLL estimate %d, relative error %.4f above 4 standard errors", seed, n, h.Estimate(), eh)
		}
	}
	if overH*100 > seeds {
		t.Errorf("HLL: %d of %d seeds beyond 3 standard errors, more than 1%%", overH, seeds)
	}
	if rms := math.Sqrt(sumSqH / float64(seeds)); rms > bound/3 {
		t.Errorf("HLL: rms relative error %.4f above the standard error %.4f", rms, bound/3)
	}
	t.Logf("%d seeds: Distinct worst %.4f rms %.4f; HLL worst %.4f rms %.4f; bound %.4f, standard error %.4f",
		seeds, worstD, math.Sqrt(sumSqD/float64(seeds)), worstH, math.Sqrt(sumSqH/float64(seeds)), bound, bound/3)
}

// TestHLLRange checks HLL from empty to beyond where plain HyperLogLog needs
// its range corrections, at two precisions.
func TestHLLRange(t *testing.T) {
	for _, p := range []int{10, 14} {
		s := NewHLL(p)
		if s.Estimate() != 0 {
			t.Fatalf("p=%d: empty estimate %d", p, s.Estimate())
		}
		bound := 3 * 1.04 / math.Sqrt(float64(uint64(1)<<p))
		next := 0
		for _, n := range []int{1, 10, 100, 1_000, 10_000, 100_000, 2_000_000} {
			for ; next < n; next++ {
				s.InsertHash(distinctKey(77, next))
				s.InsertHash(distinctKey(77, next/2)) // repeats do not count
			}
			est := s.Estimate()
			if e := relErr(est, n); e > max(bound, 1.5/float64(n)) {
				t.Errorf("p=%d n=%d: estimate %d, relative error %.4f above %.4f", p, n, est, e, bound)
			}
		}
	}
}

func TestHLLWeakHash(t *testing.T) {
	s := NewHLL(14)
	for i := range 50_000 {
		s.InsertHash(uint64(i))
	}
	if e := relErr(s.Estimate(), 50_000); e > 3*1.04/128 {
		t.Errorf("sequential integers: relative error %.4f", e)
	}
}

func TestHLLAllocs(t *testing.T) {
	s, o := NewHLL(14), NewHLL(14)
	i := 0
	if a := testing.AllocsPerRun(1000, func() { s.InsertHash(uint64(i)); i++ }); a != 0 {
		t.Errorf("InsertHash allocates %v", a)
	}
	if a := testing.AllocsPerRun(10, func() { _ = s.Estimate(); _ = s.Merge(o) }); a != 0 {
		t.Errorf("Estimate and Merge allocate %v", a)
	}
}

func TestHLLMergeAndCodec(t *testing.T) {
	whole, parts := NewHLL(12), []*HLL{NewHLL(12), NewHLL(12), NewHLL(12), NewHLL(12)}
	for i := range 50_000 {
		x := distinctKey(5, i)
		whole.InsertHash(x)
		parts[x%4].InsertHash(x)
	}
	m := NewHLL(12)
	for _, p := range parts {
		if err := m.Merge(p); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(m.regs, whole.regs) {
		t.Error("merge of 4 partitions differs from the whole stream's HLL")
	}
	if err := m.Merge(NewHLL(13)); !errors.Is(err, ErrIncompatible) {
		t.Errorf("merging precisions 12 and 13: err = %v", err)
	}
	b := mustMarshal(t, m)
	var got HLL
	if err := got.UnmarshalBinary(b); err != nil || !bytes.Equal(got.regs, m.regs) || got.p != 12 {
		t.Fatalf("round trip: %v", err)
	}
	bad := bytes.Clone(b)
	bad[hllHeaderSize+3] = 64
	for name, tc := range map[string]struct {
		b    []byte
		want error
	}{
		"short":     {b[:5], ErrCorrupt},
		"magic":     {append([]byte("XXXX"), b[4:]...), ErrCorrupt},
		"version":   {append([]byte("SKHL\x07"), b[5:]...), ErrIncompatible},
		"precision": {append([]byte("SKHL\x01\x03"), b[6:]...), ErrCorrupt},
		"truncated": {b[:len(b)-1], ErrCorrupt},
		"trailing":  {append(bytes.Clone(b), 0), ErrCorrupt},
		"register":  {bad, ErrCorrupt},
	} {
		if err := got.UnmarshalBinary(tc.b); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", name, err, tc.want)
		}
	}
	if got.p != 12 || !bytes.Equal(got.regs, m.regs) {
		t.Error("failed UnmarshalBinary changed the HLL")
	}
}

func FuzzHLLUnmarshal(f *testing.F) {
	s := NewHLL(4)
	f.Add(mustMarshal(f, s))
	s.InsertHash(1)
	s.InsertHash(99)
	f.Add(mustMarshal(f, s))
	f.Add([]byte("SKHL\x01\x04\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var s HLL
		if !decoded(t, s.UnmarshalBinary(b)) {
			return
		}
		sameEncoding(t, &s, b)
		s.InsertHash(uint64(len(b)))
		_ = s.Estimate()
	})
}

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func at(sec float64) time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }

// TestHLLRingWindow steps through synthetic event times: 3 intervals of 1 s.
func TestHLLRingWindow(t *testing.T) {
	r := NewHLLRing(12, 3, time.Second)
	keys := func(from, to int) {
		for i := from; i < to; i++ {
			if !r.InsertHash(at(float64(i)/1000), distinctKey(3, i)) {
				t.Fatalf("event %d refused", i)
			}
		}
	}
	bound := 3 * 1.04 / 64
	check := func(step string, want int) {
		t.Helper()
		if got := r.Estimate(); relErr(got, want) > bound {
			t.Errorf("%s: estimate %d, want %d", step, got, want)
		}
	}
	keys(0, 3000) // keys i in second i/1000: seconds 0, 1, 2
	check("3 s", 3000)
	keys(3000, 4000) // second 3: second 0 leaves
	check("after rotation", 3000)
	if r.InsertHash(at(0.5), 1) {
		t.Error("event older than the window accepted")
	}
	if !r.InsertHash(at(1.5), distinctKey(3, 999_999)) { // late but live
		t.Error("late event in a live interval refused")
	}
	check("late event", 3001)
	r.Advance(at(5.2)) // seconds 1-2 leave; 3 stays
	check("advance", 1000)
	r.Advance(at(100))
	if r.Estimate() != 0 {
		t.Errorf("empty ring estimates %d", r.Estimate())
	}
}

func TestHLLRingAllocs(t *testing.T) {
	r := NewHLLRing(14, 4, time.Second)
	i := 0
	if a := testing.AllocsPerRun(10_000, func() {
		r.InsertHash(at(float64(i)/100), uint64(i)) // a rotation every 100 inserts
		i++
	}); a != 0 {
		t.Errorf("InsertHash allocates %v", a)
	}
	if a := testing.AllocsPerRun(10, func() { _ = r.Estimate() }); a != 0 {
		t.Errorf("Estimate allocates %v", a)
	}
}

// TestHLLRingMergeAndCodec: rings fed 4 partitions of a stream, merged, equal
// the ring fed the whole stream register for register; they survive
// MarshalBinary.
func TestHLLRingMergeAndCodec(t *testing.T) {
	whole := NewHLLRing(10, 5, time.Minute)
	parts := []*HLLRing{NewHLLRing(10, 5, time.Minute), NewHLLRing(10, 5, time.Minute), NewHLLRing(10, 5, time.Minute), NewHLLRing(10, 5, time.Minute)}
	for i := range 40_000 {
		ts := at(float64(i) / 50) // 800 s: the window of 5 min moves
		x := distinctKey(8, i%9000)
		whole.InsertHash(ts, x)
		parts[x%4].InsertHash(ts, x)
	}
	m := NewHLLRing(10, 5, time.Minute)
	for _, p := range parts {
		b := mustMarshal(t, p)
		var q HLLRing
		if err := q.UnmarshalBinary(b); err != nil {
			t.Fatal(err)
		}
		if err := m.Merge(&q); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(mustMarshal(t, m), mustMarshal(t, whole)) {
		t.Error("merged partitions differ from the whole stream's ring")
	}
	if err := m.Merge(NewHLLRing(10, 4, time.Minute)); !errors.Is(err, ErrIncompatible) {
		t.Errorf("merging rings of 5 and 4 intervals: err = %v", err)
	}
}

func FuzzHLLRingUnmarshal(f *testing.F) {
	r := NewHLLRing(4, 2, time.Second)
	f.Add(mustMarshal(f, r))
	r.InsertHash(at(1), 5)
	f.Add(mustMarshal(f, r))
	f.Fuzz(func(t *testing.T, b []byte) {
		var r HLLRing
		if !decoded(t, r.UnmarshalBinary(b)) {
			return
		}
		sameEncoding(t, &r, b)
		r.InsertHash(at(3), 1)
		_ = r.Estimate()
		_ = r.Merge(&r)
	})
}
