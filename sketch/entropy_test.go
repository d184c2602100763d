package sketch

import (
	"bufio"
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// entropyBound is the documented error of Entropy on the tested streams, as
// a fraction of ln(distinct): |H - exact| <= 0.05*ln(distinct), so
// Normalized is within about 0.05 of the exact value.
const entropyBound = 0.05

// exactEntropy returns the Shannon entropy in nats of the counts, and the
// number of non-zero counts.
func exactEntropy(counts []uint64) (float64, int) {
	var n, s float64
	d := 0
	for _, c := range counts {
		if c > 0 {
			n += float64(c)
			s += float64(c) * math.Log(float64(c))
			d++
		}
	}
	if n == 0 {
		return 0, 0
	}
	return math.Log(n) - s/n, d
}

func TestEntropyExactSmall(t *testing.T) {
	e := NewEntropy(8, 10)
	if e.Entropy() != 0 || e.Normalized() != 0 {
		t.Fatal("empty: non-zero entropy")
	}
	e.Update("a", 1)
	if e.Entropy() != 0 || e.Normalized() != 0 || e.Distinct() != 1 {
		t.Fatalf("one item: H %v normalized %v distinct %d", e.Entropy(), e.Normalized(), e.Distinct())
	}
	e.Update("a", 2)
	e.Update("b", 1)
	e.Update("c", 1)
	e.Update("d", 0)
	want := math.Log(5) - 3*math.Log(3)/5
	if got := e.Entropy(); math.Abs(got-want) > 1e-12 || !e.Exact() || e.Distinct() != 3 || e.Total() != 5 {
		t.Errorf("H = %v, want %v (exact %v, distinct %d, total %d)", got, want, e.Exact(), e.Distinct(), e.Total())
	}
	if got := e.Normalized(); math.Abs(got-want/math.Log(3)) > 1e-12 {
		t.Errorf("Normalized = %v, want %v", got, want/math.Log(3))
	}
	u := NewEntropy(8, 10)
	for _, k := range []string{"w", "x", "y", "z"} {
		u.Update(k, 7)
	}
	if math.Abs(u.Normalized()-1) > 1e-12 {
		t.Errorf("uniform: Normalized = %v, want 1", u.Normalized())
	}
}

// TestEntropyExactWhileHeadFits: weighted random updates over fewer items
// than counters give the exact entropy, however S was accumulated.
func TestEntropyExactWhileHeadFits(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	e := NewEntropy(500, 10)
	counts := make([]uint64, 500)
	for range 200_000 {
		k := r.IntN(500) * r.IntN(2) // half the mass on item 0
		n := uint64(1 + r.IntN(5))
		counts[k] += n
		e.Update("item-"+strconv.Itoa(k), n)
	}
	want, d := exactEntropy(counts)
	if !e.Exact() || e.Distinct() != uint64(d) {
		t.Fatalf("exact %v distinct %d, want true %d", e.Exact(), e.Distinct(), d)
	}
	if got := e.Entropy(); math.Abs(got-want) > 1e-9*want {
		t.Errorf("H = %.12f, want %.12f", got, want)
	}
}

func checkEntropy(t *testing.T, name string, e *Entropy, counts []uint64) {
	t.Helper()
	want, d := exactEntropy(counts)
	got := e.Entropy()
	t.Logf("%s: %d items, %d distinct: H %.4f, exact %.4f, error %+.4f nats; normalized %.4f, exact %.4f",
		name, e.Total(), d, got, want, got-want, e.Normalized(), want/math.Log(float64(d)))
	if e.Exact() {
		t.Errorf("%s: %d distinct items fit the head of %d; the estimate is not exercised", name, d, e.head.k)
	}
	if bound := entropyBound * math.Log(float64(d)); math.Abs(got-want) > bound {
		t.Errorf("%s: H = %.4f, exact %.4f: error above %.4f nats", name, got, want, bound)
	}
	if wn := want / math.Log(float64(d)); math.Abs(e.Normalized()-wn) > entropyBound+0.005 {
		t.Errorf("%s: Normalized = %.4f, exact %.4f", name, e.Normalized(), wn)
	}
}

func TestEntropyAccuracy(t *testing.T) {
	stream, exact := stdStream()
	hashes := keyHashes()
	z := NewEntropy(1000, 14)
	for _, k := range stream {
		z.UpdateHash(hashes[k], 1)
	}
	checkEntropy(t, "zipf 1.1 over 100k", z, exact)

	r := rand.New(rand.NewPCG(11, 12))
	u := NewEntropy(1000, 14)
	uc := make([]uint64, zipfKeys)
	for range 1_000_000 {
		k := r.IntN(zipfKeys)
		uc[k]++
		u.UpdateHash(hashes[k], 1)
	}
	checkEntropy(t, "uniform over 100k", u, uc)
}

// readLogFields returns, for every line of a log in ../shared/data, its
// client (first field) and path (request target, query string dropped).
func readLogFields(t *testing.T, name string) (clients, paths []string) {
	t.Helper()
	// A test runs in its package's folder: the repository is "..", and the
	// shared folder sits beside it.
	data := filepath.Join("..", "..", "shared", "data")
	if _, err := os.Stat(data); err != nil {
		// As the replay tests do: the real logs live outside the repository
		// (licences), beside it in ../shared/data; every other accuracy test
		// here runs on seeded streams.
		t.Skipf("../shared/data absent (%v): this test reads the real logs kept there", err)
	}
	f, err := os.Open(filepath.Join(data, "access-logs", name))
	if err != nil {
		t.Fatalf("the shared access logs are needed (../shared/data next to the project root): %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	tsv := strings.HasSuffix(name, ".tsv")
	for first := true; sc.Scan(); first = false {
		line := sc.Text()
		var client, path string
		if tsv {
			if first {
				continue // header
			}
			fs := strings.Split(line, "\t")
			if len(fs) < 5 {
				continue
			}
			client, path = fs[0], fs[4]
		} else {
			client, _, _ = strings.Cut(line, " ")
			_, req, ok := strings.Cut(line, "\"")
			if !ok {
				continue
			}
			fs := strings.Fields(req)
			if len(fs) < 2 {
				continue
			}
			path = fs[1]
		}
		path, _, _ = strings.Cut(path, "?")
		clients = append(clients, client)
		paths = append(paths, path)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return clients, paths
}

// TestEntropyRealLogs: entropy of the paths and of the clients of real
// access logs, with a head small enough (k = 250, fewer counters than each
// log has distinct clients or paths) that the estimate is exercised.
func TestEntropyRealLogs(t *testing.T) {
	for _, name := range []string{"elastic-apache_logs.log", "nasa-19950801.tsv", "secrepo-2018-12-15.log"} {
		clients, paths := readLogFields(t, name)
		for field, keys := range map[string][]string{"clients": clients, "paths": paths} {
			idx := map[string]int{}
			var counts []uint64
			e := NewEntropy(250, 14)
			for _, k := range keys {
				i, ok := idx[k]
				if !ok {
					i = len(counts)
					idx[k] = i
					counts = append(counts, 0)
				}
				counts[i]++
				e.Update(k, 1)
			}
			checkEntropy(t, name+" "+field, e, counts)
		}
	}
}

func TestEntropyUpdateAllocs(t *testing.T) {
	stream, _ := stdStream()
	hashes := keyHashes()
	e := NewEntropy(1000, 14)
	i := 0
	if a := testing.AllocsPerRun(100_000, func() { e.UpdateHash(hashes[stream[i]], 1); i++ }); a != 0 {
		t.Errorf("UpdateHash allocates %v", a)
	}
	if a := testing.AllocsPerRun(10, func() { _ = e.Normalized() }); a != 0 {
		t.Errorf("Normalized allocates %v", a)
	}
}

func TestEntropyCodec(t *testing.T) {
	stream, _ := stdStream()
	hashes := keyHashes()
	e := NewEntropy(200, 10)
	for _, k := range stream[:100_000] {
		e.UpdateHash(hashes[k], 1)
	}
	b := mustMarshal(t, e)
	var got Entropy
	if err := got.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	checkSpaceSaving(t, &got.head)
	if got.Entropy() != e.Entropy() && math.Abs(got.Entropy()-e.Entropy()) > 1e-9 {
		t.Errorf("round trip: H %v, want %v", got.Entropy(), e.Entropy())
	}
	if !bytes.Equal(mustMarshal(t, &got), b) {
		t.Error("re-encoding differs")
	}
	// The decoded estimator evolves as the original.
	for _, k := range stream[100_000:150_000] {
		e.UpdateHash(hashes[k], 1)
		got.UpdateHash(hashes[k], 1)
	}
	if !bytes.Equal(mustMarshal(t, &got), mustMarshal(t, e)) || math.Abs(got.Entropy()-e.Entropy()) > 1e-9 {
		t.Error("decoded estimator diverges from the original")
	}
	put := func(off int, v uint64) []byte {
		c := bytes.Clone(b)
		binary64(c[off:], v)
		return c
	}
	for name, tc := range map[string]struct {
		b    []byte
		want error
	}{
		"short":          {b[:20], ErrCorrupt},
		"magic":          {append([]byte("SKTK"), b[4:]...), ErrCorrupt},
		"version":        {append([]byte("SKEN\x02"), b[5:]...), ErrIncompatible},
		"count > total":  {put(32+8, 1<<40), ErrCorrupt},
		"err > count":    {put(32+16, 1<<40), ErrCorrupt},
		"dropped>total":  {put(24, 1<<40), ErrCorrupt},
		"bad tail":       {b[:len(b)-1], ErrCorrupt},
		"order":          {put(32+24+8, 1<<20), ErrCorrupt},
		"too many items": {put(12, 1<<20|200), ErrCorrupt},
	} {
		var x Entropy
		if err := x.UnmarshalBinary(tc.b); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", name, err, tc.want)
		}
	}
	if err := e.Merge(NewEntropy(10, 12)); !errors.Is(err, ErrIncompatible) {
		t.Errorf("merging tail precisions 10 and 12: err = %v", err)
	}
}

func binary64(b []byte, v uint64) {
	for i := range 8 {
		b[i] = byte(v >> (8 * i))
	}
}

func FuzzEntropyUnmarshal(f *testing.F) {
	e := NewEntropy(3, 4)
	f.Add(mustMarshal(f, e))
	for i := range 10 {
		e.Update(strconv.Itoa(i%5), uint64(i))
	}
	f.Add(mustMarshal(f, e))
	f.Fuzz(func(t *testing.T, b []byte) {
		var e Entropy
		if !decoded(t, e.UnmarshalBinary(b)) {
			return
		}
		checkSpaceSaving(t, &e.head)
		sameEncoding(t, &e, b)
		for _, h := range []float64{e.Entropy(), e.Normalized()} {
			if math.IsNaN(h) || h < 0 {
				t.Fatalf("entropy %v", h)
			}
		}
		if n := e.Normalized(); n > 1 {
			t.Fatalf("Normalized %v above 1", n)
		}
		e.Update("x", 3)
		_ = e.Merge(&e)
		checkSpaceSaving(t, &e.head)
	})
}

// On a stream of distinct items, where the HyperLogLog estimate can
// overshoot, Distinct never exceeds the items seen.
func TestEntropyDistinctAtMostTotal(t *testing.T) {
	e := NewEntropy(8, 10)
	for i := range 3000 {
		e.Update(strconv.Itoa(i), 1)
		if e.Distinct() > e.Total() {
			t.Fatalf("after %d items: %d distinct", e.Total(), e.Distinct())
		}
	}
}
