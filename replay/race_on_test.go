//go:build race

package replay_test

// raceDetector: the race detector slows a replay five- to tenfold, so the
// replays of whole days with a request in nearly every 10 s window (the NASA
// log) are left to the plain run.
const raceDetector = true
