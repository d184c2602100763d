package sketch

import (
	"math"
)

// EWMA is an exponentially weighted moving average with an exponentially
// weighted variance, used as an adaptive baseline: an observation above
// Mean() + k*StdDev() is an outlier once Ready() reports true.
//
// Each Update moves the mean by a fraction a of the difference and updates the
// variance incrementally (Finch, "Incremental calculation of weighted mean and
// variance", 2009):
//
//	diff = x - mean
//	mean += a*diff
//	variance = (1-a) * (variance + a*diff*diff)
//
// with a = max(alpha, 1/n) for the n-th observation. The first updates
// therefore give the plain mean and population variance of the observations so
// far, rather than a baseline biased towards the first value or towards zero;
// from n > 1/alpha on, older observations fade with weight (1-alpha) per
// update, a half-life of about ln(2)/alpha updates.
//
// Most callers want NewEWMA, Update once per interval (a tick, a window) and
// Ready before trusting Mean and StdDev.
//
// The zero value has alpha 0 and no warm-up: it tracks the plain mean and
// population variance of all observations and is always Ready. Construct a
// baseline with NewEWMA. An EWMA is not safe for concurrent use: give each one
// a single owner or guard it with a mutex.
type EWMA struct {
	alpha    float64
	warmup   int
	n        int
	mean     float64
	variance float64
}

// NewEWMA returns an empty EWMA with smoothing factor alpha in (0, 1] (the
// weight of the newest observation; 2/(W+1) approximates a window of W
// updates) that is Ready after warmup updates. It panics if alpha is not in
// (0, 1] or warmup is negative, which are programming errors.
func NewEWMA(alpha float64, warmup int) *EWMA {
	if !(alpha > 0 && alpha <= 1) {
		panic("sketch: NewEWMA alpha out of (0, 1]")
	}
	if warmup < 0 {
		panic("sketch: NewEWMA negative warmup")
	}
	return &EWMA{alpha: alpha, warmup: warmup}
}

// Update adds observation x. NaN and ±Inf are ignored, and not counted by N,
// so that one bad sample cannot poison the baseline.
func (e *EWMA) Update(x float64) {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return
	}
	if e.n < math.MaxInt {
		e.n++
	}
	a := max(e.alpha, 1/float64(e.n))
	diff := x - e.mean
	incr := a * diff
	e.mean += incr
	e.variance = (1 - a) * (e.variance + diff*incr)
}

// Mean returns the weighted mean, 0 before the first update.
func (e *EWMA) Mean() float64 { return e.mean }

// StdDev returns the square root of the weighted variance, in the units of the
// observations; 0 before the second update.
func (e *EWMA) StdDev() float64 { return math.Sqrt(max(e.variance, 0)) }

// Ready reports whether at least warmup observations have been made, so that
// Mean and StdDev describe a baseline rather than a few samples.
func (e *EWMA) Ready() bool { return e.n >= e.warmup }

// N returns the number of observations made (NaN and ±Inf excluded).
func (e *EWMA) N() int { return e.n }
