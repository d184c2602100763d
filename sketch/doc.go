// Package sketch provides streaming sketches for sluice: small, mergeable,
// serialisable summaries of event streams that the abuse detector and the
// quota aggregator keep per window.
//
//   - CountMin estimates per-key counts with a bounded overcount (count-min
//     sketch with conservative update).
//   - TopK finds the heavy hitters of a stream of keys (Space-Saving).
//   - Distinct estimates the number of distinct keys (HyperLogLog++).
//   - EWMA keeps an exponentially weighted mean and standard deviation as a
//     baseline for anomaly thresholds.
//
// Each type's documentation names the paper its algorithm comes from and
// states its error bound. Keys are hashed once with Hash64 (xxHash64); CountMin
// and Distinct take that 64-bit hash, TopK takes the key itself because it
// reports keys.
//
// CountMin, TopK and EWMA are not safe for concurrent use: they are meant to be
// owned by one worker goroutine, as the detector's shards are. Distinct is
// safe for concurrent use. Sketches of the same shape built on different
// nodes or shards combine with Merge; CountMin and Distinct also implement
// encoding.BinaryMarshaler and encoding.BinaryUnmarshaler with versioned
// formats, and decoding corrupt bytes returns an error wrapping ErrCorrupt or
// ErrIncompatible, never panics.
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
package sketch
