package sketch

import (
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/axiomhq/hyperloglog"
	"github.com/cespare/xxhash/v2"
)

// distinctBound is three standard errors of HyperLogLog at precision 14.
var distinctBound = 3 * 1.04 / math.Sqrt(1<<distinctPrecision)

// distinctKey returns the hash of the i-th distinct key of a seeded key set.
// Different seeds give unrelated key sets.
func distinctKey(seed uint64, i int) uint64 {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], seed)
	binary.LittleEndian.PutUint64(b[8:], uint64(i))
	return xxhash.Sum64(b[:])
}

func relErr(est uint64, n int) float64 {
	return math.Abs(float64(est)-float64(n)) / float64(n)
}

func TestDistinctAccuracy(t *testing.T) {
	for _, n := range []int{1_000, 100_000, 1_000_000} {
		for seed := range uint64(3) {
			d := NewDistinct()
			r := rand.New(rand.NewPCG(seed, 7))
			for i := range n {
				h := distinctKey(seed, i)
				d.InsertHash(h)
				if r.IntN(4) == 0 { // repeats must not count
					d.InsertHash(h)
				}
			}
			est := d.Estimate()
			e := relErr(est, n)
			t.Logf("n=%d seed=%d: estimate %d, relative error %.4f%%", n, seed, est, 100*e)
			if e > distinctBound {
				t.Errorf("n=%d seed=%d: estimate %d, relative error %.4f above %.4f", n, seed, est, e, distinctBound)
			}
		}
	}
}

func TestDistinctMerge(t *testing.T) {
	for _, n := range []int{1_000, 100_000, 1_000_000} {
		whole := NewDistinct()
		parts := []*Distinct{NewDistinct(), NewDistinct(), NewDistinct(), new(Distinct)} // the zero value works too
		for i := range n {
			h := distinctKey(42, i)
			whole.InsertHash(h)
			parts[i%4].InsertHash(h)
			parts[(i+1)%4].InsertHash(h) // overlapping parts: each key is in two
		}
		merged := new(Distinct)
		for _, p := range parts {
			if err := merged.Merge(p); err != nil {
				t.Fatal(err)
			}
		}
		w, m := whole.Estimate(), merged.Estimate()
		t.Logf("n=%d: whole %d merged %d", n, w, m)
		if e := relErr(m, n); e > distinctBound {
			t.Errorf("n=%d: merged estimate %d, relative error %.4f above %.4f", n, m, e, distinctBound)
		}
		// HyperLogLog merging is lossless: the union sketch holds the same
		// registers as the whole-stream sketch, so the estimates agree up to
		// the sparse/dense representation they ended in.
		if d := math.Abs(float64(w)-float64(m)) / float64(w); d > 0.001 {
			t.Errorf("n=%d: merged %d differs from whole %d by %.4f%%", n, m, w, 100*d)
		}
	}
}

// TestDistinctEstimateCache checks that every mutation invalidates the cached
// estimate.
func TestDistinctEstimateCache(t *testing.T) {
	d := NewDistinct()
	for i := range 200 {
		d.InsertHash(distinctKey(6, i))
		if got := d.Estimate(); got != uint64(i+1) { // sparse: exact at this size
			t.Fatalf("after %d inserts Estimate = %d", i+1, got)
		}
	}
	o := NewDistinct()
	for i := range 100 {
		o.InsertHash(distinctKey(7, i))
	}
	if err := d.Merge(o); err != nil {
		t.Fatal(err)
	}
	if got := d.Estimate(); got != 300 {
		t.Errorf("after merge Estimate = %d, want 300", got)
	}
	b, _ := o.MarshalBinary()
	if err := d.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	if got := d.Estimate(); got != 100 {
		t.Errorf("after UnmarshalBinary Estimate = %d, want 100", got)
	}
	for i := range 50_000 { // past the sparse limit: dense
		d.InsertHash(distinctKey(8, i))
	}
	if e := relErr(d.Estimate(), 50_100); e > distinctBound {
		t.Errorf("dense Estimate %d, relative error %.4f", d.Estimate(), e)
	}
}

func TestDistinctMergeSelfAndEmpty(t *testing.T) {
	d := NewDistinct()
	for i := range 500 {
		d.InsertHash(distinctKey(1, i))
	}
	before := d.Estimate()
	if err := d.Merge(d); err != nil {
		t.Fatal(err)
	}
	if err := d.Merge(new(Distinct)); err != nil {
		t.Fatal(err)
	}
	if err := d.Merge(nil); err != nil {
		t.Fatal(err)
	}
	if got := d.Estimate(); got != before {
		t.Errorf("Estimate after self/empty merge = %d, want %d", got, before)
	}
	var z Distinct
	if z.Estimate() != 0 {
		t.Errorf("zero Estimate = %d, want 0", z.Estimate())
	}
}

func TestDistinctMarshal(t *testing.T) {
	for _, n := range []int{0, 100, 200_000} { // empty, sparse, dense
		d := NewDistinct()
		for i := range n {
			d.InsertHash(distinctKey(9, i))
		}
		b, err := d.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		var e Distinct
		if err := e.UnmarshalBinary(b); err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		if got, want := e.Estimate(), d.Estimate(); got != want {
			t.Errorf("n=%d: decoded Estimate %d, want %d", n, got, want)
		}
		if err := e.Merge(d); err != nil {
			t.Fatal(err)
		}
	}
	var z Distinct
	b, err := z.MarshalBinary()
	if err != nil {
		t.Fatalf("zero MarshalBinary: %v", err)
	}
	if err := new(Distinct).UnmarshalBinary(b); err != nil {
		t.Fatalf("decode zero encoding: %v", err)
	}
}

func TestDistinctUnmarshalErrors(t *testing.T) {
	other := hyperloglog.New16()
	other.InsertHash(1)
	p16, _ := other.MarshalBinary()
	d := NewDistinct()
	for i := range 100 {
		d.InsertHash(distinctKey(3, i))
	}
	good, _ := d.MarshalBinary()
	badVersion := append([]byte{9}, good[1:]...)
	for _, tc := range []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, ErrCorrupt},
		{"precision 16", p16, ErrIncompatible},
		{"unknown version", badVersion, ErrIncompatible},
		{"truncated", good[:len(good)-1], ErrCorrupt},
		{"trailing", append(good[:len(good):len(good)], 0), ErrCorrupt},
		{"header only", good[:8], ErrCorrupt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := NewDistinct()
			e.InsertHash(1)
			err := e.UnmarshalBinary(tc.b)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if e.Estimate() != 1 {
				t.Error("failed UnmarshalBinary changed the counter")
			}
		})
	}
}

// TestDistinctConcurrent runs inserts, estimates, merges and encodes from
// several goroutines; run it with -race.
func TestDistinctConcurrent(t *testing.T) {
	a, b := NewDistinct(), NewDistinct()
	const per = 20_000
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			d, o := a, b
			if g%2 == 1 {
				d, o = b, a
			}
			for i := range per {
				d.InsertHash(distinctKey(uint64(g), i))
				if i%2000 == 0 {
					_ = d.Estimate()
					if err := d.Merge(o); err != nil { // a.Merge(b) and b.Merge(a) at once
						t.Error(err)
					}
					if _, err := d.MarshalBinary(); err != nil {
						t.Error(err)
					}
				}
			}
		})
	}
	wg.Wait()
	if err := a.Merge(b); err != nil {
		t.Fatal(err)
	}
	if e := relErr(a.Estimate(), 4*per); e > distinctBound {
		t.Errorf("estimate %d after concurrent use, relative error %.4f", a.Estimate(), e)
	}
}

func FuzzDistinctUnmarshal(f *testing.F) {
	for _, n := range []int{0, 3, 300, 50_000} {
		d := NewDistinct()
		for i := range n {
			d.InsertHash(distinctKey(5, i))
		}
		f.Add(mustMarshal(f, d))
	}
	f.Add([]byte{2, 14, 0, 1, 0, 0, 0, 0})
	f.Add([]byte{1, 14, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		var d Distinct
		if !decoded(t, d.UnmarshalBinary(b)) {
			return
		}
		// Whatever decodes must stay usable and round-trip its estimate.
		est := d.Estimate()
		out, err := d.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		var e Distinct
		if err := e.UnmarshalBinary(out); err != nil {
			t.Fatalf("re-decoding own encoding: %v", err)
		}
		if got := e.Estimate(); got != est {
			t.Fatalf("round-trip Estimate %d, want %d", got, est)
		}
		d.InsertHash(Hash64(string(b)))
		if err := d.Merge(&e); err != nil {
			t.Fatal(err)
		}
		_ = d.Estimate()
	})
}

func BenchmarkDistinctInsertHash(b *testing.B) {
	hs := make([]uint64, 1<<16)
	for i := range hs {
		hs[i] = distinctKey(11, i)
	}
	b.Run("serial", func(b *testing.B) {
		d := NewDistinct()
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			d.InsertHash(hs[i&(len(hs)-1)])
			i++
		}
	})
	b.Run("parallel", func(b *testing.B) {
		d := NewDistinct()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				d.InsertHash(hs[i&(len(hs)-1)])
				i++
			}
		})
	})
}

func BenchmarkDistinctEstimate(b *testing.B) {
	d := NewDistinct()
	for i := range 1 << 20 {
		d.InsertHash(distinctKey(12, i))
	}
	b.ReportAllocs()
	i := 1 << 20
	for b.Loop() {
		d.InsertHash(distinctKey(12, i)) // defeat the cache: measure a full estimate
		_ = d.Estimate()
		i++
	}
}
