package sketch

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"
)

// TestTopKTakeoverAllocs: once the counters are in use, updates on a Zipf
// stream, a quarter of which take over a counter, do not allocate.
func TestTopKTakeoverAllocs(t *testing.T) {
	names := keyNames()
	stream, _ := stdStream()
	tk := NewTopK(1000)
	for _, k := range stream[:200_000] {
		tk.Add(names[k], 1)
	}
	before := tk.List()
	i := 200_000
	if a := testing.AllocsPerRun(100_000, func() { tk.Add(names[stream[i]], 1); i++ }); a != 0 {
		t.Errorf("Add allocates %v times per update on a Zipf stream", a)
	}
	// The measured updates did take over counters.
	after := tk.List()
	gone := 0
	for _, it := range before {
		if !slices.ContainsFunc(after, func(o Item) bool { return o.Key == it.Key }) {
			gone++
		}
	}
	if gone == 0 {
		t.Error("no key was replaced: the test does not exercise takeovers")
	}
	checkHeap(t, tk)
}

// TestTopKSmallCapacityInvariants drives many takeovers through a small table
// (deletions with backward shifts) and checks every invariant as it goes.
func TestTopKSmallCapacityInvariants(t *testing.T) {
	names := keyNames()
	stream, _ := stdStream()
	for _, k := range []int{1, 2, 7, 50} {
		tk := NewTopK(k)
		for i, key := range stream[:50_000] {
			tk.Add(names[key], uint64(1+i%3))
			if i%997 == 0 {
				checkHeap(t, tk)
			}
		}
		checkHeap(t, tk)
		var sum uint64
		for _, it := range tk.List() {
			sum += it.Count
		}
		if sum != tk.Total() {
			t.Errorf("k=%d: counts sum to %d, want Total %d (Space-Saving keeps the sum)", k, sum, tk.Total())
		}
	}
}

// TestSpaceSavingHashCollision: two keys with the same 64-bit hash are
// distinct counters, and deleting one leaves the other findable.
func TestSpaceSavingHashCollision(t *testing.T) {
	s := newSpaceSaving(2, true)
	s.add(42, "a", 5)
	s.add(42, "b", 3)
	s.add(42, "a", 1)
	if j := s.lookup(42, "a"); j < 0 || s.count(int(j)) != 6 {
		t.Fatalf("a: node %d", j)
	}
	if j := s.lookup(42, "b"); j < 0 || s.count(int(j)) != 3 {
		t.Fatalf("b: node %d", j)
	}
	s.add(43, "c", 1) // takes over b (3): count 4, err 3
	if s.lookup(42, "b") >= 0 {
		t.Error("b still tracked after its counter was taken over")
	}
	if j := s.lookup(42, "a"); j < 0 || s.count(int(j)) != 6 {
		t.Errorf("a lost after deleting b")
	}
	if j := s.lookup(43, "c"); j < 0 || s.count(int(j)) != 4 || s.nodes[j].err != 3 {
		t.Errorf("c: node %d", j)
	}
}

func zipfTopK(k, n int, seed uint64) *TopK {
	names := keyNames()
	tk := NewTopK(k)
	for _, key := range zipfStream(seed, zipfKeys, n) {
		tk.Add(names[key], 1)
	}
	return tk
}

func TestTopKMarshalRoundTrip(t *testing.T) {
	for _, tk := range []*TopK{NewTopK(3), zipfTopK(5, 10, 9), zipfTopK(1000, 200_000, 7)} {
		b := mustMarshal(t, tk)
		var got TopK
		if err := got.UnmarshalBinary(b); err != nil {
			t.Fatal(err)
		}
		checkHeap(t, &got)
		if got.K() != tk.K() || got.Total() != tk.Total() || !slices.Equal(got.List(), tk.List()) {
			t.Fatalf("round trip: k %d total %d, want k %d total %d", got.K(), got.Total(), tk.K(), tk.Total())
		}
		sameEncoding(t, &got, b)
		// The decoded sketch evolves exactly like the original.
		names := keyNames()
		for _, key := range zipfStream(10, zipfKeys, 20_000) {
			tk.Add(names[key], 1)
			got.Add(names[key], 1)
		}
		checkHeap(t, &got)
		if !slices.Equal(got.List(), tk.List()) {
			t.Fatal("decoded sketch diverges from the original under the same updates")
		}
	}
}

// TestTopKMergeDeterministic: the same merges in the same order give the
// same bytes, whatever the insertion history of the receiving sketch.
func TestTopKMergeDeterministic(t *testing.T) {
	parts := []*TopK{zipfTopK(100, 30_000, 21), zipfTopK(100, 30_000, 22), zipfTopK(50, 30_000, 23)}
	var enc [][]byte
	for range 2 {
		m := NewTopK(100)
		m.Add("warm", 1) // a different start, reset away
		m.Reset()
		for _, p := range parts {
			m.Merge(p)
		}
		checkHeap(t, m)
		enc = append(enc, mustMarshal(t, m))
	}
	if !bytes.Equal(enc[0], enc[1]) {
		t.Error("two identical merge sequences encode differently")
	}
}

func TestTopKUnmarshalErrors(t *testing.T) {
	tk := NewTopK(4)
	tk.Add("a", 5)
	tk.Add("b", 5)
	good := mustMarshal(t, tk)
	mod := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	put32 := func(off int, v uint32) []byte {
		return mod(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[off:], v); return b })
	}
	put64 := func(off int, v uint64) []byte {
		return mod(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[off:], v); return b })
	}
	// Items start at 32: "a" (count 5, err 0, len 1, 'a') then "b".
	for _, tc := range []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, ErrCorrupt},
		{"short header", good[:20], ErrCorrupt},
		{"magic", mod(func(b []byte) []byte { b[0] = 'X'; return b }), ErrCorrupt},
		{"version", mod(func(b []byte) []byte { b[4] = 9; return b }), ErrIncompatible},
		{"reserved", mod(func(b []byte) []byte { b[6] = 1; return b }), ErrCorrupt},
		{"k zero", put32(8, 0), ErrCorrupt},
		{"k huge", put32(8, 1<<31), ErrCorrupt},
		{"more items than k", put32(12, 5), ErrCorrupt},
		{"items beyond bytes", mod(func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[8:], 1<<30)
			binary.LittleEndian.PutUint32(b[12:], 1<<30)
			return b
		}), ErrCorrupt},
		{"dropped above total", put64(24, 100), ErrCorrupt},
		{"count above total", put64(32, 11), ErrCorrupt},
		{"err above count", put64(40, 6), ErrCorrupt},
		{"count below dropped", put64(24, 6), ErrCorrupt},
		{"out of order", mod(func(b []byte) []byte { b[32+17] = 'c'; return b }), ErrCorrupt},
		{"key twice", mod(func(b []byte) []byte { b[50] = 4; b[67] = 'a'; return b }), ErrCorrupt},
		{"key length too long", mod(func(b []byte) []byte { b[32+16] = 100; return b }), ErrCorrupt},
		{"truncated", good[:len(good)-1], ErrCorrupt},
		{"trailing", append(bytes.Clone(good), 0), ErrCorrupt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := NewTopK(2)
			got.Add("keep", 1)
			err := got.UnmarshalBinary(tc.b)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if l := got.List(); len(l) != 1 || l[0].Key != "keep" || got.K() != 2 {
				t.Error("failed UnmarshalBinary changed the sketch")
			}
		})
	}
	var zero TopK
	if _, err := zero.MarshalBinary(); !errors.Is(err, ErrIncompatible) {
		t.Errorf("zero TopK MarshalBinary err = %v", err)
	}
}

func FuzzTopKUnmarshal(f *testing.F) {
	f.Add(mustMarshal(f, NewTopK(1)))
	f.Add(mustMarshal(f, zipfTopK(3, 50, 1)))
	f.Add(mustMarshal(f, zipfTopK(8, 5, 2)))
	f.Add([]byte{})
	f.Add([]byte("SKTK\x01\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var tk TopK
		if !decoded(t, tk.UnmarshalBinary(b)) {
			return
		}
		checkHeap(t, &tk)
		out := mustMarshal(t, &tk)
		if !bytes.Equal(out, b) {
			t.Fatalf("re-encoding differs:\n in  %x\n out %x", b, out)
		}
		tk.Add(strings.Repeat("k", len(b)%40), 1)
		tk.Add("x", 2)
		checkHeap(t, &tk)
		tk.Merge(&tk)
		checkHeap(t, &tk)
	})
}
