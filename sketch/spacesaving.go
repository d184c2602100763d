package sketch

import (
	"cmp"
	"math/bits"
	"slices"
	"strings"
)

// spaceSaving is the Space-Saving core shared by TopK (which stores each key's
// bytes and compares them on a hash hit) and Entropy (which keys items by
// their 64-bit hash alone).
//
// It keeps up to k counters in three arrays that are allocated once and
// reused: nodes (a counter's hash and error), a binary min-heap by count
// (each entry holds the count inline, so the heap walk touches one array),
// and an open-addressing table with linear probing keyed by the 64-bit hash,
// with backward-shift deletion so that no tombstones accumulate. A key that
// takes over a counter reuses the counter's node, heap entry and (for TopK)
// key buffer, so an update does not allocate once the counters are filled.
type spaceSaving struct {
	k     int
	total uint64
	// dropped bounds the count of any key not tracked while fewer than k
	// counters are in use: 0, unless a Merge has dropped keys or merged in a
	// full sketch. Every tracked count is at least dropped.
	dropped uint64
	nodes   []ssNode
	heap    []ssHeapEnt // min-heap by count
	table   []ssSlot    // len is a power of two, at least 2*len(nodes)
	// keys[i] holds the key bytes of nodes[i] when withKeys; a takeover
	// copies the new key into the existing capacity.
	keys     [][]byte
	withKeys bool
	// arena backs the first key buffers, keyStride bytes per counter, so
	// that filling the counters does not allocate per key.
	arena []byte
}

const keyStride = 16

type ssNode struct {
	hash uint64
	err  uint64
	pos  int32 // position in heap
}

type ssHeapEnt struct {
	count uint64
	hash  uint64 // breaks ties, so the state is a function of the contents
	node  int32
}

// below reports whether a sorts before b in the heap: by count, then hash.
// With the tie broken, the counter a takeover picks depends only on the
// tracked counts and keys, not on the order of past updates, so a decoded or
// merged sketch evolves exactly as the original would.
func (a ssHeapEnt) below(b ssHeapEnt) bool {
	return a.count < b.count || (a.count == b.count && a.hash < b.hash)
}

type ssSlot struct {
	hash uint64
	node int32 // -1 when empty
}

// tableSize returns the table length for n counters: a power of two with a
// load factor of at most 1/2.
func tableSize(n int) int {
	n = max(2*n, 16)
	return 1 << bits.Len(uint(n-1))
}

func newSpaceSaving(k int, withKeys bool) spaceSaving {
	s := spaceSaving{k: k, withKeys: withKeys}
	s.alloc(k)
	if withKeys {
		s.arena = make([]byte, 0, keyStride*k)
	}
	return s
}

// alloc sizes the arrays for n counters (n <= k); later counters grow them
// on demand.
func (s *spaceSaving) alloc(n int) {
	s.nodes = make([]ssNode, 0, n)
	s.heap = make([]ssHeapEnt, 0, n)
	s.table = make([]ssSlot, tableSize(n))
	for i := range s.table {
		s.table[i].node = -1
	}
	if s.withKeys {
		s.keys = make([][]byte, 0, n)
	}
}

// lookup returns the node tracking (h, key), or -1. key is ignored without
// keys.
func (s *spaceSaving) lookup(h uint64, key string) int32 {
	mask := uint64(len(s.table) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		e := s.table[i]
		if e.node < 0 {
			return -1
		}
		if e.hash == h && (!s.withKeys || string(s.keys[e.node]) == key) {
			return e.node
		}
	}
}

// add counts n (> 0) more for (h, key), returning the node's guaranteed
// count (count-err) before and after the update; both are equal to the
// new key's count minus its inherited error on a takeover, where before is
// reported as 0 and evicted as the evicted counter's guaranteed count.
func (s *spaceSaving) add(h uint64, key string, n uint64) (before, after, evicted uint64) {
	s.total = satAdd(s.total, n)
	mask := uint64(len(s.table) - 1)
	i := h & mask
	for ; ; i = (i + 1) & mask {
		e := s.table[i]
		if e.node < 0 {
			break
		}
		if e.hash == h && (!s.withKeys || string(s.keys[e.node]) == key) {
			nd := &s.nodes[e.node]
			p := nd.pos
			c := s.heap[p].count
			s.heap[p].count = satAdd(c, n)
			s.down(int(p))
			return c - nd.err, satAdd(c, n) - nd.err, 0
		}
	}
	if len(s.nodes) < s.k {
		if 2*(len(s.nodes)+1) > len(s.table) {
			s.growTable()
		}
		idx := int32(len(s.nodes))
		s.nodes = append(s.nodes, ssNode{hash: h, err: s.dropped, pos: int32(len(s.heap))})
		s.heap = append(s.heap, ssHeapEnt{count: satAdd(s.dropped, n), hash: h, node: idx})
		if s.withKeys {
			s.setKey(int(idx), key)
		}
		s.insertTable(h, idx)
		s.up(len(s.heap) - 1)
		return 0, satAdd(s.dropped, n) - s.dropped, 0
	}
	// Space-Saving: the new key replaces the key with the smallest count,
	// inheriting that count as its error.
	top := &s.heap[0]
	idx := top.node
	nd := &s.nodes[idx]
	evicted = top.count - nd.err
	s.deleteTable(nd.hash, idx)
	nd.hash = h
	top.hash = h
	nd.err = top.count
	top.count = satAdd(top.count, n)
	after = top.count - nd.err
	if s.withKeys {
		s.keys[idx] = append(s.keys[idx][:0], key...)
	}
	s.insertTable(h, idx)
	s.down(0)
	return 0, after, evicted
}

// setKey stores key as the key of node i, which is at most len(s.keys),
// reusing the buffer a reset left in the backing array.
func (s *spaceSaving) setKey(i int, key string) {
	if i < cap(s.keys) {
		s.keys = s.keys[:max(len(s.keys), i+1)]
		if s.keys[i] != nil {
			s.keys[i] = append(s.keys[i][:0], key...)
			return
		}
		s.keys[i] = s.newKeyBuf(key)
		return
	}
	s.keys = append(s.keys, s.newKeyBuf(key))
}

// newKeyBuf returns a buffer holding key, carved from the arena when it fits.
func (s *spaceSaving) newKeyBuf(key string) []byte {
	if len(key) <= keyStride && len(s.arena)+keyStride <= cap(s.arena) {
		o := len(s.arena)
		s.arena = s.arena[:o+keyStride]
		return append(s.arena[o:o:o+keyStride], key...)
	}
	return append(make([]byte, 0, max(len(key), keyStride)), key...)
}

func (s *spaceSaving) insertTable(h uint64, idx int32) {
	mask := uint64(len(s.table) - 1)
	i := h & mask
	for s.table[i].node >= 0 {
		i = (i + 1) & mask
	}
	s.table[i] = ssSlot{hash: h, node: idx}
}

// deleteTable removes node idx, whose hash is h, from the table with
// backward-shift deletion (Knuth, TAOCP vol. 3, 6.4, Algorithm R).
func (s *spaceSaving) deleteTable(h uint64, idx int32) {
	mask := uint64(len(s.table) - 1)
	i := h & mask
	for s.table[i].node != idx {
		i = (i + 1) & mask
	}
	for {
		s.table[i].node = -1
		j := i
		for {
			j = (j + 1) & mask
			e := s.table[j]
			if e.node < 0 {
				return
			}
			home := e.hash & mask
			// e may move to i unless its home lies cyclically in (i, j].
			if i <= j {
				if i < home && home <= j {
					continue
				}
			} else if i < home || home <= j {
				continue
			}
			s.table[i] = e
			i = j
			break
		}
	}
}

func (s *spaceSaving) growTable() {
	old := s.table
	s.table = make([]ssSlot, 2*len(old))
	for i := range s.table {
		s.table[i].node = -1
	}
	for _, e := range old {
		if e.node >= 0 {
			s.insertTable(e.hash, e.node)
		}
	}
}

func (s *spaceSaving) swap(a, b int) {
	h := s.heap
	h[a], h[b] = h[b], h[a]
	s.nodes[h[a].node].pos = int32(a)
	s.nodes[h[b].node].pos = int32(b)
}

func (s *spaceSaving) up(j int) {
	for j > 0 {
		p := (j - 1) / 2
		if !s.heap[j].below(s.heap[p]) {
			break
		}
		s.swap(j, p)
		j = p
	}
}

func (s *spaceSaving) down(j int) {
	h := s.heap
	n := len(h)
	for {
		l := 2*j + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && h[r].below(h[l]) {
			m = r
		}
		if !h[m].below(h[j]) {
			return
		}
		s.swap(j, m)
		j = m
	}
}

// floor is an upper bound on the true count of any key s does not track: the
// smallest count once all k counters are in use, and dropped before.
func (s *spaceSaving) floor() uint64 {
	if len(s.nodes) < s.k {
		return s.dropped
	}
	return s.heap[0].count
}

// count returns the count of node i.
func (s *spaceSaving) count(i int) uint64 { return s.heap[s.nodes[i].pos].count }

// ssItem is a counter outside the core: a merge candidate or a decoded one.
type ssItem struct {
	hash       uint64
	count, err uint64
	key        string
}

// compareItems orders by count descending, then key, then hash ascending: a
// total order on distinct items, so merges and encodings are deterministic.
func compareItems(a, b ssItem) int {
	if c := cmp.Compare(b.count, a.count); c != 0 {
		return c
	}
	if c := strings.Compare(a.key, b.key); c != 0 {
		return c
	}
	return cmp.Compare(a.hash, b.hash)
}

// items returns the counters, sorted by compareItems. Keys are copied.
func (s *spaceSaving) items() []ssItem {
	out := make([]ssItem, len(s.nodes))
	for i, nd := range s.nodes {
		out[i] = ssItem{hash: nd.hash, count: s.count(i), err: nd.err}
		if s.withKeys {
			out[i].key = string(s.keys[i])
		}
	}
	slices.SortFunc(out, compareItems)
	return out
}

// merge folds o into s as described on TopK.Merge.
func (s *spaceSaving) merge(o *spaceSaving) {
	if o.total == 0 {
		return
	}
	floorS, floorO := s.floor(), o.floor()
	cands := make([]ssItem, 0, len(s.nodes)+len(o.nodes))
	for _, it := range s.items() {
		var key string
		if s.withKeys {
			key = it.key
		}
		if j := o.lookup(it.hash, key); j >= 0 {
			it.count = satAdd(it.count, o.count(int(j)))
			it.err = satAdd(it.err, o.nodes[j].err)
		} else {
			it.count = satAdd(it.count, floorO)
			it.err = satAdd(it.err, floorO)
		}
		cands = append(cands, it)
	}
	for _, it := range o.items() {
		if s.lookup(it.hash, it.key) >= 0 {
			continue
		}
		it.count = satAdd(it.count, floorS)
		it.err = satAdd(it.err, floorS)
		cands = append(cands, it)
	}
	slices.SortFunc(cands, compareItems)
	// Every candidate count is at least floorS+floorO, so that sum bounds any
	// key neither side tracks; a candidate that does not fit raises the bound.
	dropped := satAdd(floorS, floorO)
	if len(cands) > s.k {
		dropped = cands[s.k].count
		cands = cands[:s.k]
	}
	s.load(satAdd(s.total, o.total), dropped, cands)
}

// load replaces the counters with items, sorted by compareItems, reusing the
// memory where it can.
func (s *spaceSaving) load(total, dropped uint64, items []ssItem) {
	if cap(s.nodes) < len(items) || cap(s.heap) < len(items) || len(s.table) < tableSize(len(items)) || (s.withKeys && cap(s.keys) < len(items)) {
		s.alloc(len(items))
	}
	s.nodes = s.nodes[:0]
	s.heap = s.heap[:0]
	for i := range s.table {
		s.table[i].node = -1
	}
	if s.withKeys {
		s.keys = s.keys[:0]
	}
	n := len(items)
	for i, it := range items {
		s.nodes = append(s.nodes, ssNode{hash: it.hash, err: it.err})
		if s.withKeys {
			s.setKey(i, it.key)
		}
		s.insertTable(it.hash, int32(i))
	}
	s.heap = s.heap[:n]
	for i, it := range items {
		s.heap[i] = ssHeapEnt{count: it.count, hash: it.hash, node: int32(i)}
	}
	// Sorted ascending by (count, hash) the array is a valid min-heap.
	slices.SortFunc(s.heap, func(a, b ssHeapEnt) int {
		if a.below(b) {
			return -1
		}
		if b.below(a) {
			return 1
		}
		return cmp.Compare(a.node, b.node)
	})
	for p, e := range s.heap {
		s.nodes[e.node].pos = int32(p)
	}
	s.total, s.dropped = total, dropped
}

func (s *spaceSaving) reset() {
	s.nodes = s.nodes[:0]
	s.heap = s.heap[:0]
	for i := range s.table {
		s.table[i].node = -1
	}
	if s.withKeys {
		s.keys = s.keys[:0] // the buffers stay in the backing array for reuse
	}
	s.total, s.dropped = 0, 0
}

// unique reports whether every counter is found by lookup, that is, no key
// (or, without keys, no hash) is tracked twice. Decoders check it.
func (s *spaceSaving) unique() bool {
	for i, nd := range s.nodes {
		var key string
		if s.withKeys {
			key = string(s.keys[i])
		}
		if s.lookup(nd.hash, key) != int32(i) {
			return false
		}
	}
	return true
}
