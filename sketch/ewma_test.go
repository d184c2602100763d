package sketch

import (
	"math"
	"math/rand/v2"
	"testing"
)

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

func TestEWMASteps(t *testing.T) {
	// alpha 0.5: the first two updates average (1/n >= alpha), then
	// mean += 0.5*diff, variance = 0.5*(variance + 0.5*diff^2).
	e := NewEWMA(0.5, 2)
	steps := []struct {
		x, mean, variance float64
		ready             bool
	}{
		{2, 2, 0, false},
		{4, 3, 1, true},      // mean and population variance of {2, 4}
		{6, 4.5, 2.75, true}, // diff 3: 0.5*(1 + 3*1.5)
		{4.5, 4.5, 1.375, true},
	}
	for i, s := range steps {
		e.Update(s.x)
		if !near(e.Mean(), s.mean, 1e-12) || !near(e.StdDev(), math.Sqrt(s.variance), 1e-12) || e.Ready() != s.ready || e.N() != i+1 {
			t.Errorf("after update %d (x=%v): mean %v stddev %v ready %v n %d; want %v %v %v %d",
				i+1, s.x, e.Mean(), e.StdDev(), e.Ready(), e.N(), s.mean, math.Sqrt(s.variance), s.ready, i+1)
		}
	}
}

// While 1/n >= alpha the EWMA is the plain mean and population variance.
func TestEWMAEarlyUpdatesAreExact(t *testing.T) {
	xs := []float64{3, 9, 4, 1, 7, 2, 8, 6}
	e := NewEWMA(0.1, 0) // 1/n >= 0.1 for n <= 10
	var sum, sq float64
	for i, x := range xs {
		e.Update(x)
		n := float64(i + 1)
		sum += x
		sq += x * x
		mean := sum / n
		sd := math.Sqrt(sq/n - mean*mean)
		if !near(e.Mean(), mean, 1e-9) || !near(e.StdDev(), sd, 1e-9) {
			t.Errorf("after %d: mean %v stddev %v, want %v %v", i+1, e.Mean(), e.StdDev(), mean, sd)
		}
	}
}

func TestEWMAConverges(t *testing.T) {
	e := NewEWMA(0.05, 20)
	r := rand.New(rand.NewPCG(1, 2))
	// A noisy start, then a constant series: the mean must converge to the
	// constant and the deviation to zero.
	for range 50 {
		e.Update(100 * r.Float64())
	}
	for range 1000 {
		e.Update(42)
	}
	if !near(e.Mean(), 42, 1e-9) || e.StdDev() > 1e-6 {
		t.Errorf("constant 42: mean %v stddev %v, want 42 and ~0", e.Mean(), e.StdDev())
	}
	// A level shift is followed with half-life ln2/alpha ~ 14 updates.
	for range 14 {
		e.Update(52)
	}
	if m := e.Mean(); m < 46 || m > 48 {
		t.Errorf("14 updates after a step 42->52: mean %v, want about 47", m)
	}
}

func TestEWMAStdDevTracksNoise(t *testing.T) {
	e := NewEWMA(0.01, 100)
	r := rand.New(rand.NewPCG(3, 4))
	for range 20_000 {
		e.Update(10 + 2*r.NormFloat64())
	}
	if !near(e.Mean(), 10, 0.5) || !near(e.StdDev(), 2, 0.3) {
		t.Errorf("N(10, 2) noise: mean %v stddev %v", e.Mean(), e.StdDev())
	}
}

func TestEWMAReady(t *testing.T) {
	e := NewEWMA(0.2, 5)
	for i := range 5 {
		if e.Ready() {
			t.Fatalf("Ready after %d updates, want after 5", i)
		}
		e.Update(1)
	}
	if !e.Ready() || e.N() != 5 {
		t.Errorf("after 5 updates: Ready %v N %d", e.Ready(), e.N())
	}
	if !NewEWMA(0.2, 0).Ready() {
		t.Error("warmup 0: not Ready before any update")
	}
}

func TestEWMAIgnoresNonFinite(t *testing.T) {
	e := NewEWMA(0.3, 0)
	e.Update(5)
	e.Update(math.NaN())
	e.Update(math.Inf(1))
	e.Update(math.Inf(-1))
	if e.Mean() != 5 || e.StdDev() != 0 || e.N() != 1 {
		t.Errorf("after non-finite updates: mean %v stddev %v n %d, want 5 0 1", e.Mean(), e.StdDev(), e.N())
	}
}

func TestEWMAAlphaOne(t *testing.T) {
	e := NewEWMA(1, 0)
	for _, x := range []float64{3, 8, -1} {
		e.Update(x)
		if e.Mean() != x || e.StdDev() != 0 {
			t.Errorf("alpha 1 after %v: mean %v stddev %v", x, e.Mean(), e.StdDev())
		}
	}
}

func TestEWMAZeroValue(t *testing.T) {
	var e EWMA
	for _, x := range []float64{1, 2, 3, 4} {
		e.Update(x)
	}
	if !e.Ready() || e.Mean() != 2.5 || !near(e.StdDev(), math.Sqrt(1.25), 1e-12) {
		t.Errorf("zero value: ready %v mean %v stddev %v, want the plain mean 2.5 and stddev sqrt(1.25)", e.Ready(), e.Mean(), e.StdDev())
	}
}

func TestNewEWMAPanics(t *testing.T) {
	for _, tc := range []struct {
		alpha  float64
		warmup int
	}{{0, 1}, {-0.1, 1}, {1.5, 1}, {math.NaN(), 1}, {0.5, -1}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("NewEWMA(%v, %d) did not panic", tc.alpha, tc.warmup)
				}
			}()
			NewEWMA(tc.alpha, tc.warmup)
		}()
	}
}

func BenchmarkEWMAUpdate(b *testing.B) {
	e := NewEWMA(0.1, 10)
	b.ReportAllocs()
	x := 0.0
	for b.Loop() {
		e.Update(x)
		x++
	}
}
