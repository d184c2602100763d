//go:build race

package faultload

// RaceDetector reports whether the binary was built with -race. The race
// detector slows the code it watches five- to tenfold, so the fault cases
// widen the budget and the latency ceiling that a plain build is held to
// (RaceScaled): under it they look for data races, not time.
const RaceDetector = true
