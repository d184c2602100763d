package sketch

import (
	"fmt"
	"math"
	"slices"
	"testing"
)

// checkHeap verifies the internal invariants of t: the heap order, the
// positions stored in the nodes, the hash table and the stored keys.
func checkHeap(t *testing.T, tk *TopK) {
	t.Helper()
	checkSpaceSaving(t, &tk.s)
}

func checkSpaceSaving(t *testing.T, s *spaceSaving) {
	t.Helper()
	if len(s.heap) != len(s.nodes) || len(s.nodes) > s.k || (s.withKeys && len(s.keys) != len(s.nodes)) {
		t.Fatalf("sizes: heap %d nodes %d keys %d k %d", len(s.heap), len(s.nodes), len(s.keys), s.k)
	}
	if 2*len(s.nodes) > len(s.table) {
		t.Fatalf("table of %d slots holds %d nodes", len(s.table), len(s.nodes))
	}
	inTable := 0
	for _, e := range s.table {
		if e.node >= 0 {
			inTable++
			if s.nodes[e.node].hash != e.hash {
				t.Fatalf("table slot for node %d has hash %x, node has %x", e.node, e.hash, s.nodes[e.node].hash)
			}
		}
	}
	if inTable != len(s.nodes) {
		t.Fatalf("table holds %d nodes, want %d", inTable, len(s.nodes))
	}
	for p, he := range s.heap {
		nd := s.nodes[he.node]
		if int(nd.pos) != p {
			t.Fatalf("node %d at heap %d records pos %d", he.node, p, nd.pos)
		}
		var key string
		if s.withKeys {
			key = string(s.keys[he.node])
			if Hash64(key) != nd.hash {
				t.Fatalf("node %d key %q does not hash to %x", he.node, key, nd.hash)
			}
		}
		if j := s.lookup(nd.hash, key); j != he.node {
			t.Fatalf("lookup(%q) = %d; want %d", key, j, he.node)
		}
		if p > 0 && he.below(s.heap[(p-1)/2]) || he.hash != nd.hash {
			t.Fatalf("heap order broken at %d", p)
		}
		if he.count < s.dropped || nd.err > he.count {
			t.Fatalf("node %q count %d err %d dropped %d", key, he.count, nd.err, s.dropped)
		}
	}
}

func TestTopKExactUnderCapacity(t *testing.T) {
	tk := NewTopK(10)
	for _, e := range []struct {
		k string
		n uint64
	}{{"b", 2}, {"a", 2}, {"c", 5}, {"a", 1}, {"d", 0}} {
		tk.Add(e.k, e.n)
	}
	checkHeap(t, tk)
	want := []Item{{"c", 5, 0}, {"a", 3, 0}, {"b", 2, 0}}
	if got := tk.List(); !slices.Equal(got, want) {
		t.Errorf("List = %v, want %v", got, want)
	}
	if tk.Total() != 10 {
		t.Errorf("Total = %d, want 10", tk.Total())
	}
	tk.Reset()
	if len(tk.List()) != 0 || tk.Total() != 0 {
		t.Errorf("after Reset: List %v Total %d", tk.List(), tk.Total())
	}
	tk.Add("z", 1)
	if got := tk.List(); !slices.Equal(got, []Item{{"z", 1, 0}}) {
		t.Errorf("after Reset and Add: List = %v", got)
	}
}

func TestTopKEviction(t *testing.T) {
	tk := NewTopK(2)
	tk.Add("a", 5)
	tk.Add("b", 2)
	tk.Add("c", 1) // replaces b (the minimum, 2): count 3, err 2
	checkHeap(t, tk)
	want := []Item{{"a", 5, 0}, {"c", 3, 2}}
	if got := tk.List(); !slices.Equal(got, want) {
		t.Errorf("List = %v, want %v", got, want)
	}
	tk.Add("d", 1) // replaces c (3): count 4, err 3
	tk.Add("a", 1)
	want = []Item{{"a", 6, 0}, {"d", 4, 3}}
	if got := tk.List(); !slices.Equal(got, want) {
		t.Errorf("List = %v, want %v", got, want)
	}
}

func TestTopKAddDoesNotRetainKey(t *testing.T) {
	tk := NewTopK(4)
	buf := []byte("alpha")
	tk.Add(string(buf), 1) // a copy, but check the stored key is independent anyway
	b2 := []byte("beta!")
	key := unsafeString(b2)
	tk.Add(key, 2)
	copy(b2, "XXXXX")
	got := tk.List()
	if got[0].Key != "beta!" || got[1].Key != "alpha" {
		t.Errorf("List = %v: the stored key changed with the caller's buffer", got)
	}
}

func TestTopKTrackedAddAllocs(t *testing.T) {
	tk := NewTopK(100)
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
		tk.Add(keys[i], uint64(i+1))
	}
	i := 0
	if a := testing.AllocsPerRun(1000, func() { tk.Add(keys[i%100], 1); i++ }); a != 0 {
		t.Errorf("Add of a tracked key allocates %v times, want 0", a)
	}
	checkHeap(t, tk)
}

// checkTopK checks the Space-Saving guarantees of tk against exact counts:
// Count-Err <= true <= Count and Count-true <= N/k for every listed item, and
// every key with true count > phi*N is listed.
func checkTopK(t *testing.T, tk *TopK, exact []uint64, phi float64) {
	t.Helper()
	checkHeap(t, tk)
	var n uint64
	for _, v := range exact {
		n += v
	}
	if tk.Total() != n {
		t.Errorf("Total = %d, want %d", tk.Total(), n)
	}
	names := keyNames()
	listed := make(map[string]Item)
	items := tk.List()
	if !slices.IsSortedFunc(items, func(a, b Item) int {
		if a.Count != b.Count {
			return -cmpU(a.Count, b.Count)
		}
		return cmpS(a.Key, b.Key)
	}) {
		t.Error("List is not sorted by Count desc, Key asc")
	}
	maxErr := n / uint64(tk.K())
	for _, it := range items {
		listed[it.Key] = it
		var idx int
		if _, err := fmt.Sscanf(it.Key, "client-%d", &idx); err != nil {
			t.Fatalf("unexpected key %q", it.Key)
		}
		tr := exact[idx]
		if it.Count-it.Err > tr || tr > it.Count {
			t.Errorf("%s: true count %d outside [Count-Err, Count] = [%d, %d]", it.Key, tr, it.Count-it.Err, it.Count)
		}
		if it.Count-tr > maxErr {
			t.Errorf("%s: overestimate %d above N/k = %d", it.Key, it.Count-tr, maxErr)
		}
	}
	heavy := 0
	for i, v := range exact {
		if float64(v) > phi*float64(n) {
			heavy++
			if _, ok := listed[names[i]]; !ok {
				t.Errorf("heavy hitter %s (true %d > %.0f) not listed", names[i], v, phi*float64(n))
			}
		}
	}
	if heavy == 0 {
		t.Fatal("no heavy hitters in the stream: the test checks nothing")
	}
	t.Logf("k=%d: %d heavy hitters above phi=%v all listed; max error bound %d", tk.K(), heavy, phi, maxErr)
}

func cmpU(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func cmpS(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// With phi = 0.01 and eps = phi/10 = 0.001, k = 1/eps = 1000 counters must list
// every key above 1% of the stream, with counts within 0.1% of N.
func TestTopKHeavyHitters(t *testing.T) {
	const phi, k = 0.01, 1000
	stream, exact := stdStream()
	names := keyNames()
	tk := NewTopK(k)
	for _, i := range stream {
		tk.Add(names[i], 1)
	}
	checkTopK(t, tk, exact, phi)
	if got := len(tk.List()); got != k {
		t.Errorf("List has %d items, want %d", got, k)
	}
}

// TestTopKSmallPhi uses a lower threshold to get many heavy hitters, and
// weighted updates.
func TestTopKSmallPhi(t *testing.T) {
	const phi = 0.001
	stream, _ := stdStream()
	names := keyNames()
	exact := make([]uint64, zipfKeys)
	tk := NewTopK(int(math.Ceil(10 / phi)))
	for i, k := range stream {
		n := uint64(i%3 + 1)
		exact[k] += n
		tk.Add(names[k], n)
	}
	checkTopK(t, tk, exact, phi)
}

// eps-approximate heavy hitters: the keys whose Count exceeds phi*N.
func reported(tk *TopK, phi float64) map[string]bool {
	out := make(map[string]bool)
	for _, it := range tk.List() {
		if float64(it.Count) > phi*float64(tk.Total()) {
			out[it.Key] = true
		}
	}
	return out
}

func TestTopKMerge(t *testing.T) {
	const phi, k = 0.01, 1000
	stream, exact := stdStream()
	names := keyNames()
	whole := NewTopK(k)
	parts := make([]*TopK, 4)
	for i := range parts {
		parts[i] = NewTopK(k)
	}
	// Partition by position in contiguous quarters, so each part sees its own
	// sample of the Zipf stream.
	q := len(stream) / 4
	for i, key := range stream {
		whole.Add(names[key], 1)
		parts[min(i/q, 3)].Add(names[key], 1)
	}
	merged := NewTopK(k)
	for _, p := range parts {
		merged.Merge(p)
	}
	checkTopK(t, merged, exact, phi)

	// Both must report the same heavy hitters: every true one, and nothing
	// whose true count is below (phi-eps)*N, eps = 1/k.
	n := float64(len(stream))
	for name, s := range map[string]*TopK{"whole": whole, "merged": merged} {
		for key := range reported(s, phi) {
			var idx int
			fmt.Sscanf(key, "client-%d", &idx)
			if float64(exact[idx]) < (phi-1.0/k)*n {
				t.Errorf("%s reports %s with true count %d < (phi-eps)*N", name, key, exact[idx])
			}
		}
	}
	rw, rm := reported(whole, phi), reported(merged, phi)
	for key := range rw {
		if !rm[key] {
			t.Errorf("whole stream reports %s, the merge does not", key)
		}
	}
	for key := range rm {
		if !rw[key] {
			t.Errorf("the merge reports %s, the whole stream does not", key)
		}
	}
	t.Logf("whole and merged report %d heavy hitters", len(rw))

	// Merging in a different order or tree shape keeps the guarantees.
	left, right := NewTopK(k), NewTopK(k)
	left.Merge(parts[3])
	left.Merge(parts[1])
	right.Merge(parts[2])
	right.Merge(parts[0])
	left.Merge(right)
	checkTopK(t, left, exact, phi)

	// The merged sketch keeps counting correctly.
	for _, key := range stream[:100_000] {
		merged.Add(names[key], 1)
	}
	checkTopK(t, merged, addCounts(exact, exactCounts(stream[:100_000], zipfKeys)), phi)
}

func addCounts(a, b []uint64) []uint64 {
	out := slices.Clone(a)
	for i := range out {
		out[i] += b[i]
	}
	return out
}

// TestTopKMergeSmallerCapacity merges a full small sketch into an empty large
// one: keys the small one dropped may reappear and must still get counts that
// are not below their true counts.
func TestTopKMergeSmallerCapacity(t *testing.T) {
	stream, _ := stdStream()
	names := keyNames()
	s := stream[:50_000]
	small := NewTopK(10)
	for _, k := range s {
		small.Add(names[k], 1)
	}
	big := NewTopK(1000)
	big.Merge(small)
	if big.s.dropped == 0 {
		t.Fatal("merging a full sketch left dropped at 0")
	}
	rest := stream[50_000:100_000]
	for _, k := range rest {
		big.Add(names[k], 1)
	}
	exact := exactCounts(stream[:100_000], zipfKeys)
	checkHeap(t, big)
	for _, it := range big.List() {
		var idx int
		fmt.Sscanf(it.Key, "client-%d", &idx)
		if tr := exact[idx]; it.Count-it.Err > tr || tr > it.Count {
			t.Fatalf("%s: true count %d outside [%d, %d]", it.Key, tr, it.Count-it.Err, it.Count)
		}
	}
}

func TestTopKMergeEdgeCases(t *testing.T) {
	a := NewTopK(3)
	a.Add("x", 2)
	a.Add("y", 1)
	a.Merge(NewTopK(3)) // empty
	a.Merge(nil)
	if got, want := a.List(), []Item{{"x", 2, 0}, {"y", 1, 0}}; !slices.Equal(got, want) {
		t.Errorf("after merging empty: %v, want %v", got, want)
	}
	a.Merge(a)
	checkHeap(t, a)
	if got, want := a.List(), []Item{{"x", 4, 0}, {"y", 2, 0}}; !slices.Equal(got, want) || a.Total() != 6 {
		t.Errorf("after self-merge: %v total %d, want %v total 6", got, a.Total(), want)
	}
	// Neither full: counts add exactly; overflowing capacity keeps the top 3
	// (ties by key) and the dropped count bounds future new keys.
	b := NewTopK(3)
	b.Add("y", 1)
	b.Add("z", 2)
	a.Merge(b)
	checkHeap(t, a)
	if got, want := a.List(), []Item{{"x", 4, 0}, {"y", 3, 0}, {"z", 2, 0}}; !slices.Equal(got, want) {
		t.Errorf("after merge: %v, want %v", got, want)
	}
	// a is now full, so a key it does not track may have had up to its
	// minimum, 2, in a's stream: w is charged 2 on count and error, and z
	// (2) no longer fits.
	c := NewTopK(3)
	c.Add("w", 2)
	a.Merge(c)
	checkHeap(t, a)
	if got, want := a.List(), []Item{{"w", 4, 2}, {"x", 4, 0}, {"y", 3, 0}}; !slices.Equal(got, want) {
		t.Errorf("after overflowing merge: %v, want %v", got, want)
	}
	if a.s.dropped != 2 {
		t.Errorf("dropped = %d, want 2", a.s.dropped)
	}
}

func TestTopKPanics(t *testing.T) {
	for name, f := range map[string]func(){
		"NewTopK(0)": func() { NewTopK(0) },
		"zero Add":   func() { var tk TopK; tk.Add("a", 1) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s did not panic", name)
				}
			}()
			f()
		}()
	}
}

func BenchmarkTopKAdd(b *testing.B) {
	names := keyNames()
	stream := zipfStream(3, zipfKeys, 1<<20)
	keys := make([]string, len(stream))
	for i, k := range stream {
		keys[i] = names[k]
	}
	// Zipf over 100k keys with k=1000: most events hit a tracked key; the
	// rest take over a counter and copy their key (the only allocation).
	b.Run("zipf", func(b *testing.B) {
		tk := NewTopK(1000)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			tk.Add(keys[i&(len(keys)-1)], 1)
			i++
		}
	})
	// Only keys already tracked: must not allocate.
	b.Run("tracked", func(b *testing.B) {
		tk := NewTopK(1000)
		tracked := make([]string, 0, len(keys))
		for _, k := range keys {
			tk.Add(k, 1)
		}
		for _, k := range keys {
			if tk.s.lookup(Hash64(k), k) >= 0 {
				tracked = append(tracked, k)
			}
		}
		tracked = tracked[:1<<19]
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			tk.Add(tracked[i&(len(tracked)-1)], 1)
			i++
		}
	})
}

func BenchmarkTopKMerge(b *testing.B) {
	names := keyNames()
	stream := zipfStream(4, zipfKeys, 1<<18)
	x, y := NewTopK(1000), NewTopK(1000)
	for i, k := range stream {
		if i%2 == 0 {
			x.Add(names[k], 1)
		} else {
			y.Add(names[k], 1)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		m := NewTopK(1000)
		m.Merge(x)
		m.Merge(y)
	}
}
