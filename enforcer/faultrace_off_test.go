//go:build !race

package enforcer_test

// raceDetector: see faultrace_on_test.go.
const raceDetector = false
