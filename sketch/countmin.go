package sketch

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
)

// maxCountMinCells caps width*depth so that a mistyped epsilon or delta, or a
// hostile header, cannot ask for more than 1 GiB of counters.
const maxCountMinCells = 1 << 27

// CountMin is a count-min sketch (Cormode & Muthukrishnan, "An improved data
// stream summary: the count-min sketch and its applications", J. Algorithms
// 2005) with conservative update (Estan & Varghese, "New directions in traffic
// measurement and accounting", SIGCOMM 2002). It counts events per key in
// width*depth uint64 counters and answers point queries with an estimate that
// is never below the true count and, with probability at least 1-delta, at
// most epsilon*Total() above it.
//
// Keys are pre-hashed uint64 values, normally from Hash64. The depth row
// positions are derived from that one hash by double hashing, g_i = h1 + i*h2
// (Kirsch & Mitzenmacher, "Less hashing, same performance", ESA 2006), with
// h1 and h2 taken from a 64-bit mixer, so Add and Estimate do not allocate.
//
// Most callers want NewCountMin, then Add on each event and Estimate to read a
// key's count. Sketches built with the same epsilon and delta on different
// nodes can be combined with Merge or shipped with MarshalBinary.
//
// The zero value has no counters and is not usable: Add panics on it.
// Construct one with NewCountMin, or decode one with UnmarshalBinary.
//
// A CountMin is not safe for concurrent use: give each one a single owner
// (for example a worker goroutine) or guard it with a mutex.
type CountMin struct {
	width  uint64
	depth  int
	total  uint64
	counts []uint64 // depth rows of width counters, row-major
}

// NewCountMin returns an empty count-min sketch whose estimates exceed the true
// count by at most epsilon*N with probability at least 1-delta, where N is
// Total(). It has width ceil(e/epsilon) and depth ceil(ln(1/delta)) and uses
// 8*width*depth bytes; epsilon=0.001, delta=0.01 gives 2719x5 counters, 106 KiB.
//
// It returns an error if epsilon or delta is not in the open interval (0,1), or
// if the sketch would need more than 2^27 counters (epsilon too small).
func NewCountMin(epsilon, delta float64) (*CountMin, error) {
	if !(epsilon > 0 && epsilon < 1) {
		return nil, fmt.Errorf("sketch: count-min epsilon %v out of (0,1); use the tolerated overcount as a fraction of the total, e.g. 0.001", epsilon)
	}
	if !(delta > 0 && delta < 1) {
		return nil, fmt.Errorf("sketch: count-min delta %v out of (0,1); use the tolerated failure probability, e.g. 0.01", delta)
	}
	w := math.Ceil(math.E / epsilon)
	d := math.Ceil(math.Log(1 / delta))
	if d < 1 {
		d = 1
	}
	if w*d > maxCountMinCells {
		return nil, fmt.Errorf("sketch: count-min epsilon %v and delta %v need %.3gx%.3g counters, more than the limit of %d; raise epsilon", epsilon, delta, w, d, maxCountMinCells)
	}
	return newCountMin(uint64(w), int(d)), nil
}

func newCountMin(width uint64, depth int) *CountMin {
	return &CountMin{
		width:  width,
		depth:  depth,
		counts: make([]uint64, width*uint64(depth)),
	}
}

// Width returns the number of counters per row, ceil(e/epsilon).
func (c *CountMin) Width() int { return int(c.width) }

// Depth returns the number of rows, ceil(ln(1/delta)).
func (c *CountMin) Depth() int { return c.depth }

// rowHashes derives the two double-hashing values from the caller's hash.
func rowHashes(h uint64) (h1, h2 uint64) {
	h1 = mix64(h)
	h2 = mix64(h1 ^ 0x9e3779b97f4a7c15)
	return h1, h2
}

// Add counts n more events for the key with hash h, using conservative update:
// each of the key's depth counters is raised only as far as the new estimate,
// min+n, and a counter already above it is left alone. Estimates stay never
// below the true count while overcounting less than a plain count-min sketch.
// Counters and Total saturate at the largest uint64 instead of wrapping.
//
// Add does not allocate and runs in O(depth).
func (c *CountMin) Add(h uint64, n uint64) {
	if c.depth == 0 {
		panic("sketch: CountMin.Add on a zero CountMin; construct it with NewCountMin")
	}
	c.total = satAdd(c.total, n)
	h1, h2 := rowHashes(h)
	w := c.width
	target := satAdd(c.min(h1, h2), n)
	x := h1
	for i, base := 0, uint64(0); i < c.depth; i, base = i+1, base+w {
		j, _ := bits.Mul64(x, w)
		if p := &c.counts[base+j]; *p < target {
			*p = target
		}
		x += h2
	}
}

// Estimate returns the estimated count of the key with hash h: the minimum of
// its counters. It is never below the true count and exceeds it by more than
// epsilon*Total() with probability at most delta. It returns 0 on a zero
// CountMin. Estimate does not allocate.
func (c *CountMin) Estimate(h uint64) uint64 {
	if c.depth == 0 {
		return 0
	}
	return c.min(rowHashes(h))
}

// min returns the least of the key's counters, one per row.
func (c *CountMin) min(h1, h2 uint64) uint64 {
	w := c.width
	lo := ^uint64(0)
	x := h1
	for i, base := 0, uint64(0); i < c.depth; i, base = i+1, base+w {
		j, _ := bits.Mul64(x, w)
		if v := c.counts[base+j]; v < lo {
			lo = v
		}
		x += h2
	}
	return lo
}

// Total returns N, the sum of every n passed to Add, including those merged in
// (saturating at the largest uint64).
func (c *CountMin) Total() uint64 { return c.total }

// Merge adds the counts of o into c, so that c summarises both streams. It
// returns an error wrapping ErrIncompatible, and leaves c unchanged, if o has a
// different width or depth (it was built with another epsilon or delta). o is
// not modified; c.Merge(c) doubles every count.
//
// Merge adds counters cell by cell. With conservative update each counter is at
// least the true count of every key that maps to it, so the merged estimates
// are still never below the true counts, and still within epsilon*Total() with
// probability 1-delta (the plain count-min bound). They are not, however, what
// conservative update would have produced on the concatenated stream: a merged
// sketch keeps the plain count-min guarantee but loses part of the extra
// accuracy of conservative update.
func (c *CountMin) Merge(o *CountMin) error {
	if c.width != o.width || c.depth != o.depth {
		return fmt.Errorf("%w: count-min %dx%d cannot merge %dx%d; build both with the same epsilon and delta", ErrIncompatible, c.width, c.depth, o.width, o.depth)
	}
	for i, v := range o.counts {
		c.counts[i] = satAdd(c.counts[i], v)
	}
	c.total = satAdd(c.total, o.total)
	return nil
}

// Reset sets every counter and the total to zero, keeping the dimensions and
// the memory.
func (c *CountMin) Reset() {
	clear(c.counts)
	c.total = 0
}

// Encoding of a CountMin, all integers little-endian:
//
//	[0:4]   magic "SKCM"
//	[4]     format version, countMinVersion
//	[5:8]   reserved, zero
//	[8:12]  depth, uint32
//	[12:16] width, uint32
//	[16:24] total, uint64
//	[24:]   depth*width counters, uint64, row-major
//
// The version pins the row hashing (rowHashes and the multiply-high reduction)
// as well as the layout: changing either needs a new version.
const (
	countMinMagic      = "SKCM"
	countMinVersion    = 1
	countMinHeaderSize = 24
)

// MarshalBinary encodes c in a versioned binary format of 24+8*width*depth
// bytes that UnmarshalBinary reads back. It implements
// encoding.BinaryMarshaler and never returns an error for a sketch built with
// NewCountMin; it returns ErrIncompatible for a zero CountMin.
func (c *CountMin) MarshalBinary() ([]byte, error) {
	if c.depth == 0 {
		return nil, fmt.Errorf("%w: cannot encode a zero CountMin; construct it with NewCountMin", ErrIncompatible)
	}
	b := make([]byte, countMinHeaderSize, countMinHeaderSize+8*len(c.counts))
	copy(b, countMinMagic)
	b[4] = countMinVersion
	binary.LittleEndian.PutUint32(b[8:], uint32(c.depth))
	binary.LittleEndian.PutUint32(b[12:], uint32(c.width))
	binary.LittleEndian.PutUint64(b[16:], c.total)
	for _, v := range c.counts {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	return b, nil
}

// UnmarshalBinary replaces c with the sketch encoded in b by MarshalBinary,
// taking the encoded dimensions. It implements encoding.BinaryUnmarshaler.
//
// It returns an error wrapping ErrIncompatible if b has an unknown format
// version, and one wrapping ErrCorrupt if b is short, has trailing bytes, has
// a bad magic or dimensions, or holds a counter larger than the total (which no
// sequence of Add and Merge can produce). It never panics, allocates no more
// than len(b) bytes, and leaves c unchanged on error.
func (c *CountMin) UnmarshalBinary(b []byte) error {
	if len(b) < countMinHeaderSize {
		return fmt.Errorf("%w: count-min header needs %d bytes, have %d", ErrCorrupt, countMinHeaderSize, len(b))
	}
	if string(b[:4]) != countMinMagic {
		return fmt.Errorf("%w: count-min magic %q, want %q; the bytes are not a CountMin", ErrCorrupt, b[:4], countMinMagic)
	}
	if v := b[4]; v != countMinVersion {
		return fmt.Errorf("%w: count-min format version %d, this build reads %d", ErrIncompatible, v, countMinVersion)
	}
	if b[5]|b[6]|b[7] != 0 {
		return fmt.Errorf("%w: count-min reserved header bytes are not zero", ErrCorrupt)
	}
	depth := uint64(binary.LittleEndian.Uint32(b[8:]))
	width := uint64(binary.LittleEndian.Uint32(b[12:]))
	total := binary.LittleEndian.Uint64(b[16:])
	if depth == 0 || width == 0 || depth*width > maxCountMinCells {
		return fmt.Errorf("%w: count-min dimensions %dx%d out of range", ErrCorrupt, width, depth)
	}
	cells := depth * width
	payload := b[countMinHeaderSize:]
	if uint64(len(payload)) != 8*cells {
		return fmt.Errorf("%w: count-min %dx%d needs %d counter bytes, have %d", ErrCorrupt, width, depth, 8*cells, len(payload))
	}
	counts := make([]uint64, cells)
	for i := range counts {
		v := binary.LittleEndian.Uint64(payload[8*i:])
		if v > total {
			return fmt.Errorf("%w: count-min counter %d = %d exceeds total %d", ErrCorrupt, i, v, total)
		}
		counts[i] = v
	}
	*c = CountMin{width: width, depth: int(depth), total: total, counts: counts}
	return nil
}
