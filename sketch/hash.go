package sketch

import "github.com/cespare/xxhash/v2"

// Hash64 hashes a string key to 64 bits with xxHash64 (seed 0). It does not
// allocate.
//
// Hash a key once per event and reuse the value for every sketch that takes a
// hash (CountMin, Distinct): the sketches derive what they need from the one
// 64-bit value. Values are stable across processes and releases, so hashes
// computed on different nodes can be fed to sketches that are merged later.
func Hash64(s string) uint64 { return xxhash.Sum64String(s) }

// mix64 is the 64-bit finaliser of MurmurHash3 (fmix64). It is a bijection
// that spreads every input bit over the whole output, so row positions stay
// independent even when a caller passes a weak hash such as a small integer.
func mix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// satAdd returns a+b, saturating at the largest uint64 instead of wrapping,
// so a counter that overflows stays an overestimate.
func satAdd(a, b uint64) uint64 {
	s := a + b
	if s < a {
		return ^uint64(0)
	}
	return s
}
