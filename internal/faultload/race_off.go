//go:build !race

package faultload

// RaceDetector: see race_on.go.
const RaceDetector = false
