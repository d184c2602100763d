package sketch

import (
	"math"
	"math/rand/v2"
	"testing"
)

// spreadStream returns (key, item) pairs: a few keys with large spreads
// (a botnet's JA4 with 50 000 addresses, an ASN with 5 000), many keys with
// small ones, and repeats of pairs already seen. true maps a key to its
// exact number of distinct items.
func spreadStream(seed uint64) (pairs [][2]uint64, truth map[uint64]int) {
	r := rand.New(rand.NewPCG(seed, 11))
	truth = map[uint64]int{}
	add := func(key uint64, n int) {
		for i := range n {
			item := Hash64(string(rune(key)) + "/" + string(rune(i)))
			item ^= uint64(i) * 0x9e3779b97f4a7c15
			pairs = append(pairs, [2]uint64{key, item})
			if r.IntN(4) == 0 { // seen again: no new item
				pairs = append(pairs, [2]uint64{key, item})
			}
		}
		truth[key] += n
	}
	add(Hash64("ja4-botnet"), 50_000)
	add(Hash64("asn-64500"), 5_000)
	add(Hash64("asn-64501"), 1_000)
	for k := range 3_000 {
		add(Hash64("small-"+string(rune(k))), 1+r.IntN(10))
	}
	r.Shuffle(len(pairs), func(i, j int) { pairs[i], pairs[j] = pairs[j], pairs[i] })
	return pairs, truth
}

// Heavy keys are estimated within the HyperLogLog's 3-sigma error plus the
// count-min allowance epsilon*N; no key is estimated far below its spread;
// and small keys stay small, so a botnet stands out from ordinary keys.
func TestSpreadAccuracy(t *testing.T) {
	const eps, delta, p = 0.01, 0.01, 8
	for seed := range uint64(5) {
		pairs, truth := spreadStream(seed)
		s, err := NewSpread(eps, delta, p)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range pairs {
			s.Add(x[0], x[1])
		}
		n := 0
		for _, v := range truth {
			n += v
		}
		sigma := 1.04 / math.Sqrt(1<<p)
		over := 0
		for key, v := range truth {
			est := float64(s.Estimate(key))
			if est < float64(v)*(1-3*sigma) {
				t.Fatalf("seed %d: spread %d estimated %.0f, below the 3-sigma bound", seed, v, est)
			}
			if est > float64(v)*(1+3*sigma)+eps*float64(n) {
				over++
			}
			if v >= 1000 && math.Abs(est-float64(v)) > 3*sigma*float64(v)+eps*float64(n) {
				t.Fatalf("seed %d: heavy key of spread %d estimated %.0f", seed, v, est)
			}
		}
		if frac := float64(over) / float64(len(truth)); frac > delta {
			t.Errorf("seed %d: %.3f of keys over the bound, want at most delta %v", seed, frac, delta)
		}
		if small := s.Estimate(Hash64("not-seen")); small > uint64(eps*float64(n)) {
			t.Errorf("seed %d: an unseen key estimated %d", seed, small)
		}
	}
}

// Sketches of 4 parts of a stream merge into exactly the sketch of the
// whole stream.
func TestSpreadMergeEqualsWhole(t *testing.T) {
	pairs, _ := spreadStream(9)
	whole, _ := NewSpread(0.01, 0.01, 6)
	parts := make([]*Spread, 4)
	for i := range parts {
		parts[i], _ = NewSpread(0.01, 0.01, 6)
	}
	for i, x := range pairs {
		whole.Add(x[0], x[1])
		parts[i%4].Add(x[0], x[1])
	}
	merged, _ := NewSpread(0.01, 0.01, 6)
	for _, p := range parts {
		if err := merged.Merge(p); err != nil {
			t.Fatal(err)
		}
	}
	sameEncoding(t, merged, mustMarshal(t, whole))
	other, _ := NewSpread(0.01, 0.01, 7)
	if err := merged.Merge(other); err == nil {
		t.Fatal("merged sketches of different precisions")
	}
}

func TestSpreadAllocs(t *testing.T) {
	s, _ := NewSpread(0.01, 0.01, 6)
	if n := testing.AllocsPerRun(1000, func() { s.Add(1, 2); _ = s.Estimate(1) }); n != 0 {
		t.Fatalf("%v allocations per Add and Estimate", n)
	}
}

func TestNewSpreadRejects(t *testing.T) {
	for _, c := range []struct {
		eps, delta float64
		p          int
	}{{0, 0.1, 6}, {1, 0.1, 6}, {0.1, 0, 6}, {0.1, 1, 6}, {0.1, 0.1, 3}, {0.1, 0.1, 13}, {1e-9, 0.01, 12}, {math.NaN(), 0.1, 6}} {
		if _, err := NewSpread(c.eps, c.delta, c.p); err == nil {
			t.Errorf("NewSpread(%v, %v, %d) accepted", c.eps, c.delta, c.p)
		}
	}
}

func FuzzSpreadUnmarshal(f *testing.F) {
	s, _ := NewSpread(0.5, 0.5, 4)
	f.Add(mustMarshal(f, s))
	s.Add(1, 2)
	f.Add(mustMarshal(f, s))
	f.Fuzz(func(t *testing.T, b []byte) {
		var s Spread
		if !decoded(t, s.UnmarshalBinary(b)) {
			return
		}
		sameEncoding(t, &s, b)
		s.Add(3, 4)
		if s.Estimate(3) == 0 {
			t.Fatal("Estimate 0 after Add")
		}
	})
}

func BenchmarkSpreadAdd(b *testing.B) {
	s, _ := NewSpread(0.01, 0.01, 6)
	b.ReportAllocs()
	for i := range b.N {
		s.Add(uint64(i&1023), uint64(i))
	}
}
