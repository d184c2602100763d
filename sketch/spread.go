package sketch

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
)

// maxSpreadBytes caps a Spread's registers (64 MiB), so that a mistyped
// epsilon or a hostile header cannot ask for more.
const maxSpreadBytes = 1 << 26

// Spread estimates, for every key of a stream of (key, item) pairs, the
// number of distinct items seen with that key: its spread, or fan-out, such
// as the distinct client IPs of an ASN or of a JA4 fingerprint, or the
// distinct API keys of a JA4. One sketch answers for every key, in fixed
// memory, so a botnet of 50 000 addresses behind one fingerprint shows up
// without a counter per key.
//
// It is a count-min sketch (Cormode & Muthukrishnan 2005) whose cells are
// HyperLogLogs (Flajolet et al. 2007, read with Ertl's estimator, as HLL is)
// instead of counters, the "count-min of HLLs" form of superspreader
// detection (compare the multi-resolution bitmaps of Tang, Huang & Lee,
// "SpreadSketch: toward invertible and network-wide detection of
// superspreaders", INFOCOM 2020). A pair updates one cell per row, chosen
// by the key; the cell's HyperLogLog counts the distinct pairs that hashed
// there. A key's estimate is the least of its cells' estimates, so it is
// its true spread plus the spreads of the keys that share its cell in the
// best row, read with the HyperLogLog's relative standard error
// 1.04/sqrt(2^p). With width ceil(e/epsilon) and depth ceil(ln(1/delta)),
// the overestimate from sharing is at most epsilon times the stream's total
// number of distinct pairs with probability at least 1-delta, as for
// count-min.
//
// Memory is depth*width*2^p bytes: epsilon 0.01, delta 0.01 and p 6 (13%
// standard error) give 5x272 cells of 64 registers, 85 KiB. Add and
// Estimate do not allocate; Estimate reads depth*2^p registers.
//
// Sketches with the same shape merge register by register, with no loss:
// the merge of sketches of parts of a stream equals the sketch of the whole
// stream. The zero value is not usable; construct one with NewSpread. A
// Spread is not safe for concurrent use.
type Spread struct {
	p     uint8
	width uint64
	depth int
	regs  []uint8 // depth rows of width cells of 2^p registers
}

// NewSpread returns an empty Spread whose estimates exceed a key's spread by
// at most epsilon times the total distinct pairs, with probability at least
// 1-delta, on top of the relative standard error 1.04/sqrt(2^p) of its
// HyperLogLog cells. It returns an error if epsilon or delta is not in
// (0, 1), if p is not in [4, 12], or if the sketch would take more than
// 64 MiB.
func NewSpread(epsilon, delta float64, p int) (*Spread, error) {
	if !(epsilon > 0 && epsilon < 1) {
		return nil, fmt.Errorf("sketch: spread epsilon %v out of (0,1); use the tolerated overestimate as a fraction of all distinct pairs, e.g. 0.01", epsilon)
	}
	if !(delta > 0 && delta < 1) {
		return nil, fmt.Errorf("sketch: spread delta %v out of (0,1); use the tolerated failure probability, e.g. 0.01", delta)
	}
	if p < 4 || p > 12 {
		return nil, fmt.Errorf("sketch: spread precision %d out of [4, 12]; 6 gives each cell 64 registers and a 13%% standard error", p)
	}
	w := math.Ceil(math.E / epsilon)
	d := max(1, math.Ceil(math.Log(1/delta)))
	if w*d*float64(uint64(1)<<p) > maxSpreadBytes {
		return nil, fmt.Errorf("sketch: spread epsilon %v, delta %v and precision %d need %.3g bytes, more than the limit of %d; raise epsilon or lower the precision", epsilon, delta, p, w*d*float64(uint64(1)<<p), maxSpreadBytes)
	}
	return &Spread{p: uint8(p), width: uint64(w), depth: int(d), regs: make([]uint8, uint64(w)*uint64(d)<<p)}, nil
}

// Add records that item was seen with key; both are 64-bit hashes (Hash64).
// Seeing the same pair again changes nothing. It does not allocate.
func (s *Spread) Add(key, item uint64) {
	if s.depth == 0 {
		panic("sketch: Spread.Add on a zero Spread; construct it with NewSpread")
	}
	// The pair's hash: distinct items of different keys in one cell stay
	// distinct, and an item seen with two keys counts for each.
	pair := mix64(item ^ mix64(key^0x632be59bd9b4e019))
	p := s.p
	reg := pair >> (64 - p)
	rank := uint8(bits.LeadingZeros64(pair<<p|1<<(p-1))) + 1
	h1, h2 := rowHashes(key)
	x := h1
	for i := range s.depth {
		j, _ := bits.Mul64(x, s.width)
		r := &s.regs[(uint64(i)*s.width+j)<<p+reg]
		if rank > *r {
			*r = rank
		}
		x += h2
	}
}

// Estimate returns the estimated spread of key: at least its true spread
// (up to the HyperLogLog error), and more by the spreads of the keys that
// share its cells. It returns 0 on a zero Spread and does not allocate.
func (s *Spread) Estimate(key uint64) uint64 {
	if s.depth == 0 {
		return 0
	}
	m := 1 << s.p
	lo := uint64(math.MaxUint64)
	h1, h2 := rowHashes(key)
	x := h1
	for i := range s.depth {
		j, _ := bits.Mul64(x, s.width)
		base := (uint64(i)*s.width + j) << s.p
		var c [66]int
		for _, r := range s.regs[base : base+uint64(m)] {
			c[r]++
		}
		lo = min(lo, ertlEstimate(&c, int(s.p), m))
		x += h2
	}
	return lo
}

// Merge folds o into s register by register, so that s estimates the
// spreads of both streams together exactly as one sketch of both would. It
// returns an error wrapping ErrIncompatible, with s unchanged, if the shapes
// differ. It does not allocate.
func (s *Spread) Merge(o *Spread) error {
	if s.p != o.p || s.width != o.width || s.depth != o.depth {
		return fmt.Errorf("%w: spread %dx%d of precision %d cannot merge %dx%d of precision %d; build both with the same epsilon, delta and precision",
			ErrIncompatible, s.width, s.depth, s.p, o.width, o.depth, o.p)
	}
	for i, r := range o.regs {
		if r > s.regs[i] {
			s.regs[i] = r
		}
	}
	return nil
}

// Reset empties s, keeping its memory.
func (s *Spread) Reset() { clear(s.regs) }

// Encoding of a Spread, little-endian: magic "SKSP", version 1, precision p,
// two reserved zero bytes, depth and width as uint32, then the registers
// row by row, one byte each.
const (
	spreadMagic      = "SKSP"
	spreadVersion    = 1
	spreadHeaderSize = 16
)

// MarshalBinary encodes s in a versioned format of 16 bytes plus one byte a
// register. It implements encoding.BinaryMarshaler and fails only for a
// zero Spread.
func (s *Spread) MarshalBinary() ([]byte, error) {
	if s.depth == 0 {
		return nil, fmt.Errorf("%w: cannot encode a zero Spread; construct it with NewSpread", ErrIncompatible)
	}
	b := make([]byte, spreadHeaderSize, spreadHeaderSize+len(s.regs))
	copy(b, spreadMagic)
	b[4], b[5] = spreadVersion, s.p
	binary.LittleEndian.PutUint32(b[8:], uint32(s.depth))
	binary.LittleEndian.PutUint32(b[12:], uint32(s.width))
	return append(b, s.regs...), nil
}

// UnmarshalBinary replaces s with the Spread encoded in b. It returns an
// error wrapping ErrIncompatible for an unknown version and one wrapping
// ErrCorrupt for a short or long input, a bad magic, a shape out of range
// or a register no HyperLogLog of that precision can hold. It never panics,
// allocates no more than len(b) bytes, and leaves s unchanged on error.
func (s *Spread) UnmarshalBinary(b []byte) error {
	if len(b) < spreadHeaderSize || string(b[:4]) != spreadMagic {
		return fmt.Errorf("%w: not a spread sketch", ErrCorrupt)
	}
	if b[4] != spreadVersion {
		return fmt.Errorf("%w: spread format version %d, this build reads %d", ErrIncompatible, b[4], spreadVersion)
	}
	p := b[5]
	depth := uint64(binary.LittleEndian.Uint32(b[8:]))
	width := uint64(binary.LittleEndian.Uint32(b[12:]))
	switch {
	case b[6]|b[7] != 0:
		return fmt.Errorf("%w: spread reserved bytes are not zero", ErrCorrupt)
	case p < 4 || p > 12 || depth == 0 || width == 0 || depth*width > maxSpreadBytes>>p:
		return fmt.Errorf("%w: spread shape %dx%d of precision %d out of range", ErrCorrupt, width, depth, p)
	case uint64(len(b)-spreadHeaderSize) != depth*width<<p:
		return fmt.Errorf("%w: spread %dx%d of precision %d needs %d register bytes, have %d", ErrCorrupt, width, depth, p, depth*width<<p, len(b)-spreadHeaderSize)
	}
	regs := b[spreadHeaderSize:]
	for _, r := range regs {
		if r > 65-p {
			return fmt.Errorf("%w: spread register %d exceeds %d, the most precision %d allows", ErrCorrupt, r, 65-p, p)
		}
	}
	*s = Spread{p: p, width: width, depth: int(depth), regs: append([]uint8(nil), regs...)}
	return nil
}
