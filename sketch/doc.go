// Package sketch provides streaming sketches for sluice: small, mergeable,
// serialisable summaries of event streams that the abuse detector and the
// quota aggregator keep per window.
//
//   - CountMin estimates per-key counts with a bounded overcount (count-min
//     sketch with conservative update); CountMinRing does so over a sliding
//     window of event time.
//   - TopK finds the heavy hitters of a stream of keys (Space-Saving).
//   - Distinct estimates the number of distinct keys (HyperLogLog++, locked,
//     sparse for small counts); HLL is the dense, single-owner,
//     allocation-free HyperLogLog, and HLLRing counts distinct keys over a
//     sliding window of event time.
//   - Entropy estimates the Shannon entropy of a stream of items (a
//     Space-Saving head and a distinct sample of the rest).
//   - EWMA keeps an exponentially weighted mean and standard deviation, and
//     MAD the median and median absolute deviation of the last W
//     observations, as baselines for anomaly thresholds.
//
// Each type's documentation states its memory, its error bound and the paper
// its algorithm comes from; docs/sketches.md summarises them. Keys are hashed
// once with Hash64 (xxHash64); CountMin, CountMinRing, Distinct, HLL, HLLRing
// and Entropy take that 64-bit hash, TopK takes the key itself because it
// reports keys (or the key and its hash, with AddHash). The windowed sketches
// take the event's time from the caller and never read the clock.
//
// Distinct is safe for concurrent use; every other type is meant to be owned
// by one worker goroutine, as the detector's shards are. Sketches of the same
// shape built on different nodes or partitions combine with Merge, which is
// deterministic: the same sketches merged in the same order give the same
// result. Every type implements encoding.BinaryMarshaler and
// encoding.BinaryUnmarshaler with a versioned format, and decoding corrupt
// bytes returns an error wrapping ErrCorrupt or ErrIncompatible, never panics
// and allocates no more than the input's size warrants.
//
// Update paths do not allocate once a sketch is built (TopK's included, when
// a new key takes over a counter); Merge, List and the encoders may.
//
// The package exports no metrics and starts no goroutines.
//
// # Usage
//
// A detector worker counting requests per client in one window:
//
//	counts, err := sketch.NewCountMin(0.001, 0.01) // overcount <= 0.1% of N, 99% of the time
//	if err != nil {
//		return err
//	}
//	top := sketch.NewTopK(1000) // finds every client above 0.1% of N
//	clients := sketch.NewDistinct()
//
//	for _, ev := range window {
//		h := sketch.Hash64(ev.ClientID)
//		counts.Add(h, 1)
//		top.Add(ev.ClientID, 1)
//		clients.InsertHash(h)
//	}
//
//	for _, it := range top.List() {
//		if it.Count > counts.Total()/100 { // above 1% of the window's requests
//			flag(it.Key, it.Count-it.Err, it.Count) // true count is in [Count-Err, Count]
//		}
//	}
//	n := counts.Estimate(sketch.Hash64("client-42")) // never below the true count
//	d := clients.Estimate()                          // standard error about 0.81%
//
//	b, err := counts.MarshalBinary() // ship to the aggregator, which merges:
//	var other sketch.CountMin
//	if err := other.UnmarshalBinary(b); err != nil { ... }
//	err = agg.Merge(&other) // agg is built with the same epsilon and delta; else errors.Is(err, sketch.ErrIncompatible)
//
// A baseline of requests per second that flags a spike once warmed up:
//
//	base := sketch.NewEWMA(0.1, 30)
//	if base.Ready() && rps > base.Mean()+4*base.StdDev() { ... } // test before folding rps in
//	base.Update(rps)
//
// The same with a robust baseline that spikes cannot drag, over the last 60
// intervals, checkpointed with MarshalBinary:
//
//	robust := sketch.NewMAD(60, 20)
//	if robust.Ready() && robust.Score(rps) > 5 { ... }
//	robust.Update(rps)
//	state, _ := robust.MarshalBinary()
//
// Distinct clients over the last 5 minutes of event time, and how spread one
// client's requests are over paths:
//
//	recent := sketch.NewHLLRing(14, 5, time.Minute)
//	paths := sketch.NewEntropy(256, 10)
//	recent.InsertHash(ev.Time, h)
//	paths.Update(ev.Path, 1)
//	n, spread := recent.Estimate(), paths.Normalized() // spread near 1: a crawler
package sketch
