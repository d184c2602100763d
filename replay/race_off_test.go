//go:build !race

package replay_test

const raceDetector = false
