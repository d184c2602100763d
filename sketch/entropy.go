package sketch

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Entropy estimates the empirical Shannon entropy of a stream of items (for
// example the paths requested by one client, or the clients of one route),
// in nats:
//
//	H = ln N - S/N,  S = sum over items of c*ln(c)
//
// where c is an item's count and N the total. A scraper walking a site has a
// high entropy of paths, a client hammering one endpoint a low one.
//
// It follows the elephants-and-mice split of Lall, Sekar, Ogihara, Xu &
// Zhang, "Data streaming algorithms for estimating entropy of network
// traffic", SIGMETRICS 2006: the heavy items are counted, the light ones
// estimated from a sample. Here the elephants come from a Space-Saving
// summary of k counters (as in TopK, keyed by the items' 64-bit hashes) and
// the mice from an adaptive distinct sample of up to 4k items (Gibbons,
// "Distinct sampling for highly-accurate answers to distinct values queries
// and event reports", VLDB 2001): every item whose hash falls in a 2^-level
// fraction of the hash space, with its exact count. S is kept incrementally
// over the head's guaranteed counts g = Count-Err (an item going from g to g+n
// adds (g+n)ln(g+n) - g ln g), which is exact while no item has been evicted.
// Once items have been evicted S is estimated when read: head items whose
// error is at most 1/8 of g contribute c ln c with c the middle of their
// [g, Count] range, and every other item is estimated from the sample, each
// sampled item standing for 2^level items (a Horvitz-Thompson estimate,
// unbiased for that part). An HLL of precision p counts the distinct items
// for Normalized. This sample-based estimate of the mice is this package's
// choice; Lall et al. estimate them with the AMS sampling estimator.
//
// Error bound: while at most k distinct items have been seen every count is
// exact and so is H, up to floating-point rounding (tested to 1e-9
// relative). Beyond that H is a random estimate, its spread set by the mice
// just below the head's reach: on a Zipf(1.1) stream of 1M events over 100k
// items with k = 1000, over 30 hash draws, the error had a root mean square of
// 0.2 nats and a worst case of 0.5 nats (H = 6.7; 0.045 of ln(distinct)).
// The tests hold |H - exact| <= 0.05*ln(distinct), Normalized within about
// 0.05, on that stream and a uniform one (k = 1000) and on the clients and
// paths of three real access logs (k = 250) (TestEntropyAccuracy,
// TestEntropyRealLogs); no worst-case bound is proven for arbitrary streams.
//
// Memory: about 80*k bytes for the head, 128*k for the sample's table and
// 2^p for the HLL (k = 1000, p = 14: about 224 KiB), allocated by NewEntropy;
// Update does not allocate.
//
// Most callers want NewEntropy, Update on each event, then Entropy or
// Normalized once per window. Per-partition sketches combine with Merge and
// travel with MarshalBinary.
//
// The zero value is not usable; construct one with NewEntropy or decode one
// with UnmarshalBinary. An Entropy is not safe for concurrent use.
type Entropy struct {
	head spaceSaving
	mice hashSample
	hll  *HLL
	s    float64 // sum of g*ln(g) over the head's guaranteed counts, kept incrementally
	g    uint64  // sum of the head's guaranteed counts
}

// xlogx returns x*ln(x), 0 for x = 0.
func xlogx(x uint64) float64 {
	if x == 0 {
		return 0
	}
	f := float64(x)
	return f * math.Log(f)
}

// NewEntropy returns an empty entropy estimator with a head of k counters,
// a distinct sample of up to 4k items and an HLL of precision p (see
// NewHLL): exact up to k distinct items, about 208*k + 2^p bytes. It panics if k is out of [1, 2^20] or p out of
// [4, 18], which are programming errors.
func NewEntropy(k, p int) *Entropy {
	if k < 1 || k > maxTopK {
		panic("sketch: NewEntropy head size out of [1, 2^20]")
	}
	return &Entropy{head: newSpaceSaving(k, false), mice: newHashSample(entropySampleRatio * k), hll: NewHLL(p)}
}

// Update counts n more occurrences of key. Adding 0 is a no-op.
func (e *Entropy) Update(key string, n uint64) { e.UpdateHash(Hash64(key), n) }

// UpdateHash counts n more occurrences of the item whose 64-bit hash is h,
// normally Hash64 of the item. It does not allocate.
func (e *Entropy) UpdateHash(h, n uint64) {
	if e.hll == nil {
		panic("sketch: Entropy.Update on a zero Entropy; construct it with NewEntropy")
	}
	if n == 0 {
		return
	}
	before, after, evicted := e.head.add(h, "", n)
	e.s += xlogx(after) - xlogx(before) - xlogx(evicted)
	e.g = e.g + (after - before) - evicted
	e.mice.add(h, n)
	e.hll.InsertHash(h)
}

// Total returns N, the sum of every n passed to Update, including merged ones.
func (e *Entropy) Total() uint64 { return e.head.total }

// Exact reports whether every count is exact, so that Entropy and Distinct
// are exact: no more than k distinct items have been seen (and no merge has
// dropped any).
func (e *Entropy) Exact() bool { return e.g == e.head.total }

// Distinct returns the number of distinct items: exact while Exact reports
// true, else the HLL estimate (at least the number of head items).
func (e *Entropy) Distinct() uint64 {
	if e.Exact() {
		return uint64(len(e.head.nodes))
	}
	// An estimate is never more than the items seen.
	return min(max(e.hll.Estimate(), uint64(len(e.head.nodes))), e.Total())
}

// Entropy returns the estimated Shannon entropy of the items, in nats
// (divide by ln 2 for bits), between 0 and ln(Distinct()); 0 for an empty
// stream. It is O(1) while Exact; otherwise it reads the head, the sample and
// the HLL (tens of µs at k = 1000, p = 14). It does not allocate.
func (e *Entropy) Entropy() float64 {
	h, _ := e.entropy()
	return h
}

func (e *Entropy) entropy() (h float64, distinct uint64) {
	n := e.head.total
	if n == 0 {
		return 0, 0
	}
	s := e.s
	distinct = e.Distinct()
	if !e.Exact() {
		s = e.estimateS()
	}
	nf := float64(n)
	h = math.Log(nf) - s/nf
	return min(max(h, 0), math.Log(float64(max(distinct, 1)))), distinct
}

// estimateS estimates S = sum of c*ln(c) when the head has evicted items:
// the elephants, head items whose guaranteed count g exceeds the head's floor
// F (the most any untracked item can have), contribute g*ln(g); every other
// item is estimated from the distinct sample, each sampled item standing for
// 2^level items.
func (e *Entropy) estimateS() float64 {
	var s float64
	for i, nd := range e.head.nodes {
		if c := e.head.count(i); elephant(c, nd.err) {
			s += xlogx(c - nd.err/2)
		}
	}
	var mice float64
	for _, m := range e.mice.slots {
		if m.count == 0 {
			continue
		}
		if j := e.head.lookup(m.hash, ""); j >= 0 && elephant(e.head.count(int(j)), e.head.nodes[j].err) {
			continue // counted above
		}
		mice += xlogx(m.count)
	}
	return s + math.Ldexp(mice, e.mice.level)
}

// entropySampleRatio is the size of the distinct sample relative to the head.
const entropySampleRatio = 4

// elephantRatio: a head counter is used directly when its error is at most
// 1/elephantRatio of its guaranteed count.
const elephantRatio = 8

// elephant reports whether a head counter's count is known closely enough
// to be used directly: its error is at most 1/elephantRatio of its
// guaranteed count.
func elephant(count, err uint64) bool { return err <= (count-err)/elephantRatio }

// Normalized returns Entropy()/ln(Distinct()), in [0, 1]: 1 when every item
// is equally frequent, near 0 when one dominates. It is 0 when at most one
// distinct item has been seen.
func (e *Entropy) Normalized() float64 {
	h, d := e.entropy()
	if d <= 1 {
		return 0
	}
	return min(h/math.Log(float64(d)), 1)
}

// Merge folds o into e, so that e describes both streams: the heads merge as
// TopK.Merge describes (keeping e's k counters, deterministically), the
// samples take the higher level and add the counts of the items they share
// (exact, since an item is sampled by its hash in every partition), and the
// HLLs merge register by register. It returns an error wrapping ErrIncompatible,
// with e unchanged, if the HLL precisions differ. Merging sketches that are
// Exact and together saw at most k items gives an Exact sketch.
func (e *Entropy) Merge(o *Entropy) error {
	if e.hll == nil {
		panic("sketch: Entropy.Merge into a zero Entropy; construct it with NewEntropy")
	}
	if o == nil || o.hll == nil {
		return nil
	}
	if e.hll.p != o.hll.p {
		return fmt.Errorf("%w: entropy HLL precision %d cannot merge %d", ErrIncompatible, e.hll.p, o.hll.p)
	}
	_ = e.hll.Merge(o.hll)
	e.head.merge(&o.head)
	e.mice.merge(&o.mice)
	e.resum()
	return nil
}

// resum recomputes s and g from the head.
func (e *Entropy) resum() {
	e.s, e.g = 0, 0
	for i, nd := range e.head.nodes {
		g := e.head.count(i) - nd.err
		e.s += xlogx(g)
		e.g += g
	}
}

// Reset empties e, keeping its memory.
func (e *Entropy) Reset() {
	e.head.reset()
	e.mice.reset()
	e.hll.Reset()
	e.s, e.g = 0, 0
}

// Encoding of an Entropy, integers little-endian:
//
//	[0:4]   magic "SKEN"
//	[4]     format version, entropyVersion
//	[5:8]   reserved, zero
//	[8:12]  k, uint32
//	[12:16] number of head items n <= k, uint32
//	[16:24] total, uint64
//	[24:32] dropped bound of the head, uint64
//	[32:]   n items by count descending, then hash ascending: hash, count,
//	        err, uint64 each
//	then    the distinct sample: level (1 byte), 3 zero bytes, the number of
//	        sampled items m <= 4k (uint32), and m items by hash ascending:
//	        hash, count, uint64 each
//	then    the HLL's encoding (HLL.MarshalBinary)
const (
	entropyMagic      = "SKEN"
	entropyVersion    = 1
	entropyHeaderSize = 32
)

// MarshalBinary encodes e in a versioned binary format of
// 32+24*items+8+16*samples+8+2^p bytes. It implements encoding.BinaryMarshaler and returns an error only for
// a zero Entropy.
func (e *Entropy) MarshalBinary() ([]byte, error) {
	if e.hll == nil {
		return nil, fmt.Errorf("%w: cannot encode a zero Entropy; construct it with NewEntropy", ErrIncompatible)
	}
	its := e.head.items()
	b := make([]byte, entropyHeaderSize, entropyHeaderSize+24*len(its)+hllHeaderSize+len(e.hll.regs))
	copy(b, entropyMagic)
	b[4] = entropyVersion
	binary.LittleEndian.PutUint32(b[8:], uint32(e.head.k))
	binary.LittleEndian.PutUint32(b[12:], uint32(len(its)))
	binary.LittleEndian.PutUint64(b[16:], e.head.total)
	binary.LittleEndian.PutUint64(b[24:], e.head.dropped)
	for _, it := range its {
		b = binary.LittleEndian.AppendUint64(b, it.hash)
		b = binary.LittleEndian.AppendUint64(b, it.count)
		b = binary.LittleEndian.AppendUint64(b, it.err)
	}
	ms := e.mice.sorted()
	b = append(b, byte(e.mice.level), 0, 0, 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(ms)))
	for _, m := range ms {
		b = binary.LittleEndian.AppendUint64(b, m.hash)
		b = binary.LittleEndian.AppendUint64(b, m.count)
	}
	return e.hll.appendBinary(b), nil
}

// UnmarshalBinary replaces e with the estimator encoded in b by
// MarshalBinary. It returns an error wrapping ErrIncompatible for an unknown
// format version and one wrapping ErrCorrupt for a short or long encoding, a
// bad magic, a capacity out of [1, 2^20], more items than counters, items out
// of order or repeated, an item whose error exceeds its count, whose count
// exceeds the total or is below the dropped bound, guaranteed counts summing
// above the total, a sample that is too large, out of order, above its level
// or summing above the total, or a bad HLL. It never panics, allocates memory
// proportional to len(b) and leaves e unchanged on error.
func (e *Entropy) UnmarshalBinary(b []byte) error {
	if len(b) < entropyHeaderSize {
		return fmt.Errorf("%w: entropy header needs %d bytes, have %d", ErrCorrupt, entropyHeaderSize, len(b))
	}
	if string(b[:4]) != entropyMagic {
		return fmt.Errorf("%w: entropy magic %q, want %q; the bytes are not an Entropy", ErrCorrupt, b[:4], entropyMagic)
	}
	if b[4] != entropyVersion {
		return fmt.Errorf("%w: entropy format version %d, this build reads %d", ErrIncompatible, b[4], entropyVersion)
	}
	if b[5]|b[6]|b[7] != 0 {
		return fmt.Errorf("%w: entropy reserved header bytes are not zero", ErrCorrupt)
	}
	k := uint64(binary.LittleEndian.Uint32(b[8:]))
	n := uint64(binary.LittleEndian.Uint32(b[12:]))
	total := binary.LittleEndian.Uint64(b[16:])
	dropped := binary.LittleEndian.Uint64(b[24:])
	switch {
	case k < 1 || k > maxTopK:
		return fmt.Errorf("%w: entropy head size %d out of [1, 2^20]", ErrCorrupt, k)
	case n > k:
		return fmt.Errorf("%w: entropy has %d head items but %d counters", ErrCorrupt, n, k)
	case dropped > total:
		return fmt.Errorf("%w: entropy dropped bound %d exceeds total %d", ErrCorrupt, dropped, total)
	case n > uint64(len(b)-entropyHeaderSize)/24:
		return fmt.Errorf("%w: entropy says %d head items, %d bytes cannot hold them", ErrCorrupt, n, len(b)-entropyHeaderSize)
	}
	p := b[entropyHeaderSize:]
	items := make([]ssItem, n)
	var sumG uint64
	for i := range items {
		it := ssItem{hash: binary.LittleEndian.Uint64(p), count: binary.LittleEndian.Uint64(p[8:]), err: binary.LittleEndian.Uint64(p[16:])}
		p = p[24:]
		switch {
		case it.err > it.count:
			return fmt.Errorf("%w: entropy item %d error %d exceeds its count %d", ErrCorrupt, i, it.err, it.count)
		case it.count > total || it.count < dropped:
			return fmt.Errorf("%w: entropy item %d count %d outside [dropped %d, total %d]", ErrCorrupt, i, it.count, dropped, total)
		case i > 0 && compareItems(items[i-1], it) >= 0:
			return fmt.Errorf("%w: entropy item %d out of order or repeated", ErrCorrupt, i)
		}
		g := it.count - it.err
		if sumG+g < sumG || sumG+g > total {
			return fmt.Errorf("%w: entropy guaranteed counts sum above the total %d", ErrCorrupt, total)
		}
		sumG += g
		items[i] = it
	}
	if len(p) < 8 {
		return fmt.Errorf("%w: entropy sample header truncated", ErrCorrupt)
	}
	level, m := int(p[0]), uint64(binary.LittleEndian.Uint32(p[4:]))
	switch {
	case level > 64 || p[1]|p[2]|p[3] != 0:
		return fmt.Errorf("%w: entropy sample level %d out of [0, 64] or reserved bytes set", ErrCorrupt, level)
	case m > entropySampleRatio*k:
		return fmt.Errorf("%w: entropy sample of %d items, more than %d", ErrCorrupt, m, entropySampleRatio*k)
	case m > uint64(len(p)-8)/16:
		return fmt.Errorf("%w: entropy says %d sampled items, %d bytes cannot hold them", ErrCorrupt, m, len(p)-8)
	}
	p = p[8:]
	mice := newHashSample(int(m))
	mice.cap, mice.level = entropySampleRatio*int(k), level
	var prev, sum uint64
	for i := range m {
		h, c := binary.LittleEndian.Uint64(p), binary.LittleEndian.Uint64(p[8:])
		p = p[16:]
		switch {
		case i > 0 && h <= prev:
			return fmt.Errorf("%w: entropy sampled item %d out of order or repeated", ErrCorrupt, i)
		case sampleRank(h) < level:
			return fmt.Errorf("%w: entropy sampled item %d below the sample level %d", ErrCorrupt, i, level)
		case c == 0 || sum+c < sum || sum+c > total:
			return fmt.Errorf("%w: entropy sampled counts zero or summing above the total %d", ErrCorrupt, total)
		}
		prev, sum = h, sum+c
		mice.put(h, c)
	}
	hll := new(HLL)
	if err := hll.UnmarshalBinary(p); err != nil {
		return fmt.Errorf("entropy HLL: %w", err)
	}
	head := spaceSaving{k: int(k)}
	head.alloc(int(n))
	head.load(total, dropped, items)
	if !head.unique() {
		return fmt.Errorf("%w: entropy lists an item twice", ErrCorrupt)
	}
	*e = Entropy{head: head, mice: mice, hll: hll}
	e.resum()
	return nil
}
