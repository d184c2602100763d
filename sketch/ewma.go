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
// Memory: 40 bytes. Mean and StdDev are computed exactly by the recurrence
// above (there is no approximation error to bound; floating-point rounding
// aside). Update is O(1) and does not allocate. For a baseline that outliers
// cannot drag, see MAD.
//
// Most callers want NewEWMA, Update once per interval (a tick, a window) and
// Ready before trusting Mean and StdDev. EWMA implements
// encoding.BinaryMarshaler and BinaryUnmarshaler so that a pipeline stage can
// checkpoint it.
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
	if !(e.variance <= math.MaxFloat64) {
		// diff*incr overflowed (observations near the float64 limit): the
		// variance saturates instead of becoming Inf or NaN.
		e.variance = math.MaxFloat64
	}
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

// Encoding of an EWMA, little-endian:
//
//	[0:4]   magic "SKEW"
//	[4]     format version, ewmaVersion
//	[5:8]   reserved, zero
//	[8:16]  alpha, float64 bits
//	[16:24] warmup, int64
//	[24:32] N, int64
//	[32:40] mean, float64 bits
//	[40:48] variance, float64 bits
const (
	ewmaMagic   = "SKEW"
	ewmaVersion = 1
	ewmaSize    = 48
)

// MarshalBinary encodes e in a versioned binary format of 48 bytes, so that
// a pipeline stage can checkpoint its baselines. It implements
// encoding.BinaryMarshaler and never fails.
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

// UnmarshalBinary replaces e with the baseline encoded in b by
// MarshalBinary. It returns an error wrapping ErrIncompatible for an unknown
// format version and one wrapping ErrCorrupt for a wrong length or magic, an
// alpha outside (0, 1] (or 0 with a warmup, which only the zero value has,
// and it has no warmup), a negative warmup or N, a NaN or infinite mean, or a
// negative, NaN or infinite variance. It never panics and leaves e unchanged
// on error.
func (e *EWMA) UnmarshalBinary(b []byte) error {
	if len(b) != ewmaSize {
		return fmt.Errorf("%w: EWMA encoding is %d bytes, have %d", ErrCorrupt, ewmaSize, len(b))
	}
	if string(b[:4]) != ewmaMagic {
		return fmt.Errorf("%w: EWMA magic %q, want %q; the bytes are not an EWMA", ErrCorrupt, b[:4], ewmaMagic)
	}
	if b[4] != ewmaVersion {
		return fmt.Errorf("%w: EWMA format version %d, this build reads %d", ErrIncompatible, b[4], ewmaVersion)
	}
	if b[5]|b[6]|b[7] != 0 {
		return fmt.Errorf("%w: EWMA reserved header bytes are not zero", ErrCorrupt)
	}
	v := EWMA{
		alpha:    math.Float64frombits(binary.LittleEndian.Uint64(b[8:])),
		warmup:   int(int64(binary.LittleEndian.Uint64(b[16:]))),
		n:        int(int64(binary.LittleEndian.Uint64(b[24:]))),
		mean:     math.Float64frombits(binary.LittleEndian.Uint64(b[32:])),
		variance: math.Float64frombits(binary.LittleEndian.Uint64(b[40:])),
	}
	switch {
	case !(v.alpha > 0 && v.alpha <= 1) && !(v.alpha == 0 && v.warmup == 0):
		return fmt.Errorf("%w: EWMA alpha %v out of (0, 1]", ErrCorrupt, v.alpha)
	case v.warmup < 0 || v.n < 0:
		return fmt.Errorf("%w: EWMA warmup %d or N %d negative", ErrCorrupt, v.warmup, v.n)
	case math.IsNaN(v.mean) || math.IsInf(v.mean, 0):
		return fmt.Errorf("%w: EWMA mean %v", ErrCorrupt, v.mean)
	case !(v.variance >= 0) || math.IsInf(v.variance, 0):
		return fmt.Errorf("%w: EWMA variance %v", ErrCorrupt, v.variance)
	}
	*e = v
	return nil
}
