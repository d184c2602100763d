package sketch

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
)

// madScale makes the median absolute deviation a consistent estimator of the
// standard deviation of normally distributed observations: 1/Φ⁻¹(3/4).
const madScale = 1.4826

// meanADScale does the same for the mean absolute deviation around the
// median, sqrt(pi/2), used when more than half the observations are equal.
const meanADScale = 1.253314

// maxMADWindow caps the window of a MAD baseline.
const maxMADWindow = 1 << 20

// MAD is a robust baseline over the last W observations: their median and
// median absolute deviation (MAD), and a robust z-score
//
//	Score(x) = (x - median) / (1.4826 * MAD)
//
// which, like a z-score, is about N(0, 1) for normal observations but is not
// dragged by the outliers it is meant to find: up to half the window can be
// spikes before the median or the MAD moves (breakdown point 50%). This is the
// modified z-score of Iglewicz & Hoaglin, "How to detect and handle
// outliers", ASQC 1993, with the 1.4826 consistency constant of Rousseeuw &
// Croux, "Alternatives to the median absolute deviation", JASA 1993. When
// more than half the window is one value the MAD is 0; Score then divides by
// 1.253314 times the mean absolute deviation from the median instead (as
// Iglewicz & Hoaglin and common implementations do), and if that is 0 too
// (every observation equal) Score is 0 for x equal to the median and ±Inf
// otherwise.
//
// Memory: 16*W bytes (the window and a scratch copy for selecting medians),
// allocated by NewMAD. Update is O(1) and does not allocate; Median, MAD and
// Score select over the window, O(W), once per Update (the result is cached
// until the next one), and do not allocate.
//
// Most callers want NewMAD, then, per interval, Ready and Score before
// Update, as with EWMA. MAD implements encoding.BinaryMarshaler and
// BinaryUnmarshaler so that a pipeline stage can checkpoint it.
//
// The zero value has no window and is not usable: Update panics on it.
// Construct one with NewMAD or decode one with UnmarshalBinary. A MAD is not
// safe for concurrent use.
type MAD struct {
	window, warmup int
	n              uint64    // observations made
	ring           []float64 // the last min(n, window) observations; grows to window
	next           int       // once full, the index of the oldest observation
	scratch        []float64
	cached         bool
	median, mad    float64
	meanAD         float64
}

// NewMAD returns an empty baseline over the last window observations that is
// Ready once it holds warmup of them. It panics if window is out of
// [1, 2^20] or warmup is out of [0, window], which are programming errors.
func NewMAD(window, warmup int) *MAD {
	if window < 1 || window > maxMADWindow {
		panic("sketch: NewMAD window out of [1, 2^20]")
	}
	if warmup < 0 || warmup > window {
		panic("sketch: NewMAD warmup out of [0, window]")
	}
	return &MAD{window: window, warmup: warmup, ring: make([]float64, 0, window), scratch: make([]float64, 0, window)}
}

// Update adds observation x, evicting the oldest once the window is full.
// NaN and ±Inf are ignored, and not counted by N. It does not allocate once
// the window is full (NewMAD allocates it up front).
func (m *MAD) Update(x float64) {
	if m.window == 0 {
		panic("sketch: MAD.Update on a zero MAD; construct it with NewMAD")
	}
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return
	}
	m.n++
	m.cached = false
	if len(m.ring) < m.window {
		m.ring = append(m.ring, x)
		return
	}
	m.ring[m.next] = x
	if m.next++; m.next == m.window {
		m.next = 0
	}
}

// N returns the number of observations made (NaN and ±Inf excluded),
// including those that have left the window.
func (m *MAD) N() uint64 { return m.n }

// Len returns the number of observations in the window, min(N, W).
func (m *MAD) Len() int { return len(m.ring) }

// Ready reports whether the window holds at least warmup observations.
func (m *MAD) Ready() bool { return len(m.ring) >= m.warmup && m.window > 0 }

// Median returns the median of the observations in the window (the mean of
// the two middle ones for an even count), 0 when it is empty.
func (m *MAD) Median() float64 { m.compute(); return m.median }

// MAD returns the median absolute deviation from the median of the
// observations in the window, in their units; 0 when it is empty. Multiply by
// 1.4826 to estimate the standard deviation of normal data.
func (m *MAD) MAD() float64 { m.compute(); return m.mad }

// Score returns the robust z-score of x against the window: (x -
// Median())/(1.4826*MAD()), with the fallbacks described on MAD when MAD() is
// 0. It is 0 for an empty window.
func (m *MAD) Score(x float64) float64 {
	m.compute()
	if len(m.ring) == 0 {
		return 0
	}
	d := x - m.median
	switch {
	case m.mad > 0:
		return d / (madScale * m.mad)
	case m.meanAD > 0:
		return d / (meanADScale * m.meanAD)
	case d == 0:
		return 0
	default:
		return math.Inf(int(math.Copysign(1, d)))
	}
}

func (m *MAD) compute() {
	if m.cached {
		return
	}
	m.cached = true
	m.median, m.mad, m.meanAD = 0, 0, 0
	if len(m.ring) == 0 {
		return
	}
	s := append(m.scratch[:0], m.ring...)
	m.scratch = s
	m.median = median(s)
	var sum float64
	for i, v := range s {
		s[i] = math.Abs(v - m.median)
		sum += s[i]
	}
	m.meanAD = sum / float64(len(s))
	m.mad = median(s)
}

// median returns the median of s, reordering s. It selects in expected O(n)
// (Hoare's quickselect with a median-of-three pivot).
func median(s []float64) float64 {
	n := len(s)
	hi := selectK(s, n/2)
	if n%2 == 1 {
		return hi
	}
	// The lower middle is the largest of the elements left of n/2.
	return (slices.Max(s[:n/2]) + hi) / 2
}

// selectK reorders s so that s[k] is the k-th smallest, everything before it
// no larger and everything after no smaller, and returns s[k].
func selectK(s []float64, k int) float64 {
	lo, hi := 0, len(s)-1
	for lo < hi {
		mid := lo + (hi-lo)/2
		// Median of three as the pivot, moved to hi.
		if s[mid] < s[lo] {
			s[mid], s[lo] = s[lo], s[mid]
		}
		if s[hi] < s[lo] {
			s[hi], s[lo] = s[lo], s[hi]
		}
		if s[mid] < s[hi] {
			s[mid], s[hi] = s[hi], s[mid]
		}
		p := s[hi]
		i := lo
		for j := lo; j < hi; j++ {
			if s[j] < p {
				s[i], s[j] = s[j], s[i]
				i++
			}
		}
		s[i], s[hi] = s[hi], s[i]
		switch {
		case k < i:
			hi = i - 1
		case k > i:
			lo = i + 1
		default:
			return s[k]
		}
	}
	return s[k]
}

// Encoding of a MAD, little-endian:
//
//	[0:4]   magic "SKMD"
//	[4]     format version, madVersion
//	[5:8]   reserved, zero
//	[8:12]  window W, uint32
//	[12:16] warmup, uint32
//	[16:24] N, uint64
//	[24:28] number of observations in the window, min(N, W), uint32
//	[28:32] reserved, zero
//	[32:]   the observations, oldest first, float64 bits
const (
	madMagic      = "SKMD"
	madVersion    = 1
	madHeaderSize = 32
)

// MarshalBinary encodes m in a versioned binary format of 32+8*Len() bytes.
// It implements encoding.BinaryMarshaler and returns an error only for a zero
// MAD.
func (m *MAD) MarshalBinary() ([]byte, error) {
	if m.window == 0 {
		return nil, fmt.Errorf("%w: cannot encode a zero MAD; construct it with NewMAD", ErrIncompatible)
	}
	b := make([]byte, madHeaderSize, madHeaderSize+8*len(m.ring))
	copy(b, madMagic)
	b[4] = madVersion
	binary.LittleEndian.PutUint32(b[8:], uint32(m.window))
	binary.LittleEndian.PutUint32(b[12:], uint32(m.warmup))
	binary.LittleEndian.PutUint64(b[16:], m.n)
	binary.LittleEndian.PutUint32(b[24:], uint32(len(m.ring)))
	for _, v := range m.ring[m.next:] {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
	}
	for _, v := range m.ring[:m.next] {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
	}
	return b, nil
}

// UnmarshalBinary replaces m with the baseline encoded in b by
// MarshalBinary. It returns an error wrapping ErrIncompatible for an unknown
// format version and one wrapping ErrCorrupt for a short or long encoding, a
// bad magic, a window out of [1, 2^20], a warmup above the window, a count of
// observations other than min(N, W), or a NaN or infinite observation. It
// never panics, allocates memory proportional to len(b) (the window grows to
// W as observations arrive) and leaves m unchanged on error.
func (m *MAD) UnmarshalBinary(b []byte) error {
	if len(b) < madHeaderSize {
		return fmt.Errorf("%w: MAD header needs %d bytes, have %d", ErrCorrupt, madHeaderSize, len(b))
	}
	if string(b[:4]) != madMagic {
		return fmt.Errorf("%w: MAD magic %q, want %q; the bytes are not a MAD", ErrCorrupt, b[:4], madMagic)
	}
	if b[4] != madVersion {
		return fmt.Errorf("%w: MAD format version %d, this build reads %d", ErrIncompatible, b[4], madVersion)
	}
	if b[5]|b[6]|b[7]|b[28]|b[29]|b[30]|b[31] != 0 {
		return fmt.Errorf("%w: MAD reserved header bytes are not zero", ErrCorrupt)
	}
	w := uint64(binary.LittleEndian.Uint32(b[8:]))
	warmup := uint64(binary.LittleEndian.Uint32(b[12:]))
	n := binary.LittleEndian.Uint64(b[16:])
	l := uint64(binary.LittleEndian.Uint32(b[24:]))
	switch {
	case w < 1 || w > maxMADWindow:
		return fmt.Errorf("%w: MAD window %d out of [1, 2^20]", ErrCorrupt, w)
	case warmup > w:
		return fmt.Errorf("%w: MAD warmup %d above the window %d", ErrCorrupt, warmup, w)
	case l != min(n, w):
		return fmt.Errorf("%w: MAD holds %d observations, want min(N %d, window %d)", ErrCorrupt, l, n, w)
	case uint64(len(b)-madHeaderSize) != 8*l:
		return fmt.Errorf("%w: MAD of %d observations needs %d bytes, have %d", ErrCorrupt, l, 8*l, len(b)-madHeaderSize)
	}
	ring := make([]float64, l)
	for i := range ring {
		v := math.Float64frombits(binary.LittleEndian.Uint64(b[madHeaderSize+8*i:]))
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("%w: MAD observation %d is %v", ErrCorrupt, i, v)
		}
		ring[i] = v
	}
	*m = MAD{window: int(w), warmup: int(warmup), n: n, ring: ring}
	return nil
}
