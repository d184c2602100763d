package sketch

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// sortedMedian is the reference median: sort a copy.
func sortedMedian(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func TestMADSteps(t *testing.T) {
	m := NewMAD(5, 3)
	for _, st := range []struct {
		x                float64
		ready            bool
		median, mad, obs float64 // obs: x to score after the update
		score            float64
	}{
		{1, false, 1, 0, 1, 0},
		{2, false, 1.5, 0.5, 2.5, 1 / (1.4826 * 0.5)},
		{3, true, 2, 1, 5, 3 / 1.4826},
		{4, true, 2.5, 1, 2.5, 0},
		{100, true, 3, 1, 5, 2 / 1.4826}, // the spike barely moves the baseline
		{math.NaN(), true, 3, 1, 3, 0},   // ignored
		{5, true, 4, 1, 2, -2 / 1.4826},  // 1 leaves: 2 3 4 100 5
		{math.Inf(1), true, 4, 1, 4, 0},  // ignored
	} {
		m.Update(st.x)
		if m.Ready() != st.ready || m.Median() != st.median || m.MAD() != st.mad {
			t.Fatalf("after %v: ready %v median %v MAD %v, want %v %v %v", st.x, m.Ready(), m.Median(), m.MAD(), st.ready, st.median, st.mad)
		}
		if got := m.Score(st.obs); math.Abs(got-st.score) > 1e-12 {
			t.Fatalf("after %v: Score(%v) = %v, want %v", st.x, st.obs, got, st.score)
		}
	}
	if m.N() != 6 || m.Len() != 5 {
		t.Errorf("N %d Len %d, want 6 5", m.N(), m.Len())
	}
}

func TestMADZeroDeviation(t *testing.T) {
	m := NewMAD(5, 0)
	if m.Score(3) != 0 || !m.Ready() {
		t.Error("empty baseline: Score not 0 or not Ready with warmup 0")
	}
	for _, x := range []float64{5, 5, 5, 5, 9} {
		m.Update(x)
	}
	// MAD is 0 (four 0 deviations); the mean absolute deviation is 4/5.
	if m.MAD() != 0 {
		t.Fatalf("MAD = %v", m.MAD())
	}
	if got, want := m.Score(9), 4/(1.253314*0.8); math.Abs(got-want) > 1e-12 {
		t.Errorf("Score(9) = %v, want %v from the mean absolute deviation", got, want)
	}
	for range 5 {
		m.Update(5) // 5 5 5 5 5: the 9 leaves
	}
	if m.Score(5) != 0 || !math.IsInf(m.Score(6), 1) || !math.IsInf(m.Score(4), -1) {
		t.Errorf("constant window: Score(5) %v Score(6) %v Score(4) %v", m.Score(5), m.Score(6), m.Score(4))
	}
}

// TestMADAgainstSorting compares with sorting the window, for odd and even
// windows, on a stream with ties and outliers.
func TestMADAgainstSorting(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, w := range []int{1, 2, 7, 64, 501} {
		m := NewMAD(w, 1)
		var all []float64
		for i := range 3000 {
			x := math.Round(r.NormFloat64()*10) / 2
			if i%50 == 0 {
				x = 1e6
			}
			all = append(all, x)
			m.Update(x)
			if i%37 != 0 {
				continue
			}
			win := all[max(0, len(all)-w):]
			med := sortedMedian(win)
			dev := make([]float64, len(win))
			for j, v := range win {
				dev[j] = math.Abs(v - med)
			}
			if m.Median() != med || m.MAD() != sortedMedian(dev) {
				t.Fatalf("w=%d i=%d: median %v MAD %v, want %v %v", w, i, m.Median(), m.MAD(), med, sortedMedian(dev))
			}
		}
	}
}

func TestMADAllocs(t *testing.T) {
	m := NewMAD(100, 10)
	for i := range 100 {
		m.Update(float64(i))
	}
	i := 0
	if a := testing.AllocsPerRun(1000, func() { m.Update(float64(i % 17)); _ = m.Score(3); i++ }); a != 0 {
		t.Errorf("Update and Score allocate %v", a)
	}
}

func TestNewMADPanics(t *testing.T) {
	for name, f := range map[string]func(){
		"window 0":        func() { NewMAD(0, 0) },
		"window huge":     func() { NewMAD(1<<21, 0) },
		"warmup > win":    func() { NewMAD(3, 4) },
		"negative warm":   func() { NewMAD(3, -1) },
		"zero MAD Update": func() { var m MAD; m.Update(1) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}

func TestMADCodec(t *testing.T) {
	for _, fill := range []int{0, 3, 10, 25} {
		m := NewMAD(10, 4)
		for i := range fill {
			m.Update(float64(i * i % 7))
		}
		b := mustMarshal(t, m)
		var got MAD
		if err := got.UnmarshalBinary(b); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(mustMarshal(t, &got), b) || got.Median() != m.Median() || got.MAD() != m.MAD() || got.Ready() != m.Ready() || got.N() != m.N() {
			t.Fatalf("fill %d: round trip differs", fill)
		}
		for i := range 13 { // the decoded baseline evolves as the original
			m.Update(float64(i))
			got.Update(float64(i))
			if got.Median() != m.Median() || got.MAD() != m.MAD() || !bytes.Equal(mustMarshal(t, &got), mustMarshal(t, m)) {
				t.Fatalf("fill %d: decoded baseline diverges after %d updates", fill, i+1)
			}
		}
	}
	m := NewMAD(4, 2)
	m.Update(1)
	m.Update(2)
	good := mustMarshal(t, m)
	put := func(off int, v uint32) []byte {
		b := bytes.Clone(good)
		binary.LittleEndian.PutUint32(b[off:], v)
		return b
	}
	nan := bytes.Clone(good)
	binary.LittleEndian.PutUint64(nan[32:], math.Float64bits(math.NaN()))
	for name, tc := range map[string]struct {
		b    []byte
		want error
	}{
		"short":      {good[:31], ErrCorrupt},
		"magic":      {append([]byte("SKEW"), good[4:]...), ErrCorrupt},
		"version":    {append([]byte("SKMD\x09"), good[5:]...), ErrIncompatible},
		"window 0":   {put(8, 0), ErrCorrupt},
		"window big": {put(8, 1<<21), ErrCorrupt},
		"warmup":     {put(12, 5), ErrCorrupt},
		"count":      {put(24, 1), ErrCorrupt},
		"truncated":  {good[:len(good)-8], ErrCorrupt},
		"NaN":        {nan, ErrCorrupt},
	} {
		got := NewMAD(3, 0)
		if err := got.UnmarshalBinary(tc.b); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", name, err, tc.want)
		}
		if got.window != 3 || got.Len() != 0 {
			t.Errorf("%s: failed UnmarshalBinary changed the baseline", name)
		}
	}
	var zero MAD
	if _, err := zero.MarshalBinary(); !errors.Is(err, ErrIncompatible) {
		t.Errorf("zero MAD MarshalBinary: %v", err)
	}
}

func FuzzMADUnmarshal(f *testing.F) {
	m := NewMAD(3, 1)
	f.Add(mustMarshal(f, m))
	for _, x := range []float64{1, 5, 2, 8} {
		m.Update(x)
	}
	f.Add(mustMarshal(f, m))
	f.Fuzz(func(t *testing.T, b []byte) {
		var m MAD
		if !decoded(t, m.UnmarshalBinary(b)) {
			return
		}
		sameEncoding(t, &m, b)
		if s := m.Score(1); math.IsNaN(s) {
			t.Fatalf("Score NaN")
		}
		m.Update(2)
		_ = m.MAD()
	})
}

func TestEWMACodec(t *testing.T) {
	for _, e := range []*EWMA{new(EWMA), NewEWMA(0.1, 5)} {
		for i := range 7 {
			e.Update(float64(i * 3 % 5))
		}
		b := mustMarshal(t, e)
		var got EWMA
		if err := got.UnmarshalBinary(b); err != nil {
			t.Fatal(err)
		}
		if got != *e {
			t.Fatalf("round trip: %+v, want %+v", got, *e)
		}
		got.Update(9)
		e.Update(9)
		if got != *e {
			t.Fatal("decoded EWMA diverges")
		}
	}
	good := mustMarshal(t, NewEWMA(0.5, 2))
	put := func(off int, v uint64) []byte {
		b := bytes.Clone(good)
		binary.LittleEndian.PutUint64(b[off:], v)
		return b
	}
	for name, tc := range map[string]struct {
		b    []byte
		want error
	}{
		"short":         {good[:47], ErrCorrupt},
		"magic":         {append([]byte("SKMD"), good[4:]...), ErrCorrupt},
		"version":       {append([]byte("SKEW\x02"), good[5:]...), ErrIncompatible},
		"alpha 2":       {put(8, math.Float64bits(2)), ErrCorrupt},
		"alpha 0 warm":  {put(8, 0), ErrCorrupt},
		"warmup < 0":    {put(16, math.MaxUint64), ErrCorrupt},
		"mean NaN":      {put(32, math.Float64bits(math.NaN())), ErrCorrupt},
		"variance < 0":  {put(40, math.Float64bits(-1)), ErrCorrupt},
		"variance +Inf": {put(40, math.Float64bits(math.Inf(1))), ErrCorrupt},
	} {
		e := NewEWMA(0.3, 1)
		if err := e.UnmarshalBinary(tc.b); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", name, err, tc.want)
		}
		if e.alpha != 0.3 {
			t.Errorf("%s: failed UnmarshalBinary changed the EWMA", name)
		}
	}
}

func FuzzEWMAUnmarshal(f *testing.F) {
	f.Add(mustMarshal(f, NewEWMA(0.2, 3)))
	f.Add(mustMarshal(f, new(EWMA)))
	f.Fuzz(func(t *testing.T, b []byte) {
		var e EWMA
		if !decoded(t, e.UnmarshalBinary(b)) {
			return
		}
		sameEncoding(t, &e, b)
		e.Update(1)
		if math.IsNaN(e.StdDev()) && !math.IsNaN(e.Mean()) {
			t.Fatal("StdDev NaN")
		}
	})
}
