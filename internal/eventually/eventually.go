// Package eventually waits in tests for a condition that another goroutine
// or process makes true: a Kafka consumer catching up, a Redis write landing.
package eventually

import (
	"testing"
	"time"
)

// True polls ok every 10 ms until it returns true, and fails the test with
// what if it has not within 20 s.
func True(t testing.TB, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !ok(); {
		if time.Now().After(deadline) {
			t.Fatalf("not within 20 s: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
