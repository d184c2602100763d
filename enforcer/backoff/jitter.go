package backoff

import (
	"math/rand/v2"
	"time"

	retry "github.com/cenkalti/backoff/v5"
)

// Decorrelated is the "decorrelated jitter" backoff of Marc Brooker, "Exponential
// Backoff And Jitter", AWS Architecture Blog, 2015:
//
//	sleep = min(Cap, random_between(Base, 3 × previous sleep)), the first previous sleep = Base
//
// with a floor, the least wait the server asked for (Retry-After, or a
// RateLimit reset), that raises both the lower bound and the previous sleep:
//
//	sleep = min(Cap, random_between(max(Base, floor), 3 × max(previous sleep, Base, floor)))
//
// so that clients told the same Retry-After spread over [floor, 3 × floor)
// instead of all coming back at floor. A floor above Cap is a wait the
// caller does not accept: NextAfter returns Stop (github.com/cenkalti/backoff/v5's).
//
// It implements that package's BackOff, so it can drive backoff.Retry
// directly. The zero value is not useful: set Base and Cap (0 < Base ≤
// Cap); Rand nil draws from math/rand/v2's runtime-seeded generator. A
// Decorrelated is not safe for concurrent use (one per retried operation);
// Rand must be, if it is shared.
type Decorrelated struct {
	Base time.Duration // the least sleep
	Cap  time.Duration // the longest sleep
	Rand rand.Source   // uniform bits; nil: math/rand/v2's global generator
	prev time.Duration // the previous sleep; 0 before the first
}

// NextBackOff returns the next sleep with no floor. It implements
// backoff.BackOff.
func (d *Decorrelated) NextBackOff() time.Duration { return d.NextAfter(0) }

// Reset forgets the previous sleep. It implements backoff.BackOff.
func (d *Decorrelated) Reset() { d.prev = 0 }

// NextAfter returns the next sleep, at least floor, or Stop when floor
// exceeds Cap.
func (d *Decorrelated) NextAfter(floor time.Duration) time.Duration {
	if floor > d.Cap {
		return retry.Stop
	}
	lo := max(d.Base, floor)
	prev := max(d.prev, lo)
	// In float64: 3 × prev may pass the longest Duration; the result is
	// compared with Cap before it is converted back.
	x := float64(lo) + d.uniform()*(3*float64(prev)-float64(lo))
	sleep := d.Cap
	if x < float64(d.Cap) {
		sleep = max(time.Duration(x), lo) // max: float rounding never undercuts the floor
	}
	d.prev = sleep
	return sleep
}

// uniform returns a float64 in [0, 1) from 53 random bits.
func (d *Decorrelated) uniform() float64 {
	var u uint64
	if d.Rand != nil {
		u = d.Rand.Uint64()
	} else {
		u = rand.Uint64()
	}
	return float64(u>>11) / (1 << 53)
}
