// Package detector turns aggregate signals in the decision stream into
// dynamic rate-limit rules, shadow mode first. Each signal is a
// pipeline.Stage: an I/O-free state machine, records in and rules out, so
// replays are deterministic and tests drive it with synthetic event times.
//
// Signals: HeavyHitters (clients far above the per-client baseline).
//
// # Usage
//
//	hh := detector.NewHeavyHitters(detector.HeavyHitterOptions{Window: time.Minute})
//	for _, d := range records { hh.Observe(d) }
//	out := hh.Advance(watermark) // out.Rules: scoped, with TTL, evidence and mode shadow
package detector
