package enforcer

import (
	"math"
	"testing"
	"time"
)

// msDuration saturates instead of wrapping: no reset or wait from a script
// becomes negative or shorter than it is, and ceilSeconds of the largest
// one still fits.
func TestMsDurationSaturates(t *testing.T) {
	for _, ms := range []int64{-5, 0, 1, 9_223_372_036_000, 18_446_744_073_709, math.MaxInt64} {
		d := msDuration(ms)
		switch {
		case d < 0:
			t.Errorf("msDuration(%d) = %v, negative", ms, d)
		case ms > 0 && ms < 9_223_372_035_000 && d != time.Duration(ms)*time.Millisecond:
			t.Errorf("msDuration(%d) = %v", ms, d)
		case ms > 0 && d < time.Duration(min(ms, 9_223_372_035_000))*time.Millisecond:
			t.Errorf("msDuration(%d) = %v, shorter than it is", ms, d)
		case ceilSeconds(d) < 0 || retryAfter(d) < d:
			t.Errorf("msDuration(%d) = %v: ceilSeconds %d, retryAfter %v", ms, d, ceilSeconds(d), retryAfter(d))
		}
	}
}
