package sketch

import (
	"encoding/binary"
	"fmt"
	"time"
)

// CountMinRing counts events per key over a sliding window of event time:
// a ring of n count-min sketches (see CountMin), one per interval, where the
// oldest is cleared and reused when an event opens a new interval. Estimate
// sums the key's estimates over the live intervals, so it covers between
// (n-1)*interval and n*interval of event time, ending at the newest interval
// seen.
//
// Error bound: the estimate is never below the key's true count in the live
// intervals and, with probability at least 1-delta, at most epsilon*Total()
// above it, Total() being the events in the live intervals. Every interval
// uses the same row hashes, so the sum of the per-interval minima is at most
// the minimum over rows of the summed counters, which is a plain count-min
// sketch of the whole window (Cormode & Muthukrishnan 2005): the window keeps
// the single-sketch bound, not n times delta. The interval scheme is the
// basic-window approach of Zhu & Shasha, "StatStream: statistical monitoring
// of thousands of data streams in real time", VLDB 2002.
//
// Memory: n times that of the CountMin, 8*width*depth bytes per interval.
// Event times come from the caller (an event's own timestamp, or a logical
// clock); the ring never reads the wall clock. Add is O(depth) and does not
// allocate, including when it rotates (which clears one interval's counters
// per interval passed, at most n).
//
// Most callers want NewCountMinRing, then Add on each event, Advance before
// reading when events may have stopped, and Estimate.
//
// The zero value is not usable; construct one with NewCountMinRing or decode
// one with UnmarshalBinary. A CountMinRing is not safe for concurrent use.
type CountMinRing struct {
	r epochRing[*CountMin]
}

// NewCountMinRing returns an empty ring of slots intervals of the given
// length, each a CountMin built with NewCountMin(epsilon, delta). It returns
// NewCountMin's errors, and an error if slots is out of [1, 65536] or
// interval is not positive.
func NewCountMinRing(epsilon, delta float64, slots int, interval time.Duration) (*CountMinRing, error) {
	if err := checkRing(slots, interval); err != nil {
		return nil, err
	}
	first, err := NewCountMin(epsilon, delta)
	if err != nil {
		return nil, err
	}
	if uint64(slots)*uint64(len(first.counts)) > maxCountMinCells {
		return nil, fmt.Errorf("sketch: count-min ring of %d intervals of %dx%d counters is more than the limit of %d; use fewer intervals or raise epsilon", slots, first.width, first.depth, maxCountMinCells)
	}
	r := &CountMinRing{r: epochRing[*CountMin]{interval: int64(interval), slots: make([]*CountMin, slots)}}
	r.r.slots[0] = first
	for i := 1; i < slots; i++ {
		r.r.slots[i] = newCountMin(first.width, first.depth)
	}
	return r, nil
}

// Add counts n more events at event time t for the key with hash h. If t is
// in a newer interval than any seen, the window first moves forward to it,
// clearing the intervals that leave it. Add returns false, counting nothing,
// if t is older than the window; an event in an older live interval is
// counted in that interval. It does not allocate.
func (c *CountMinRing) Add(t time.Time, h, n uint64) bool {
	s, ok := c.r.slot(t)
	if ok {
		s.Add(h, n)
	}
	return ok
}

// Advance moves the window forward to the interval of t, as Add would,
// without counting anything. Call it before reading when the stream may have
// gone quiet, so that old intervals expire.
func (c *CountMinRing) Advance(t time.Time) { c.r.advanceTo(c.r.epoch(t)) }

// Estimate returns the estimated count of the key with hash h over the live
// intervals: never below the true count and, with probability at least
// 1-delta, at most epsilon*Total() above it. It does not allocate.
func (c *CountMinRing) Estimate(h uint64) uint64 {
	h1, h2 := rowHashes(h)
	var sum uint64
	for _, s := range c.r.slots {
		sum = satAdd(sum, s.min(h1, h2))
	}
	return sum
}

// Total returns the number of events in the live intervals.
func (c *CountMinRing) Total() uint64 {
	var sum uint64
	for _, s := range c.r.slots {
		sum = satAdd(sum, s.total)
	}
	return sum
}

// Window returns the length of the window, slots times the interval.
func (c *CountMinRing) Window() time.Duration {
	return time.Duration(int64(len(c.r.slots)) * c.r.interval)
}

// Merge adds the live intervals of o into c, first moving c's window forward
// to o's newest interval if it is newer; intervals of o that are older than
// c's window are ignored. It returns an error wrapping ErrIncompatible, with
// c unchanged, if o has another interval length, number of intervals, epsilon
// or delta. o is not modified, except that c.Merge(c) doubles every count.
func (c *CountMinRing) Merge(o *CountMinRing) error {
	if c.r.interval != o.r.interval || len(c.r.slots) != len(o.r.slots) ||
		c.r.slots[0].width != o.r.slots[0].width || c.r.slots[0].depth != o.r.slots[0].depth {
		return fmt.Errorf("%w: count-min ring of %d x %v (%dx%d) cannot merge %d x %v (%dx%d)", ErrIncompatible,
			len(c.r.slots), time.Duration(c.r.interval), c.r.slots[0].width, c.r.slots[0].depth,
			len(o.r.slots), time.Duration(o.r.interval), o.r.slots[0].width, o.r.slots[0].depth)
	}
	return c.r.mergeFrom(&o.r, (*CountMin).Merge)
}

// Reset clears every interval and forgets the window's position.
func (c *CountMinRing) Reset() { c.r.reset() }

// Encoding of a CountMinRing: "SKCR", version countMinRingVersion, three
// reserved zero bytes, the ring header (see ringHeaderSize), then each slot
// in ring order as a uint32 length and a CountMin encoding.
const (
	countMinRingMagic   = "SKCR"
	countMinRingVersion = 1
)

// MarshalBinary encodes c in a versioned binary format: a 32-byte header,
// then each interval's CountMin encoding with a 4-byte length. It implements
// encoding.BinaryMarshaler and returns an error only for a zero CountMinRing.
func (c *CountMinRing) MarshalBinary() ([]byte, error) {
	if len(c.r.slots) == 0 {
		return nil, fmt.Errorf("%w: cannot encode a zero CountMinRing; construct it with NewCountMinRing", ErrIncompatible)
	}
	b := make([]byte, 0, ringHeaderSize+len(c.r.slots)*(4+countMinHeaderSize+8*len(c.r.slots[0].counts)))
	b = append(b, countMinRingMagic...)
	b = append(b, countMinRingVersion, 0, 0, 0)
	b = c.r.appendHeader(b)
	for _, s := range c.r.slots {
		e, err := s.MarshalBinary()
		if err != nil {
			return nil, err
		}
		b = binary.LittleEndian.AppendUint32(b, uint32(len(e)))
		b = append(b, e...)
	}
	return b, nil
}

// UnmarshalBinary replaces c with the ring encoded in b by MarshalBinary. It
// returns an error wrapping ErrIncompatible for an unknown format version and
// one wrapping ErrCorrupt for a short, long or inconsistent encoding
// (including intervals of different dimensions) or any error a slot's
// CountMin.UnmarshalBinary returns. It never panics, allocates no more than
// about len(b) bytes and leaves c unchanged on error.
func (c *CountMinRing) UnmarshalBinary(b []byte) error {
	n, interval, head, started, err := readRingHeader(b, countMinRingMagic, countMinRingVersion, "count-min ring")
	if err != nil {
		return err
	}
	p := b[ringHeaderSize:]
	if n > len(p)/(4+countMinHeaderSize+8) {
		return fmt.Errorf("%w: count-min ring says %d slots, %d bytes cannot hold them", ErrCorrupt, n, len(p))
	}
	slots := make([]*CountMin, n)
	for i := range slots {
		if len(p) < 4 {
			return fmt.Errorf("%w: count-min ring slot %d truncated", ErrCorrupt, i)
		}
		l := binary.LittleEndian.Uint32(p)
		if uint64(l) > uint64(len(p)-4) {
			return fmt.Errorf("%w: count-min ring slot %d of %d bytes truncated", ErrCorrupt, i, l)
		}
		s := new(CountMin)
		if err := s.UnmarshalBinary(p[4 : 4+l]); err != nil {
			return fmt.Errorf("count-min ring slot %d: %w", i, err)
		}
		if i > 0 && (s.width != slots[0].width || s.depth != slots[0].depth) {
			return fmt.Errorf("%w: count-min ring slot %d is %dx%d, slot 0 is %dx%d", ErrCorrupt, i, s.width, s.depth, slots[0].width, slots[0].depth)
		}
		if !started && s.total != 0 {
			return fmt.Errorf("%w: count-min ring not started but slot %d holds %d events", ErrCorrupt, i, s.total)
		}
		slots[i] = s
		p = p[4+l:]
	}
	if len(p) != 0 {
		return fmt.Errorf("%w: count-min ring has %d trailing bytes", ErrCorrupt, len(p))
	}
	c.r = epochRing[*CountMin]{interval: interval, slots: slots, head: head, started: started, headStart: head * interval}
	c.r.headIdx = c.r.index(head)
	return nil
}
