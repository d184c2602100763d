package sketch

import (
	"encoding/binary"
	"fmt"
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

// Encoding of an EWMA, little-endian: magic "SKEW", version 1, 3 reserved
// zero bytes, then alpha (float64 bits), warm-up (uint64), n (uint64), mean
// and variance (float64 bits): 48 bytes.
const (
	ewmaMagic   = "SKEW"
	ewmaVersion = 1
	ewmaSize    = 48
)

// MarshalBinary encodes e in a versioned 48-byte format, so that a stage
// can checkpoint its baselines. It implements encoding.BinaryMarshaler and
// never fails.
func (e *EWMA) MarshalBinary() ([]byte, error) {
	b := make([]byte, 8, ewmaSize)
	copy(b, ewmaMagic)
	b[4] = ewmaVersion
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(e.alpha))
	b = binary.LittleEndian.AppendUint64(b, uint64(e.warmup))
	b = binary.LittleEndian.AppendUint64(b, uint64(e.n))
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(e.mean))
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(e.variance))
	return b, nil
}

// UnmarshalBinary replaces e with the EWMA MarshalBinary encoded in b. It
// returns an error wrapping ErrIncompatible for an unknown version and one
// wrapping ErrCorrupt for a wrong length or magic, an alpha outside (0, 1],
// a negative count or a mean or variance that is not finite (a zero EWMA's
// alpha of 0 is accepted). It never panics and leaves e unchanged on error.
func (e *EWMA) UnmarshalBinary(b []byte) error {
	if len(b) != ewmaSize || string(b[:4]) != ewmaMagic {
		return fmt.Errorf("%w: not a %d-byte EWMA encoding", ErrCorrupt, ewmaSize)
	}
	if b[4] != ewmaVersion {
		return fmt.Errorf("%w: EWMA format version %d, this build reads %d", ErrIncompatible, b[4], ewmaVersion)
	}
	u := func(i int) uint64 { return binary.LittleEndian.Uint64(b[8+8*i:]) }
	x := EWMA{alpha: math.Float64frombits(u(0)), warmup: int(u(1)), n: int(u(2)), mean: math.Float64frombits(u(3)), variance: math.Float64frombits(u(4))}
	switch {
	case b[5]|b[6]|b[7] != 0:
		return fmt.Errorf("%w: EWMA reserved bytes are not zero", ErrCorrupt)
	case !(x.alpha >= 0 && x.alpha <= 1), x.warmup < 0, x.n < 0:
		return fmt.Errorf("%w: EWMA alpha %v, warm-up %d or count %d out of range", ErrCorrupt, x.alpha, x.warmup, x.n)
	case math.IsNaN(x.mean) || math.IsInf(x.mean, 0) || math.IsNaN(x.variance) || math.IsInf(x.variance, 0) || x.variance < 0:
		return fmt.Errorf("%w: EWMA mean %v or variance %v is not a finite value", ErrCorrupt, x.mean, x.variance)
	}
	*e = x
	return nil
}
