package sketch

import (
	"cmp"
	"slices"
	"strings"
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
// Most callers want NewTopK, then Add on each event and List to read the heavy
// hitters. Add runs in O(log k) time (a min-heap over the counters, and a map
// from key to counter) and does not allocate for a key already tracked; a key
// that takes over a counter costs one string copy.
//
// The zero value has no counters and is not usable: Add and Merge panic on
// it. Construct one with NewTopK.
//
// A TopK is not safe for concurrent use: give each one a single owner or guard
// it with a mutex.
type TopK struct {
	k     int
	total uint64
	// dropped bounds the count of any key not tracked while fewer than k
	// counters are in use: 0, unless a Merge has dropped keys or merged in a
	// full sketch. Every tracked count is at least dropped.
	dropped uint64
	// nodes holds the counters; a node keeps its index for life, so index
	// never changes when the heap moves nodes.
	nodes []topNode
	// heap is a min-heap by count of indexes into nodes.
	heap  []int32
	index map[string]int32 // key -> index into nodes
}

type topNode struct {
	key        string
	count, err uint64
	pos        int32 // position in heap
}

// NewTopK returns an empty TopK with k counters, using about 100*k bytes plus
// the tracked keys. It panics if k < 1 or k > 2^30.
func NewTopK(k int) *TopK {
	if k < 1 || k > 1<<30 {
		panic("sketch: NewTopK capacity out of [1, 2^30]")
	}
	return &TopK{
		k:     k,
		nodes: make([]topNode, 0, k),
		heap:  make([]int32, 0, k),
		index: make(map[string]int32, k),
	}
}

// Add counts n more events for key. Adding 0 is a no-op. Counts and Total
// saturate at the largest uint64 instead of wrapping.
//
// Add does not retain key: when key takes over a counter it is copied once, so
// key may point into a reused buffer.
func (t *TopK) Add(key string, n uint64) {
	if t.k == 0 {
		panic("sketch: TopK.Add on a zero TopK; construct it with NewTopK")
	}
	if n == 0 {
		return
	}
	t.total = satAdd(t.total, n)
	if i, ok := t.index[key]; ok {
		nd := &t.nodes[i]
		nd.count = satAdd(nd.count, n)
		t.down(int(nd.pos))
		return
	}
	key = strings.Clone(key)
	if len(t.nodes) < t.k {
		i := int32(len(t.nodes))
		t.nodes = append(t.nodes, topNode{key: key, count: satAdd(t.dropped, n), err: t.dropped, pos: int32(len(t.heap))})
		t.heap = append(t.heap, i)
		t.index[key] = i
		t.up(len(t.heap) - 1)
		return
	}
	// Space-Saving: the new key replaces the key with the smallest count,
	// inheriting that count as its error.
	i := t.heap[0]
	nd := &t.nodes[i]
	delete(t.index, nd.key)
	nd.key = key
	nd.err = nd.count
	nd.count = satAdd(nd.count, n)
	t.index[key] = i
	t.down(0)
}

func (t *TopK) less(a, b int) bool {
	return t.nodes[t.heap[a]].count < t.nodes[t.heap[b]].count
}

func (t *TopK) swap(a, b int) {
	h := t.heap
	h[a], h[b] = h[b], h[a]
	t.nodes[h[a]].pos = int32(a)
	t.nodes[h[b]].pos = int32(b)
}

func (t *TopK) up(j int) {
	for j > 0 {
		p := (j - 1) / 2
		if !t.less(j, p) {
			break
		}
		t.swap(j, p)
		j = p
	}
}

func (t *TopK) down(j int) {
	n := len(t.heap)
	for {
		l := 2*j + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && t.less(r, l) {
			m = r
		}
		if !t.less(m, j) {
			return
		}
		t.swap(j, m)
		j = m
	}
}

// floor is an upper bound on the true count of any key t does not track: the
// smallest count once all k counters are in use, and dropped before (0 unless
// a merge dropped keys).
func (t *TopK) floor() uint64 {
	if len(t.nodes) < t.k {
		return t.dropped
	}
	return t.nodes[t.heap[0]].count
}

// List returns the tracked keys, at most k of them, sorted by Count
// descending and then by Key ascending, so equal sketches list identically.
// The slice is newly allocated and the caller owns it. To get the keys above
// a fraction phi of the stream, keep the items with Count > phi*Total(); those
// with Count-Err > phi*Total() are certainly above it.
func (t *TopK) List() []Item {
	items := make([]Item, len(t.nodes))
	for i, nd := range t.nodes {
		items[i] = Item{Key: nd.key, Count: nd.count, Err: nd.err}
	}
	sortItems(items)
	return items
}

func sortItems(items []Item) {
	slices.SortFunc(items, func(a, b Item) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
}

// Total returns N, the sum of every n passed to Add, including those merged in
// (saturating at the largest uint64).
func (t *TopK) Total() uint64 { return t.total }

// Merge folds o into t, so that t summarises both streams with t's capacity;
// o is not modified, and o may have a different capacity.
//
// For each key tracked by either sketch the counts and errors are added; a key
// missing from one side is charged, on both its count and its error, the most
// it can have had there: that side's smallest count once all its counters are
// in use, and otherwise 0 (unless an earlier merge dropped keys from it). The k largest results are kept (ties broken by key). This is the
// Space-Saving form of the merge of Agarwal et al. (2012), as analysed by
// Cafaro, Pulimeno & Tempesta ("A parallel space saving algorithm for frequent
// items and the Hurwitz zeta distribution", Information Sciences 2016):
// Count-Err <= true <= Count still holds and, for sketches of equal capacity,
// the counts still sum to at most Total(), so every error stays within
// Total()/k and every key above Total()/k stays tracked.
//
// If o has fewer counters than t, the error bound after the merge is that of
// the smaller capacity, Total()/min(k, k').
//
// Merge runs in O((k+k') log(k+k')) and allocates. t.Merge(t) doubles every
// count.
func (t *TopK) Merge(o *TopK) {
	if t.k == 0 {
		panic("sketch: TopK.Merge into a zero TopK; construct it with NewTopK")
	}
	if o == nil || o.total == 0 {
		return
	}
	floorT, floorO := t.floor(), o.floor()
	cands := make([]Item, 0, len(t.nodes)+len(o.nodes))
	for _, nd := range t.nodes {
		it := Item{Key: nd.key, Count: nd.count, Err: nd.err}
		if j, ok := o.index[nd.key]; ok {
			it.Count = satAdd(it.Count, o.nodes[j].count)
			it.Err = satAdd(it.Err, o.nodes[j].err)
		} else {
			it.Count = satAdd(it.Count, floorO)
			it.Err = satAdd(it.Err, floorO)
		}
		cands = append(cands, it)
	}
	for _, nd := range o.nodes {
		if _, ok := t.index[nd.key]; ok {
			continue
		}
		// Strings are immutable and o owns its copy, so sharing it is safe.
		cands = append(cands, Item{Key: nd.key, Count: satAdd(nd.count, floorT), Err: satAdd(nd.err, floorT)})
	}
	sortItems(cands)
	// Every candidate count is at least floorT+floorO, so that sum bounds any
	// key neither side tracks; a candidate that does not fit raises the bound.
	dropped := satAdd(floorT, floorO)
	if len(cands) > t.k {
		dropped = cands[t.k].Count
		cands = cands[:t.k]
	}

	total := satAdd(t.total, o.total)
	t.nodes = t.nodes[:0]
	t.heap = t.heap[:0]
	clear(t.index)
	for i, it := range cands {
		t.nodes = append(t.nodes, topNode{key: it.Key, count: it.Count, err: it.Err, pos: int32(i)})
		t.heap = append(t.heap, int32(i))
		t.index[it.Key] = int32(i)
	}
	// cands is sorted by count descending; reversing the heap order gives an
	// ascending array, which is already a valid min-heap.
	slices.Reverse(t.heap)
	for p, i := range t.heap {
		t.nodes[i].pos = int32(p)
	}
	t.total = total
	t.dropped = dropped
}

// Reset forgets every key and sets the total to zero, keeping the capacity
// and the memory.
func (t *TopK) Reset() {
	clear(t.nodes[:cap(t.nodes)]) // drop key strings for the GC
	t.nodes = t.nodes[:0]
	t.heap = t.heap[:0]
	clear(t.index)
	t.total = 0
	t.dropped = 0
}
