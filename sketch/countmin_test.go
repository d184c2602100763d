package sketch

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"testing"
)

func TestNewCountMinDimensions(t *testing.T) {
	for _, tc := range []struct {
		eps, delta   float64
		width, depth int
	}{
		{0.01, 0.01, 272, 5},      // e/0.01 = 271.8, ln 100 = 4.6
		{0.001, 0.01, 2719, 5},    // e/0.001 = 2718.3
		{0.5, 0.5, 6, 1},          // e/0.5 = 5.4, ln 2 = 0.69
		{0.1, 0.001, 28, 7},       // ln 1000 = 6.9
		{0.9, 0.999999, 4, 1},     // ln(1/delta) ~ 1e-6 still needs one row
		{0.0001, 1e-6, 27183, 14}, // ln 1e6 = 13.8
	} {
		c, err := NewCountMin(tc.eps, tc.delta)
		if err != nil {
			t.Fatalf("NewCountMin(%v, %v): %v", tc.eps, tc.delta, err)
		}
		if c.Width() != tc.width || c.Depth() != tc.depth {
			t.Errorf("NewCountMin(%v, %v) = %dx%d, want %dx%d", tc.eps, tc.delta, c.Width(), c.Depth(), tc.width, tc.depth)
		}
	}
}

func TestNewCountMinInvalid(t *testing.T) {
	for _, tc := range []struct{ eps, delta float64 }{
		{0, 0.01}, {1, 0.01}, {-0.1, 0.01}, {math.NaN(), 0.01}, {math.Inf(1), 0.01},
		{0.01, 0}, {0.01, 1}, {0.01, 2}, {0.01, math.NaN()},
		{1e-9, 0.01}, // 2.7e9 x 5 counters: over the size limit
	} {
		if c, err := NewCountMin(tc.eps, tc.delta); err == nil {
			t.Errorf("NewCountMin(%v, %v) = %dx%d, want an error", tc.eps, tc.delta, c.Width(), c.Depth())
		}
	}
}

func TestCountMinSmall(t *testing.T) {
	c, err := NewCountMin(0.01, 0.01)
	if err != nil {
		t.Fatal(err)
	}
	a, b := Hash64("a"), Hash64("b")
	if got := c.Estimate(a); got != 0 {
		t.Fatalf("empty Estimate = %d, want 0", got)
	}
	for range 5 {
		c.Add(a, 1)
	}
	c.Add(b, 7)
	if got := c.Estimate(a); got != 5 {
		t.Errorf("Estimate(a) = %d, want 5", got)
	}
	if got := c.Estimate(b); got != 7 {
		t.Errorf("Estimate(b) = %d, want 7", got)
	}
	if got := c.Total(); got != 12 {
		t.Errorf("Total = %d, want 12", got)
	}
	c.Reset()
	if c.Estimate(a) != 0 || c.Estimate(b) != 0 || c.Total() != 0 {
		t.Errorf("after Reset: Estimate(a)=%d Estimate(b)=%d Total=%d, want 0", c.Estimate(a), c.Estimate(b), c.Total())
	}
}

func TestCountMinSaturates(t *testing.T) {
	c, _ := NewCountMin(0.1, 0.1)
	h := Hash64("x")
	c.Add(h, math.MaxUint64-1)
	c.Add(h, 5)
	if got := c.Estimate(h); got != math.MaxUint64 {
		t.Errorf("Estimate after overflow = %d, want MaxUint64", got)
	}
	if got := c.Total(); got != math.MaxUint64 {
		t.Errorf("Total after overflow = %d, want MaxUint64", got)
	}
}

func TestCountMinZeroValue(t *testing.T) {
	var c CountMin
	if got := c.Estimate(1); got != 0 {
		t.Errorf("zero Estimate = %d, want 0", got)
	}
	if _, err := c.MarshalBinary(); err == nil {
		t.Error("zero MarshalBinary: want an error")
	}
	defer func() {
		if recover() == nil {
			t.Error("zero Add did not panic")
		}
	}()
	c.Add(1, 1)
}

// checkCountMin checks the count-min guarantees of c against the exact counts:
// no estimate is below the true count, and the fraction of keys whose estimate
// exceeds true + eps*N is at most delta.
//
// The bound is a probability over the choice of hash functions; here the hash
// is fixed and the fraction is taken over keys instead, so it fluctuates around
// its expectation. We allow delta plus three binomial standard deviations over
// the number of keys, sqrt(delta(1-delta)/keys). The rows also come from one
// hash by double hashing rather than from independent pairwise-independent
// functions, which Kirsch & Mitzenmacher show costs nothing asymptotically;
// the slack covers the rest. With conservative update the observed fraction is
// normally far below delta.
func checkCountMin(t *testing.T, c *CountMin, hashes []uint64, exact []uint64, eps, delta float64) {
	t.Helper()
	var n uint64
	for _, v := range exact {
		n += v
	}
	if c.Total() != n {
		t.Errorf("Total = %d, want %d", c.Total(), n)
	}
	limit := eps * float64(n)
	over := 0
	for i, h := range hashes {
		est := c.Estimate(h)
		if est < exact[i] {
			t.Fatalf("key %d: Estimate %d below true count %d", i, est, exact[i])
		}
		if float64(est-exact[i]) > limit {
			over++
		}
	}
	frac := float64(over) / float64(len(hashes))
	slack := 3 * math.Sqrt(delta*(1-delta)/float64(len(hashes)))
	t.Logf("%dx%d: %d of %d keys (%.4f%%) exceed true+%.0f, bound %.4f%%", c.Width(), c.Depth(), over, len(hashes), 100*frac, limit, 100*(delta+slack))
	if frac > delta+slack {
		t.Errorf("%.4f of keys exceed true+eps*N, want at most delta=%v (+%.4f slack)", frac, delta, slack)
	}
}

func TestCountMinAccuracy(t *testing.T) {
	stream, exact := stdStream()
	hashes := keyHashes()
	for _, tc := range []struct{ eps, delta float64 }{
		{0.001, 0.01},
		{0.0001, 0.05}, // 27183 wide: tight absolute bound of 100
		{0.01, 0.2},    // narrow and shallow: 272x2
	} {
		c, err := NewCountMin(tc.eps, tc.delta)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range stream {
			c.Add(hashes[k], 1)
		}
		checkCountMin(t, c, hashes, exact, tc.eps, tc.delta)
	}
}

// TestCountMinWeakHash feeds small sequential integers as "hashes": the row
// mixer must still spread them over the rows.
func TestCountMinWeakHash(t *testing.T) {
	stream, exact := stdStream()
	hashes := make([]uint64, zipfKeys)
	for i := range hashes {
		hashes[i] = uint64(i)
	}
	c, _ := NewCountMin(0.001, 0.01)
	for _, k := range stream {
		c.Add(uint64(k), 1)
	}
	checkCountMin(t, c, hashes, exact, 0.001, 0.01)
}

// TestCountMinRowSpread checks the first row on its own: with depth 1 the
// estimate of a key is the load of its cell, so feeding 100k sequential
// integers once each must load the 2719 cells about evenly (mean 36.8; the
// largest of 2719 Poisson(36.8) loads is about 60).
func TestCountMinRowSpread(t *testing.T) {
	c, _ := NewCountMin(0.001, 0.5) // 2719x1
	if c.Depth() != 1 {
		t.Fatalf("depth %d, want 1", c.Depth())
	}
	const n = 100_000
	for h := range uint64(n) {
		c.Add(h, 1)
	}
	var worst uint64
	for h := range uint64(n) {
		worst = max(worst, c.Estimate(h))
	}
	if worst > 90 {
		t.Errorf("fullest cell holds %d of %d sequential keys, want about 60: the row hash does not spread", worst, n)
	}
}

func TestCountMinWeighted(t *testing.T) {
	stream, _ := stdStream()
	hashes := keyHashes()
	exact := make([]uint64, zipfKeys)
	c, _ := NewCountMin(0.001, 0.01)
	for i, k := range stream[:200_000] {
		n := uint64(i%7 + 1)
		exact[k] += n
		c.Add(hashes[k], n)
	}
	checkCountMin(t, c, hashes, exact, 0.001, 0.01)
}

func TestCountMinMerge(t *testing.T) {
	stream, exact := stdStream()
	hashes := keyHashes()
	const eps, delta = 0.001, 0.01
	parts := make([]*CountMin, 4)
	for i := range parts {
		parts[i], _ = NewCountMin(eps, delta)
	}
	for i, k := range stream {
		parts[i%4].Add(hashes[k], 1)
	}
	merged, _ := NewCountMin(eps, delta)
	for _, p := range parts {
		if err := merged.Merge(p); err != nil {
			t.Fatal(err)
		}
	}
	checkCountMin(t, merged, hashes, exact, eps, delta)

	other, _ := NewCountMin(0.01, delta)
	before := merged.Estimate(hashes[0])
	err := merged.Merge(other)
	if !errors.Is(err, ErrIncompatible) {
		t.Errorf("Merge of %dx%d into %dx%d: err = %v, want ErrIncompatible", other.Width(), other.Depth(), merged.Width(), merged.Depth(), err)
	}
	if merged.Estimate(hashes[0]) != before || merged.Total() != zipfUpdates {
		t.Error("failed Merge changed the sketch")
	}
}

func TestCountMinSelfMerge(t *testing.T) {
	c, _ := NewCountMin(0.01, 0.01)
	h := Hash64("k")
	c.Add(h, 3)
	if err := c.Merge(c); err != nil {
		t.Fatal(err)
	}
	if c.Estimate(h) != 6 || c.Total() != 6 {
		t.Errorf("self-merge: Estimate=%d Total=%d, want 6 and 6", c.Estimate(h), c.Total())
	}
}

func TestCountMinAddAllocs(t *testing.T) {
	c, _ := NewCountMin(0.001, 0.01)
	h := Hash64("k")
	if a := testing.AllocsPerRun(1000, func() { c.Add(h, 1); _ = c.Estimate(h) }); a != 0 {
		t.Errorf("Add+Estimate allocate %v times, want 0", a)
	}
}

func TestCountMinMarshalRoundTrip(t *testing.T) {
	stream, _ := stdStream()
	hashes := keyHashes()
	c, _ := NewCountMin(0.01, 0.01)
	for _, k := range stream[:100_000] {
		c.Add(hashes[k], 1)
	}
	b, err := c.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if want := 24 + 8*c.Width()*c.Depth(); len(b) != want {
		t.Errorf("encoding is %d bytes, want %d", len(b), want)
	}
	var d CountMin
	if err := d.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	if d.Width() != c.Width() || d.Depth() != c.Depth() || d.Total() != c.Total() {
		t.Fatalf("decoded %dx%d total %d, want %dx%d total %d", d.Width(), d.Depth(), d.Total(), c.Width(), c.Depth(), c.Total())
	}
	for _, h := range hashes {
		if d.Estimate(h) != c.Estimate(h) {
			t.Fatalf("decoded Estimate differs: %d, want %d", d.Estimate(h), c.Estimate(h))
		}
	}
	b2, _ := d.MarshalBinary()
	if !bytes.Equal(b, b2) {
		t.Error("re-encoding differs from the original encoding")
	}
	// A decoded sketch keeps working and merges with its source.
	if err := d.Merge(c); err != nil {
		t.Fatal(err)
	}
	d.Add(hashes[0], 1)
}

func TestCountMinUnmarshalErrors(t *testing.T) {
	c, _ := NewCountMin(0.5, 0.5) // 6x1
	c.Add(Hash64("a"), 3)
	good, _ := c.MarshalBinary()
	mod := func(f func(b []byte) []byte) []byte {
		return f(bytes.Clone(good))
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, ErrCorrupt},
		{"short header", good[:23], ErrCorrupt},
		{"truncated counters", good[:len(good)-1], ErrCorrupt},
		{"trailing byte", append(bytes.Clone(good), 0), ErrCorrupt},
		{"bad magic", mod(func(b []byte) []byte { b[0] = 'X'; return b }), ErrCorrupt},
		{"newer version", mod(func(b []byte) []byte { b[4] = 2; return b }), ErrIncompatible},
		{"reserved set", mod(func(b []byte) []byte { b[6] = 1; return b }), ErrCorrupt},
		{"zero depth", mod(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[8:], 0); return b }), ErrCorrupt},
		{"zero width", mod(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[12:], 0); return b }), ErrCorrupt},
		{"huge dimensions", mod(func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[8:], math.MaxUint32)
			binary.LittleEndian.PutUint32(b[12:], math.MaxUint32)
			return b
		}), ErrCorrupt},
		{"width disagrees with length", mod(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[12:], 7); return b }), ErrCorrupt},
		{"counter above total", mod(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[16:], 2); return b }), ErrCorrupt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := NewCountMin(0.01, 0.01)
			d.Add(1, 1)
			err := d.UnmarshalBinary(tc.b)
			if !errors.Is(err, tc.want) {
				t.Fatalf("UnmarshalBinary: err = %v, want %v", err, tc.want)
			}
			if d.Width() != 272 || d.Total() != 1 || d.Estimate(1) != 1 {
				t.Error("failed UnmarshalBinary changed the sketch")
			}
		})
	}
}

func FuzzCountMinUnmarshal(f *testing.F) {
	for _, dims := range [][2]float64{{0.5, 0.5}, {0.3, 0.05}} {
		c, _ := NewCountMin(dims[0], dims[1])
		f.Add(mustMarshal(f, c))
		c.Add(Hash64("a"), 3)
		c.Add(Hash64("b"), 1)
		f.Add(mustMarshal(f, c))
	}
	f.Add([]byte{})
	f.Add([]byte("SKCM\x01\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var c CountMin
		if !decoded(t, c.UnmarshalBinary(b)) {
			return
		}
		// Whatever decodes must re-encode to the same bytes and stay usable.
		out, err := c.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out, b) {
			t.Fatalf("re-encoding differs:\n in  %x\n out %x", b, out)
		}
		h := Hash64(string(b))
		if c.Estimate(h) > c.Total() {
			t.Fatalf("Estimate %d above Total %d", c.Estimate(h), c.Total())
		}
		c.Add(h, 1)
		if c.Estimate(h) == 0 {
			t.Fatal("Estimate 0 after Add")
		}
		if err := c.Merge(&c); err != nil {
			t.Fatal(err)
		}
	})
}

type binaryMarshaler interface{ MarshalBinary() ([]byte, error) }

func mustMarshal(tb testing.TB, m binaryMarshaler) []byte {
	tb.Helper()
	b, err := m.MarshalBinary()
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func BenchmarkCountMinAdd(b *testing.B) {
	stream := zipfStream(2, zipfKeys, 1<<16)
	hashes := keyHashes()
	hs := make([]uint64, len(stream))
	for i, k := range stream {
		hs[i] = hashes[k]
	}
	c, _ := NewCountMin(0.001, 0.01)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		c.Add(hs[i&(len(hs)-1)], 1)
		i++
	}
}

func BenchmarkCountMinEstimate(b *testing.B) {
	hashes := keyHashes()
	c, _ := NewCountMin(0.001, 0.01)
	for _, h := range hashes {
		c.Add(h, 1)
	}
	b.ReportAllocs()
	i := 0
	var sink uint64
	for b.Loop() {
		sink += c.Estimate(hashes[i%len(hashes)])
		i++
	}
	_ = sink
}
