package sketch

import (
	"cmp"
	"math/bits"
	"slices"
)

// hashSample is an adaptive distinct sample (Gibbons, "Distinct sampling for
// highly-accurate answers to distinct values queries and event reports",
// VLDB 2001): it keeps the exact count of every item whose sampling hash has
// at least level trailing zero bits, a 2^-level fraction of the distinct
// items chosen by hash, so that each kept item has been counted since its
// first occurrence. When more than cap items are kept, level rises and the
// items that no longer qualify are dropped in place. Its table of at least
// 2*cap slots of 16 bytes is allocated up front, so add does not allocate.
type hashSample struct {
	level int
	cap   int
	n     int
	slots []sampleSlot // open addressing, linear probing; count 0 is empty
}

type sampleSlot struct {
	hash, count uint64
}

func newHashSample(capacity int) hashSample {
	return hashSample{cap: capacity, slots: make([]sampleSlot, tableSize(capacity+1))}
}

// sampleRank is the number of trailing zeros of an item's sampling hash,
// drawn independently of the head's table and the HLL.
func sampleRank(h uint64) int { return bits.TrailingZeros64(mix64(h ^ 0x632be59bd9b4e019)) }

func (s *hashSample) add(h, n uint64) {
	if sampleRank(h) < s.level {
		return
	}
	s.put(h, n)
	for s.n > s.cap {
		s.raise(s.level + 1)
	}
}

// put adds n to h's count, inserting it if absent. The table grows (only
// in a decoded sample, allocated for the items it held) so that it is never
// more than half full.
func (s *hashSample) put(h, n uint64) {
	if 2*(s.n+1) > len(s.slots) {
		old := s.slots
		s.slots, s.n = make([]sampleSlot, tableSize(s.n+1)), 0
		for _, e := range old {
			if e.count != 0 {
				s.put(e.hash, e.count)
			}
		}
	}
	mask := uint64(len(s.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		e := &s.slots[i]
		if e.count == 0 {
			*e = sampleSlot{hash: h, count: n}
			s.n++
			return
		}
		if e.hash == h {
			e.count = satAdd(e.count, n)
			return
		}
	}
}

// raise sets the level to l, dropping the items that no longer qualify.
func (s *hashSample) raise(l int) {
	if l <= s.level {
		return
	}
	s.level = l
	for i := range s.slots {
		// A deletion shifts a later entry into slot i: look at it again.
		for s.slots[i].count != 0 && sampleRank(s.slots[i].hash) < l {
			s.delete(i)
		}
	}
}

// delete empties slot i with backward-shift deletion (as spaceSaving's
// deleteTable).
func (s *hashSample) delete(i int) {
	mask := len(s.slots) - 1
	s.n--
	for {
		s.slots[i] = sampleSlot{}
		j := i
		for {
			j = (j + 1) & mask
			e := s.slots[j]
			if e.count == 0 {
				return
			}
			home := int(e.hash & uint64(mask))
			if i <= j {
				if i < home && home <= j {
					continue
				}
			} else if i < home || home <= j {
				continue
			}
			s.slots[i] = e
			i = j
			break
		}
	}
}

func (s *hashSample) reset() {
	clear(s.slots)
	s.n, s.level = 0, 0
}

// sorted returns the kept items by hash.
func (s *hashSample) sorted() []sampleSlot {
	out := make([]sampleSlot, 0, s.n)
	for _, e := range s.slots {
		if e.count != 0 {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b sampleSlot) int { return cmp.Compare(a.hash, b.hash) })
	return out
}

// merge folds o into s: both are brought to the higher level, counts of the
// same item add (an item kept at a level is kept by every partition that saw
// it), and the level rises further if the union exceeds s.cap.
func (s *hashSample) merge(o *hashSample) {
	s.raise(o.level)
	items := o.sorted()
	for _, e := range items {
		if sampleRank(e.hash) >= s.level {
			s.put(e.hash, e.count)
			for s.n > s.cap {
				s.raise(s.level + 1)
			}
		}
	}
}
