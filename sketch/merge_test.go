package sketch

import (
	"math"
	"testing"
)

// TestMergeFourPartitions splits the Zipf stream into 4 partitions by the
// hash of the key, as a keyed Kafka topic would, sketches each partition,
// merges the 4 sketches and checks the result against the exact counts of
// the whole stream within each sketch's bound, and against the sketch of the
// whole stream.
func TestMergeFourPartitions(t *testing.T) {
	stream, exact := stdStream()
	names, hashes := keyNames(), keyHashes()
	const eps, delta, phi = 0.001, 0.01, 0.01
	k := int(math.Ceil(1 / (phi / 10))) // epsilon = phi/10

	newParts := func() (cm [4]*CountMin, tk [4]*TopK, d [4]*Distinct, h [4]*HLL, en [4]*Entropy) {
		for i := range 4 {
			cm[i], _ = NewCountMin(eps, delta)
			tk[i], d[i], h[i], en[i] = NewTopK(k), NewDistinct(), NewHLL(14), NewEntropy(1000, 14)
		}
		return
	}
	cm, tk, d, h, en := newParts()
	wholeD, wholeH, wholeE := NewDistinct(), NewHLL(14), NewEntropy(1000, 14)
	for _, key := range stream {
		x := hashes[key]
		p := x >> 62 // the partition: top 2 bits of the key's hash
		cm[p].Add(x, 1)
		tk[p].AddHash(x, names[key], 1)
		d[p].InsertHash(x)
		h[p].InsertHash(x)
		en[p].UpdateHash(x, 1)
		wholeD.InsertHash(x)
		wholeH.InsertHash(x)
		wholeE.UpdateHash(x, 1)
	}
	for p := 1; p < 4; p++ {
		if err := cm[0].Merge(cm[p]); err != nil {
			t.Fatal(err)
		}
		tk[0].Merge(tk[p])
		if err := d[0].Merge(d[p]); err != nil {
			t.Fatal(err)
		}
		if err := h[0].Merge(h[p]); err != nil {
			t.Fatal(err)
		}
		if err := en[0].Merge(en[p]); err != nil {
			t.Fatal(err)
		}
	}

	checkCountMin(t, cm[0], hashes, exact, eps, delta)
	checkTopK(t, tk[0], exact, phi)

	distinct := 0
	for _, c := range exact {
		if c > 0 {
			distinct++
		}
	}
	bound := 3 * 1.04 / 128
	if e := relErr(d[0].Estimate(), distinct); e > bound {
		t.Errorf("merged Distinct: %d for %d distinct keys, relative error %.4f above %.4f", d[0].Estimate(), distinct, e, bound)
	}
	if d[0].Estimate() != wholeD.Estimate() {
		t.Errorf("merged Distinct estimates %d, the whole stream's %d", d[0].Estimate(), wholeD.Estimate())
	}
	if h[0].Estimate() != wholeH.Estimate() || relErr(h[0].Estimate(), distinct) > bound {
		t.Errorf("merged HLL estimates %d, the whole stream's %d, exact %d", h[0].Estimate(), wholeH.Estimate(), distinct)
	}
	checkEntropy(t, "merged entropy", en[0], exact)
	checkEntropy(t, "whole-stream entropy", wholeE, exact)
}

// TestRealLogsCountAndDistinct runs CountMin, TopK, Distinct and HLL over the
// clients and paths of the real access logs, against exact counts.
func TestRealLogsCountAndDistinct(t *testing.T) {
	const eps, delta, phi = 0.001, 0.01, 0.01
	for _, name := range []string{"elastic-apache_logs.log", "nasa-19950801.tsv", "secrepo-2018-12-15.log"} {
		clients, paths := readLogFields(t, name)
		for field, keys := range map[string][]string{"clients": clients, "paths": paths} {
			exact := map[string]uint64{}
			cm, _ := NewCountMin(eps, delta)
			tk := NewTopK(int(math.Ceil(10 / phi)))
			d, hll := NewDistinct(), NewHLL(14)
			for _, key := range keys {
				exact[key]++
				x := Hash64(key)
				cm.Add(x, 1)
				tk.AddHash(x, key, 1)
				d.InsertHash(x)
				hll.InsertHash(x)
			}
			n := float64(len(keys))
			over := 0
			for key, c := range exact {
				est := cm.Estimate(Hash64(key))
				if est < c {
					t.Fatalf("%s %s %q: count-min %d below true %d", name, field, key, est, c)
				}
				if float64(est-c) > eps*n {
					over++
				}
			}
			if float64(over) > delta*float64(len(exact))+3*math.Sqrt(delta*float64(len(exact))) {
				t.Errorf("%s %s: %d of %d keys above true + eps*N", name, field, over, len(exact))
			}
			listed := map[string]Item{}
			for _, it := range tk.List() {
				listed[it.Key] = it
				if c := exact[it.Key]; c < it.Count-it.Err || c > it.Count {
					t.Errorf("%s %s %q: true %d outside [%d, %d]", name, field, it.Key, c, it.Count-it.Err, it.Count)
				}
			}
			heavy := 0
			for key, c := range exact {
				if float64(c) > phi*n {
					heavy++
					if _, ok := listed[key]; !ok {
						t.Errorf("%s %s: heavy hitter %q (%d of %v) not listed", name, field, key, c, n)
					}
				}
			}
			bound := 3 * 1.04 / 128
			if e := relErr(d.Estimate(), len(exact)); e > bound {
				t.Errorf("%s %s: Distinct %d for %d, relative error %.4f", name, field, d.Estimate(), len(exact), e)
			}
			if e := relErr(hll.Estimate(), len(exact)); e > bound {
				t.Errorf("%s %s: HLL %d for %d, relative error %.4f", name, field, hll.Estimate(), len(exact), e)
			}
			t.Logf("%s %s: %d events, %d distinct (Distinct %d, HLL %d), %d heavy hitters above %v all listed, %d keys above true+eps*N",
				name, field, len(keys), len(exact), d.Estimate(), hll.Estimate(), heavy, phi, over)
		}
	}
}

// TestDistinctMemoryInterleaved is the scenario of axiomhq/hyperloglog PR #69
// (in v0.3.0): batches of fewer than m/100 inserts between Estimate calls, up
// to 1M distinct keys. Before the fix the sparse list grew past m and the
// encoding without bound; the encoding must never exceed the dense size.
func TestDistinctMemoryInterleaved(t *testing.T) {
	const m = 1 << distinctPrecision
	dense := func() int {
		full := NewDistinct()
		for i := range 200_000 {
			full.InsertHash(distinctKey(99, i))
		}
		return len(mustMarshal(t, full))
	}()
	d := NewDistinct()
	batch := m/100 - 1 // 162: below the threshold at which inserts compact
	maxLen, calls, batches := 0, 0, 0
	every := 1 // Estimate after every batch while sparse
	for i := 0; i < 1_000_000; batches++ {
		for range batch {
			d.InsertHash(distinctKey(100, i))
			i++
		}
		if batches%every == 0 {
			_ = d.Estimate()
			calls++
		}
		if batches%64 == 0 {
			l := len(mustMarshal(t, d))
			maxLen = max(maxLen, l)
			if l == dense {
				// Dense now, and a dense sketch never grows: later Estimate
				// calls (0.4 ms each, 10 times that under -race) cannot
				// change the size, so make fewer of them.
				every = 64
			}
		}
	}
	maxLen = max(maxLen, len(mustMarshal(t, d)))
	t.Logf("%d Estimate calls; largest encoding %d bytes, dense %d", calls, maxLen, dense)
	if maxLen > dense {
		t.Errorf("encoding reached %d bytes, above the dense %d: sparse growth is unbounded (axiomhq/hyperloglog before v0.3.0)", maxLen, dense)
	}
	if e := relErr(d.Estimate(), 1_000_000); e > 3*1.04/128 {
		t.Errorf("estimate %d for 1M, relative error %.4f", d.Estimate(), e)
	}
}
