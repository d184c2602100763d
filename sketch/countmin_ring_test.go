package sketch

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

// TestCountMinRingWindow steps through synthetic event times: 4 intervals of
// 10 s.
func TestCountMinRingWindow(t *testing.T) {
	r, err := NewCountMinRing(0.01, 0.01, 4, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	a, b := Hash64("a"), Hash64("b")
	for _, st := range []struct {
		step      string
		at        float64 // seconds
		key       uint64
		n         uint64
		accepted  bool
		wantA     uint64
		wantTotal uint64
	}{
		{"first", 0, a, 3, true, 3, 3},
		{"same interval", 9.9, a, 1, true, 4, 4},
		{"next interval", 10, b, 5, true, 4, 9},
		{"last live interval", 39.9, a, 2, true, 6, 11},
		{"rotation drops [0,10)", 40, b, 1, true, 2, 8},
		{"too old", 5, a, 7, false, 2, 8},
		{"late but live", 15, a, 7, true, 9, 15},
		{"jump beyond the window", 500, b, 1, true, 0, 1},
	} {
		if got := r.Add(at(st.at), st.key, st.n); got != st.accepted {
			t.Errorf("%s: Add accepted %v, want %v", st.step, got, st.accepted)
		}
		if got := r.Estimate(a); got != st.wantA {
			t.Errorf("%s: Estimate(a) = %d, want %d", st.step, got, st.wantA)
		}
		if got := r.Total(); got != st.wantTotal {
			t.Errorf("%s: Total = %d, want %d", st.step, got, st.wantTotal)
		}
	}
	r.Advance(at(530)) // 500 s is still live: [500,510) .. [530,540)
	if r.Estimate(b) != 1 {
		t.Errorf("Estimate(b) after Advance inside the window = %d", r.Estimate(b))
	}
	r.Advance(at(540))
	if r.Estimate(b) != 0 || r.Total() != 0 {
		t.Errorf("after Advance past the window: Estimate %d Total %d", r.Estimate(b), r.Total())
	}
	if r.Window() != 40*time.Second {
		t.Errorf("Window = %v", r.Window())
	}
	if r.Add(at(-1e6), a, 1) || r.Total() != 0 {
		t.Error("Add accepted an event older than the window")
	}
}

// TestCountMinRingAccuracy feeds the Zipf stream over 10 minutes of event
// time into a ring of 6 one-minute intervals and checks the live window
// against exact counts of the events in it: no estimate below the true count
// and at most delta of the keys above true + epsilon*N.
func TestCountMinRingAccuracy(t *testing.T) {
	const eps, delta = 0.001, 0.01
	stream, _ := stdStream()
	hashes := keyHashes()
	r, err := NewCountMinRing(eps, delta, 6, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	span := 10 * time.Minute
	ts := func(i int) time.Time { return t0.Add(span * time.Duration(i) / time.Duration(len(stream))) }
	for i, k := range stream {
		r.Add(ts(i), hashes[k], 1)
	}
	// The live window: the intervals from (last epoch - 5) on.
	last := ts(len(stream) - 1).Truncate(time.Minute)
	from := last.Add(-5 * time.Minute)
	exact := make([]uint64, zipfKeys)
	var n uint64
	for i, k := range stream {
		if !ts(i).Before(from) {
			exact[k]++
			n++
		}
	}
	if r.Total() != n {
		t.Fatalf("Total = %d, want %d events in the window", r.Total(), n)
	}
	over := 0
	for k, want := range exact {
		got := r.Estimate(hashes[k])
		if got < want {
			t.Fatalf("key %d: estimate %d below true %d", k, got, want)
		}
		if float64(got) > float64(want)+eps*float64(n) {
			over++
		}
	}
	if float64(over) > delta*zipfKeys {
		t.Errorf("%d of %d keys above true + eps*N, more than delta", over, zipfKeys)
	}
	t.Logf("window of %d events: %d keys above true + eps*N", n, over)
}

func TestCountMinRingAllocs(t *testing.T) {
	r, _ := NewCountMinRing(0.001, 0.01, 4, time.Second)
	i := 0
	if a := testing.AllocsPerRun(10_000, func() {
		r.Add(at(float64(i)/1000), uint64(i), 1) // a rotation every 1 000 events
		_ = r.Estimate(uint64(i))
		i++
	}); a != 0 {
		t.Errorf("Add and Estimate allocate %v times", a)
	}
}

// TestCountMinRingMergeAndCodec: rings fed 4 partitions (by key hash) of a
// timed stream, shipped through MarshalBinary and merged, count the whole
// stream's live window within the count-min bounds.
func TestCountMinRingMergeAndCodec(t *testing.T) {
	stream, _ := stdStream()
	hashes := keyHashes()
	mk := func() *CountMinRing {
		r, err := NewCountMinRing(0.002, 0.01, 3, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	whole, parts := mk(), []*CountMinRing{mk(), mk(), mk(), mk()}
	exact := make([]uint64, zipfKeys)
	sub := stream[:200_000]
	for i, k := range sub {
		ts := at(float64(i) / 40_000) // 5 s: the window moves
		whole.Add(ts, hashes[k], 1)
		parts[hashes[k]%4].Add(ts, hashes[k], 1)
		if i >= 80_000 { // seconds 2, 3 and 4 are live at the end
			exact[k]++
		}
	}
	m := mk()
	for _, p := range parts {
		var q CountMinRing
		if err := q.UnmarshalBinary(mustMarshal(t, p)); err != nil {
			t.Fatal(err)
		}
		if err := m.Merge(&q); err != nil {
			t.Fatal(err)
		}
	}
	if m.Total() != whole.Total() || m.Total() != 120_000 {
		t.Fatalf("merged Total %d, whole %d, want 120000", m.Total(), whole.Total())
	}
	over := 0
	for k, want := range exact {
		got := m.Estimate(hashes[k])
		if got < want {
			t.Fatalf("key %d: merged estimate %d below true %d", k, got, want)
		}
		if float64(got) > float64(want)+0.002*float64(m.Total()) {
			over++
		}
	}
	if over > zipfKeys/100 {
		t.Errorf("%d keys above true + eps*N after merging", over)
	}
	other, _ := NewCountMinRing(0.002, 0.01, 3, 2*time.Second)
	if err := m.Merge(other); !errors.Is(err, ErrIncompatible) {
		t.Errorf("merging rings of other intervals: err = %v", err)
	}
}

func TestCountMinRingUnmarshalErrors(t *testing.T) {
	r, _ := NewCountMinRing(0.5, 0.5, 2, time.Second)
	r.Add(at(0), 1, 1)
	good := mustMarshal(t, r)
	empty, _ := NewCountMinRing(0.5, 0.5, 2, time.Second)
	notStarted := mustMarshal(t, empty)
	mixed := bytes.Clone(good)
	mixed[12] = 0 // not started, but slot holds events
	for name, tc := range map[string]struct {
		b    []byte
		want error
	}{
		"short":       {good[:10], ErrCorrupt},
		"magic":       {append([]byte("SKCM"), good[4:]...), ErrCorrupt},
		"version":     {append([]byte("SKCR\x05"), good[5:]...), ErrIncompatible},
		"no slots":    {append(append([]byte(nil), good[:8]...), append([]byte{0, 0, 0, 0}, good[12:32]...)...), ErrCorrupt},
		"truncated":   {good[:len(good)-1], ErrCorrupt},
		"trailing":    {append(bytes.Clone(good), 1), ErrCorrupt},
		"not started": {mixed, ErrCorrupt},
		"bad flag":    {append(append(bytes.Clone(notStarted[:12]), 2), notStarted[13:]...), ErrCorrupt},
	} {
		var got CountMinRing
		if err := got.UnmarshalBinary(tc.b); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", name, err, tc.want)
		}
	}
}

func FuzzCountMinRingUnmarshal(f *testing.F) {
	r, _ := NewCountMinRing(0.5, 0.5, 2, time.Second)
	f.Add(mustMarshal(f, r))
	r.Add(at(0), 1, 1)
	r.Add(at(1), 2, 3)
	f.Add(mustMarshal(f, r))
	f.Fuzz(func(t *testing.T, b []byte) {
		var r CountMinRing
		if !decoded(t, r.UnmarshalBinary(b)) {
			return
		}
		sameEncoding(t, &r, b)
		if r.Add(at(2), 5, 1) && r.Estimate(5) == 0 {
			t.Fatal("Estimate 0 after Add")
		}
		_ = r.Merge(&r)
	})
}
