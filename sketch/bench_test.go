package sketch

import (
	"testing"
	"time"
)

// zipfHashes is the Zipf stream of BenchmarkTopKAdd as key hashes, 2^20
// events.
func zipfHashes() []uint64 {
	hs := keyHashes()
	stream := zipfStream(3, zipfKeys, 1<<20)
	out := make([]uint64, len(stream))
	for i, k := range stream {
		out[i] = hs[k]
	}
	return out
}

func BenchmarkTopKAddHash(b *testing.B) {
	names, hs := keyNames(), keyHashes()
	stream := zipfStream(3, zipfKeys, 1<<20)
	tk := NewTopK(1000)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		k := stream[i&(len(stream)-1)]
		tk.AddHash(hs[k], names[k], 1)
		i++
	}
}

// BenchmarkCountMinRingAdd: 4 intervals of 1 s, a new interval every 2^16
// events (each rotation clears 2719x5 counters).
func BenchmarkCountMinRingAdd(b *testing.B) {
	hs := zipfHashes()
	r, _ := NewCountMinRing(0.001, 0.01, 4, time.Second)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		r.Add(t0.Add(time.Duration(i)*(time.Second>>16)), hs[i&(len(hs)-1)], 1)
		i++
	}
}

func BenchmarkHLLInsertHash(b *testing.B) {
	hs := zipfHashes()
	s := NewHLL(14)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		s.InsertHash(hs[i&(len(hs)-1)])
		i++
	}
}

func BenchmarkHLLEstimate(b *testing.B) {
	s := NewHLL(14)
	for _, h := range zipfHashes() {
		s.InsertHash(h)
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = s.Estimate()
	}
}

// BenchmarkHLLRingInsertHash: 8 intervals of 1 s, a new interval every 2^16
// events.
func BenchmarkHLLRingInsertHash(b *testing.B) {
	hs := zipfHashes()
	r := NewHLLRing(14, 8, time.Second)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		r.InsertHash(t0.Add(time.Duration(i)*(time.Second>>16)), hs[i&(len(hs)-1)])
		i++
	}
}

func BenchmarkHLLRingEstimate(b *testing.B) {
	hs := zipfHashes()
	r := NewHLLRing(14, 8, time.Second)
	for i, h := range hs {
		r.InsertHash(t0.Add(time.Duration(i)*(time.Second>>17)), h)
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = r.Estimate()
	}
}

// BenchmarkEntropyUpdate: the Zipf stream over 100k keys, k = 1000, p = 14.
func BenchmarkEntropyUpdate(b *testing.B) {
	hs := zipfHashes()
	e := NewEntropy(1000, 14)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		e.UpdateHash(hs[i&(len(hs)-1)], 1)
		i++
	}
}

func BenchmarkEntropyRead(b *testing.B) {
	e := NewEntropy(1000, 14)
	for _, h := range zipfHashes() {
		e.UpdateHash(h, 1)
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = e.Normalized()
	}
}

// BenchmarkMADUpdate: window of 1000.
func BenchmarkMADUpdate(b *testing.B) {
	m := NewMAD(1000, 100)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		m.Update(float64(i % 977))
		i++
	}
}

// BenchmarkMADUpdateScore: Update then Score, which selects the median and
// the MAD over the window of 1000 (the per-interval cost of a baseline).
func BenchmarkMADUpdateScore(b *testing.B) {
	m := NewMAD(1000, 100)
	for i := range 1000 {
		m.Update(float64(i % 977))
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		m.Update(float64(i % 977))
		_ = m.Score(500)
		i++
	}
}
