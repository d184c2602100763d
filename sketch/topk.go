package sketch

import (
	"encoding/binary"
	"fmt"
)

// Item is one key tracked by a TopK.
type Item struct {
	// Key is the tracked key.
	Key string
	// Count is an overestimate of the key's true count: true <= Count.
	Count uint64
	// Err bounds the overestimate: Count-Err <= true, so Count-Err is a
	// guaranteed lower bound. Err is 0 for a key counted exactly, as every
	// key is while fewer than k keys have been seen.
	Err uint64
}

// TopK finds the heavy hitters of a stream of string keys with the
// Space-Saving algorithm (Metwally, Agrawal & El Abbadi, "Efficient
// computation of frequent and top-k elements in data streams", ICDT 2005),
// made mergeable as in Agarwal et al., "Mergeable summaries", PODS 2012.
//
// It keeps k counters. While fewer than k keys have been seen their counts are
// exact. After that a new key takes over the counter with the smallest count
// m, starting at m+n with error m. Every count is then an overestimate by at
// most Total()/k, and every key whose true count exceeds Total()/k is tracked:
// to find all keys above a fraction phi of the stream with error at most
// epsilon*Total(), use k >= 1/epsilon (for example phi=0.01, epsilon=0.001,
// k=1000).
//
// Memory: 120 to 150*k bytes (a node, a heap entry, two to four hash-table slots and
// a 16-byte key buffer per counter), plus the bytes of keys longer than 16,
// allocated once by NewTopK. Add hashes the key once with Hash64, finds its
// counter in an open-addressing table keyed by the hash (comparing the stored
// key bytes on a hit) and restores a min-heap over the counts, in O(log k).
// It does not allocate, including when a new key takes over a counter: the
// key is copied into that counter's buffer, which only grows when the key is
// longer than every key the counter held before.
//
// Most callers want NewTopK, then Add on each event and List to read the heavy
// hitters. Sketches from different partitions combine with Merge and travel
// with MarshalBinary.
//
// The zero value has no counters and is not usable: Add and Merge panic on
// it. Construct one with NewTopK, or decode one with UnmarshalBinary.
//
// A TopK is not safe for concurrent use: give each one a single owner or guard
// it with a mutex.
type TopK struct {
	s spaceSaving
}

// maxTopK is the largest capacity NewTopK accepts.
const maxTopK = 1 << 20

// NewTopK returns an empty TopK with k counters, using 120 to 150*k bytes
// plus the keys longer than 16 bytes. It panics if k < 1 or k > 2^20, which
// is a programming error.
func NewTopK(k int) *TopK {
	if k < 1 || k > maxTopK {
		panic("sketch: NewTopK capacity out of [1, 2^20]")
	}
	return &TopK{s: newSpaceSaving(k, true)}
}

// Add counts n more events for key. Adding 0 is a no-op. Counts and Total
// saturate at the largest uint64 instead of wrapping.
//
// Add does not retain key, so key may point into a reused buffer, and it
// does not allocate once the k counters are in use (see TopK).
func (t *TopK) Add(key string, n uint64) {
	t.AddHash(Hash64(key), key, n)
}

// AddHash is Add for a caller that already has h = Hash64(key), for example
// because it feeds the same hash to a CountMin or a Distinct. h must be
// Hash64(key): other hashes would split a key across partitions' sketches,
// and UnmarshalBinary recomputes Hash64 from the stored keys.
func (t *TopK) AddHash(h uint64, key string, n uint64) {
	if t.s.k == 0 {
		panic("sketch: TopK.Add on a zero TopK; construct it with NewTopK")
	}
	if n == 0 {
		return
	}
	t.s.add(h, key, n)
}

// Tracked reports whether the key with hash h (Hash64(key)) holds one of
// t's counters, so that a caller keeping more state per heavy key can drop
// what belongs to keys t no longer tracks. It does not allocate.
func (t *TopK) Tracked(h uint64, key string) bool {
	return t.s.k != 0 && t.s.lookup(h, key) >= 0
}

// K returns the number of counters.
func (t *TopK) K() int { return t.s.k }

// List returns the tracked keys, at most k of them, sorted by Count
// descending and then by Key ascending, so equal sketches list identically.
// The slice and its strings are newly allocated and the caller owns them. To
// get the keys above a fraction phi of the stream, keep the items with Count
// > phi*Total(); those with Count-Err > phi*Total() are certainly above it.
func (t *TopK) List() []Item {
	its := t.s.items()
	out := make([]Item, len(its))
	for i, it := range its {
		out[i] = Item{Key: it.key, Count: it.count, Err: it.err}
	}
	return out
}

// Total returns N, the sum of every n passed to Add, including those merged in
// (saturating at the largest uint64).
func (t *TopK) Total() uint64 { return t.s.total }

// Merge folds o into t, so that t summarises both streams with t's capacity;
// o is not modified, and o may have a different capacity.
//
// For each key tracked by either sketch the counts and errors are added; a key
// missing from one side is charged, on both its count and its error, the most
// it can have had there: that side's smallest count once all its counters are
// in use, and otherwise 0 (unless an earlier merge dropped keys from it). The
// k largest results are kept, ties broken by key, so the result depends only
// on the two sketches' contents: merging the same sketches in the same order
// gives the same sketch on every node. This is the Space-Saving form of the
// merge of Agarwal et al. (2012), as analysed by Cafaro, Pulimeno & Tempesta
// ("A parallel space saving algorithm for frequent items and the Hurwitz zeta
// distribution", Information Sciences 2016): Count-Err <= true <= Count still
// holds and, for sketches of equal capacity, the counts still sum to at most
// Total(), so every error stays within Total()/k and every key above
// Total()/k stays tracked.
//
// If o has fewer counters than t, the error bound after the merge is that of
// the smaller capacity, Total()/min(k, k').
//
// Merge runs in O((k+k') log(k+k')) and allocates. t.Merge(t) doubles every
// count.
func (t *TopK) Merge(o *TopK) {
	if t.s.k == 0 {
		panic("sketch: TopK.Merge into a zero TopK; construct it with NewTopK")
	}
	if o == nil || o.s.k == 0 {
		return
	}
	t.s.merge(&o.s)
}

// Reset forgets every key and sets the total to zero, keeping the capacity
// and the memory (including the key buffers).
func (t *TopK) Reset() { t.s.reset() }

// Encoding of a TopK, all integers little-endian:
//
//	[0:4]   magic "SKTK"
//	[4]     format version, topKVersion
//	[5:8]   reserved, zero
//	[8:12]  k, uint32
//	[12:16] number of items n <= k, uint32
//	[16:24] total, uint64
//	[24:32] dropped (the bound on untracked keys before the counters fill), uint64
//	[32:]   n items in List order: count uint64, err uint64, key length
//	        uvarint, key bytes
//
// The items are in List order (count descending, key ascending), so equal
// sketches encode to equal bytes.
const (
	topKMagic      = "SKTK"
	topKVersion    = 1
	topKHeaderSize = 32
	topKMinItem    = 17 // count, err and a one-byte length
)

// MarshalBinary encodes t in a versioned binary format of 32 bytes plus, per
// tracked key, 17 bytes and the key. It implements encoding.BinaryMarshaler
// and returns an error wrapping ErrIncompatible only for a zero TopK.
func (t *TopK) MarshalBinary() ([]byte, error) {
	if t.s.k == 0 {
		return nil, fmt.Errorf("%w: cannot encode a zero TopK; construct it with NewTopK", ErrIncompatible)
	}
	its := t.s.items()
	size := topKHeaderSize
	for _, it := range its {
		size += 16 + binary.MaxVarintLen64 + len(it.key)
	}
	b := make([]byte, topKHeaderSize, size)
	copy(b, topKMagic)
	b[4] = topKVersion
	binary.LittleEndian.PutUint32(b[8:], uint32(t.s.k))
	binary.LittleEndian.PutUint32(b[12:], uint32(len(its)))
	binary.LittleEndian.PutUint64(b[16:], t.s.total)
	binary.LittleEndian.PutUint64(b[24:], t.s.dropped)
	for _, it := range its {
		b = binary.LittleEndian.AppendUint64(b, it.count)
		b = binary.LittleEndian.AppendUint64(b, it.err)
		b = binary.AppendUvarint(b, uint64(len(it.key)))
		b = append(b, it.key...)
	}
	return b, nil
}

// UnmarshalBinary replaces t with the sketch encoded in b by MarshalBinary,
// taking the encoded capacity. It implements encoding.BinaryUnmarshaler.
//
// It returns an error wrapping ErrIncompatible if b has an unknown format
// version, and one wrapping ErrCorrupt if b is short, has trailing bytes or a
// bad magic, or describes a state Add and Merge cannot produce: a capacity
// out of [1, 2^20], more items than counters, an item whose error exceeds its
// count or whose count exceeds the total or is below the dropped bound, or
// items out of List order, or a key listed twice. It never
// panics, allocates memory proportional to len(b) (not to the encoded
// capacity: counters beyond the encoded items are allocated when Add first
// needs them) and leaves t unchanged on error.
func (t *TopK) UnmarshalBinary(b []byte) error {
	if len(b) < topKHeaderSize {
		return fmt.Errorf("%w: top-k header needs %d bytes, have %d", ErrCorrupt, topKHeaderSize, len(b))
	}
	if string(b[:4]) != topKMagic {
		return fmt.Errorf("%w: top-k magic %q, want %q; the bytes are not a TopK", ErrCorrupt, b[:4], topKMagic)
	}
	if v := b[4]; v != topKVersion {
		return fmt.Errorf("%w: top-k format version %d, this build reads %d", ErrIncompatible, v, topKVersion)
	}
	if b[5]|b[6]|b[7] != 0 {
		return fmt.Errorf("%w: top-k reserved header bytes are not zero", ErrCorrupt)
	}
	k := uint64(binary.LittleEndian.Uint32(b[8:]))
	n := uint64(binary.LittleEndian.Uint32(b[12:]))
	total := binary.LittleEndian.Uint64(b[16:])
	dropped := binary.LittleEndian.Uint64(b[24:])
	if k < 1 || k > maxTopK {
		return fmt.Errorf("%w: top-k capacity %d out of [1, 2^20]", ErrCorrupt, k)
	}
	if n > k {
		return fmt.Errorf("%w: top-k has %d items but %d counters", ErrCorrupt, n, k)
	}
	if dropped > total {
		return fmt.Errorf("%w: top-k dropped bound %d exceeds total %d", ErrCorrupt, dropped, total)
	}
	p := b[topKHeaderSize:]
	if n > uint64(len(p))/topKMinItem {
		return fmt.Errorf("%w: top-k says %d items, %d bytes cannot hold them", ErrCorrupt, n, len(p))
	}
	items := make([]ssItem, n)
	for i := range items {
		if len(p) < 16 {
			return fmt.Errorf("%w: top-k item %d truncated", ErrCorrupt, i)
		}
		it := ssItem{count: binary.LittleEndian.Uint64(p), err: binary.LittleEndian.Uint64(p[8:])}
		l, w := binary.Uvarint(p[16:])
		if w <= 0 || l > uint64(len(p)-16-w) {
			return fmt.Errorf("%w: top-k item %d key length truncated or too long", ErrCorrupt, i)
		}
		p = p[16+w:]
		it.key = string(p[:l])
		p = p[l:]
		it.hash = Hash64(it.key)
		switch {
		case it.err > it.count:
			return fmt.Errorf("%w: top-k item %q error %d exceeds its count %d", ErrCorrupt, it.key, it.err, it.count)
		case it.count > total:
			return fmt.Errorf("%w: top-k item %q count %d exceeds total %d", ErrCorrupt, it.key, it.count, total)
		case it.count < dropped:
			return fmt.Errorf("%w: top-k item %q count %d below the dropped bound %d", ErrCorrupt, it.key, it.count, dropped)
		case i > 0 && compareItems(items[i-1], it) >= 0:
			return fmt.Errorf("%w: top-k item %q out of order or repeated", ErrCorrupt, it.key)
		}
		items[i] = it
	}
	if len(p) != 0 {
		return fmt.Errorf("%w: top-k has %d trailing bytes", ErrCorrupt, len(p))
	}
	s := spaceSaving{k: int(k), withKeys: true}
	s.alloc(int(n))
	s.load(total, dropped, items)
	if !s.unique() {
		return fmt.Errorf("%w: top-k lists a key twice", ErrCorrupt)
	}
	t.s = s
	return nil
}
