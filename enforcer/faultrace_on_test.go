//go:build race

package enforcer_test

// raceDetector: the race detector slows the code it watches five- to
// tenfold, so the fault cases widen the budget and the latency ceiling that
// a plain build is held to: under it they look for data races, not time.
const raceDetector = true
