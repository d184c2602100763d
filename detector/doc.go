// Package detector turns aggregate signals in the decision stream into
// dynamic rate-limit rules, shadow mode first. Each signal is a
// stage.Stage: an I/O-free state machine, records in and rules out, so
// replays are deterministic and tests drive it with synthetic event times.
//
// Signals (docs/detector.md): HeavyHitters (clients far above the
// per-client baseline), Cluster (ASN concentration, JA4 clustering,
// low-and-slow), Entropy (random-URI scans, user-agent switching),
// NewIdentities (a surge of new addresses failing on a route),
// FakeCrawlers (a crawler's name from outside its operator's ASN) and
// Content (probes, exploits and rotating probers, by what clients ask for,
// with Signatures: the OWASP Core Rule Set, run by a native evaluator that
// gives the Coraza engine's verdicts).
//
// # Usage
//
//	hh := detector.NewHeavyHitters(detector.HeavyHitterOptions{Window: time.Minute})
//	// In the pipeline (pipeline.Options.Stages), or in one process:
//	l := stage.NewLocal([]stage.Stage{hh}, 4, 10*time.Second)
//	for i, d := range records { l.Observe(i, d) } // partition by the record's key in practice
//	out := l.Advance(watermark) // out.Rules: scoped, with TTL, evidence and mode shadow
package detector
