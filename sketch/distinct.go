package sketch

import (
	"fmt"
	"sync"

	"github.com/axiomhq/hyperloglog"
)

// distinctPrecision is the HyperLogLog precision p of every Distinct:
// m = 2^p registers.
const distinctPrecision = 14

// Distinct counts the distinct keys of a stream with HyperLogLog (Flajolet,
// Fusy, Gandouet & Meunier, "HyperLogLog: the analysis of a near-optimal
// cardinality estimation algorithm", AofA 2007) in its HyperLogLog++ form with
// a sparse representation for small cardinalities (Heule, Nunkesser & Hall,
// "HyperLogLog in practice", EDBT 2013), as implemented by
// github.com/axiomhq/hyperloglog.
//
// Memory: precision 14, m = 16384 registers: at most 16 KiB (plus the
// sparse form's pending entries before compaction), much less while the
// cardinality is small. Error: a relative standard error of 1.04/sqrt(m),
// about 0.81%; small cardinalities, kept in the sparse form, are close to
// exact.
//
// The module pins github.com/axiomhq/hyperloglog at v0.3.0 or later because
// of upstream PR #69 ("Fix unbounded sparse growth", in v0.3.0): before it,
// Estimate merged the pending sparse entries into the sparse list without
// ever converting to the dense form, so a caller alternating small batches
// of inserts (fewer than m/100) with Estimate grew the sparse list, and the
// memory and encoding, without bound (1.1 MB instead of 16 KiB at 1M keys
// with v0.2.6). TestDistinctMemoryInterleaved checks the bound.
//
// Estimate mutates the sketch (it compacts the sparse form), so every method
// takes the mutex, Estimate included. For a single owner that wants no lock
// and no allocation, HLL is the dense, unsynchronised alternative.
//
// Most callers want InsertHash with a Hash64 value on each event and Estimate
// to read the count. Counters from different nodes can be combined with Merge,
// or shipped with MarshalBinary.
//
// The zero value is an empty counter ready to use. A Distinct is safe for
// concurrent use by multiple goroutines; every method takes its mutex (even
// Estimate, which compacts the sparse form). It must not be copied after first
// use.
type Distinct struct {
	mu sync.Mutex
	sk *hyperloglog.Sketch // nil until first use
	// est caches the last Estimate while cached is true; any insert, merge or
	// decode clears cached.
	est    uint64
	cached bool
}

// NewDistinct returns an empty distinct counter with precision 14.
func NewDistinct() *Distinct {
	return &Distinct{sk: hyperloglog.New14()}
}

// sketch returns the underlying sketch, creating it on first use of a zero
// Distinct. The caller holds d.mu.
func (d *Distinct) sketch() *hyperloglog.Sketch {
	if d.sk == nil {
		d.sk = hyperloglog.New14()
	}
	return d.sk
}

// InsertHash adds the key whose 64-bit hash is h, normally from Hash64. The
// hash must be uniformly distributed: pass Hash64 values, not raw IDs.
func (d *Distinct) InsertHash(h uint64) {
	d.mu.Lock()
	d.sketch().InsertHash(h)
	d.cached = false
	d.mu.Unlock()
}

// Estimate returns the estimated number of distinct hashes inserted, with a
// relative standard error of about 0.81% (1.04/sqrt(16384)). It may compact
// the sparse representation, so it takes the same lock as InsertHash.
//
// Once the counter is dense (beyond a few thousand keys) Estimate reads all
// 16384 registers, which takes about 0.4 ms: call it once per window or
// report, not once per event. The result is cached until the next InsertHash,
// Merge or UnmarshalBinary.
func (d *Distinct) Estimate() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.sk == nil {
		return 0
	}
	if !d.cached {
		d.est, d.cached = d.sk.Estimate(), true
	}
	return d.est
}

// Merge adds every key counted by o to d, so that d counts the union of both
// streams; o is not modified and d.Merge(d) is a no-op. Merging loses nothing:
// the merged counter holds the registers the union stream would have built,
// so it has the same error bound as a single counter. Merge returns
// an error wrapping ErrIncompatible, leaving d unchanged, if o has a different
// precision (which no Distinct from this package has).
//
// o is copied under its own lock before d is locked, so concurrent a.Merge(b)
// and b.Merge(a) cannot deadlock. Merge allocates the copy.
func (d *Distinct) Merge(o *Distinct) error {
	if o == d || o == nil {
		return nil
	}
	o.mu.Lock()
	var other *hyperloglog.Sketch
	if o.sk != nil {
		other = o.sk.Clone()
	}
	o.mu.Unlock()
	if other == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.sketch().Merge(other); err != nil {
		return fmt.Errorf("%w: distinct: %w", ErrIncompatible, err)
	}
	d.cached = false
	return nil
}

// MarshalBinary encodes d in the versioned binary format of
// github.com/axiomhq/hyperloglog v0.3 (format version 2: a 4-byte header of
// version, precision, bias and sparse flag, then the sparse list or the m
// registers). It implements encoding.BinaryMarshaler and does not fail for a
// Distinct from this package.
func (d *Distinct) MarshalBinary() ([]byte, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, err := d.sketch().MarshalBinary()
	if err != nil {
		return nil, fmt.Errorf("sketch: distinct: %w", err)
	}
	return b, nil
}

// UnmarshalBinary replaces d with the counter encoded in b by MarshalBinary.
// It implements encoding.BinaryUnmarshaler.
//
// It returns an error wrapping ErrIncompatible if b has a precision other than
// 14 or an unknown format version, and one wrapping ErrCorrupt if b is
// truncated, has trailing bytes or holds impossible registers. It never
// panics and leaves d unchanged on error.
func (d *Distinct) UnmarshalBinary(b []byte) error {
	// Byte 0 is the format version and byte 1 the precision in the
	// hyperloglog encoding; check them first so that the error names the
	// likely cause.
	if len(b) >= 2 {
		if b[0] != 1 && b[0] != 2 {
			return fmt.Errorf("%w: distinct format version %d, this build reads 1 and 2", ErrIncompatible, b[0])
		}
		if b[1] != distinctPrecision {
			return fmt.Errorf("%w: distinct precision %d, want %d", ErrIncompatible, b[1], distinctPrecision)
		}
	}
	sk := new(hyperloglog.Sketch)
	if err := sk.UnmarshalBinary(b); err != nil {
		return fmt.Errorf("%w: distinct: %w", ErrCorrupt, err)
	}
	d.mu.Lock()
	d.sk, d.cached = sk, false
	d.mu.Unlock()
	return nil
}
