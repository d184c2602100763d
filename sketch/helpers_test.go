package sketch

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"unsafe"
)

const (
	zipfKeys    = 100_000
	zipfUpdates = 1_000_000
)

// zipfStream returns n key indexes in [0, keys) drawn from a Zipf distribution
// with exponent 1.1 from a PCG seeded with seed, so every run sees the same
// stream.
func zipfStream(seed uint64, keys, n int) []int {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	z := rand.NewZipf(r, 1.1, 1, uint64(keys-1))
	out := make([]int, n)
	for i := range out {
		out[i] = int(z.Uint64())
	}
	return out
}

// exactCounts returns the true count of each key index in stream.
func exactCounts(stream []int, keys int) []uint64 {
	c := make([]uint64, keys)
	for _, k := range stream {
		c[k]++
	}
	return c
}

var keyNames = sync.OnceValue(func() []string {
	names := make([]string, zipfKeys)
	for i := range names {
		names[i] = "client-" + strconv.Itoa(i)
	}
	return names
})

var keyHashes = sync.OnceValue(func() []uint64 {
	hs := make([]uint64, zipfKeys)
	for i, n := range keyNames() {
		hs[i] = Hash64(n)
	}
	return hs
})

// stdStream is the shared 1M-update Zipf stream over 100k keys and its exact
// counts.
var stdStream = sync.OnceValues(func() ([]int, []uint64) {
	s := zipfStream(1, zipfKeys, zipfUpdates)
	return s, exactCounts(s, zipfKeys)
})

// unsafeString returns a string sharing b's memory, as a caller parsing keys
// out of a reused buffer might.
func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// decoded checks a decoder's error: nil (it reports true), or one that
// wraps ErrCorrupt or ErrIncompatible (false). Anything else fails t.
func decoded(t *testing.T, err error) bool {
	t.Helper()
	if err != nil && !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrIncompatible) {
		t.Fatalf("error %v wraps neither ErrCorrupt nor ErrIncompatible", err)
	}
	return err == nil
}

// sameEncoding fails t unless m encodes to b: what decodes re-encodes to
// the same bytes.
func sameEncoding(t *testing.T, m binaryMarshaler, b []byte) {
	t.Helper()
	if !bytes.Equal(mustMarshal(t, m), b) {
		t.Fatal("re-encoding differs")
	}
}
