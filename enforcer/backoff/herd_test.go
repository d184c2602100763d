package backoff

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// herd runs n clients, each with its own Transport (its options from
// opts(i)), through a fake server inside a synctest bubble, whose virtual
// clock the transports' default Clock reads: every client sends one GET at
// t = 0, when the server answers 429 with Retry-After: 1 (and sluice's
// RateLimit fields); from t = 1 s on it answers 200. It returns the send
// time of every retry, and how many clients got their 200.
func herd(t *testing.T, n int, opts func(i int) []Opt) (retries []time.Duration, ok int) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		srv := &server{now: time.Now, reply: func(int, *http.Request) *http.Response {
			if time.Since(start) < time.Second {
				return response(429, "Retry-After: 1", `RateLimit-Policy: "per-key";q=1000;w=1`, `RateLimit: "per-key";r=0;t=1`)
			}
			return response(200)
		}}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := range n {
			tr := newTransport(t, srv, opts(i)...)
			wg.Go(func() {
				req, _ := http.NewRequest(http.MethodGet, "http://api.test/v1/items", nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
				mu.Lock()
				defer mu.Unlock()
				if resp.StatusCode == 200 {
					ok++
				}
			})
		}
		wg.Wait()
		first := 0
		for _, r := range srv.requests() {
			if d := r.at.Sub(start); d == 0 {
				first++
			} else {
				retries = append(retries, d)
			}
		}
		if first != n {
			t.Fatalf("%d first attempts at t = 0, want %d", first, n)
		}
	})
	return retries, ok
}

// largestShare puts send times into 100 ms buckets and returns the largest
// bucket's share of them, where it starts, and the non-empty buckets as
// "start:count" in order.
func largestShare(sends []time.Duration) (share float64, at time.Duration, hist string) {
	const width = 100 * time.Millisecond
	counts := map[time.Duration]int{}
	var last time.Duration
	for _, s := range sends {
		b := s.Truncate(width)
		counts[b]++
		last = max(last, b)
	}
	var parts []string
	best := 0
	for b := time.Duration(0); b <= last; b += width {
		if c := counts[b]; c > 0 {
			parts = append(parts, fmt.Sprintf("%.1fs:%d", b.Seconds(), c))
			if c > best {
				best, at = c, b
			}
		}
	}
	return float64(best) / float64(len(sends)), at, strings.Join(parts, " ")
}

// TestThunderingHerd: 1 000 clients throttled at the same instant with
// Retry-After: 1 retry through the Transport's policy; no retry comes before
// 1 s, every client gets its 200, and no 100 ms bucket holds more than 10% of
// the retries. A client that waits exactly Retry-After (the same Transport
// with a random source that always draws 0, so every sleep is its floor)
// puts them all in one bucket: the assertion can fail.
//
// go test -run TestThunderingHerd -v ./enforcer/backoff/
func TestThunderingHerd(t *testing.T) {
	const n = 1000
	retries, ok := herd(t, n, func(i int) []Opt { return []Opt{WithRand(rand.NewPCG(2015, uint64(i)))} })
	share, at, hist := largestShare(retries)
	t.Logf("decorrelated jitter: %d retries, largest share in a 100 ms bucket %.1f%% (at %v); buckets %s", len(retries), 100*share, at, hist)
	if len(retries) != n || ok != n {
		t.Fatalf("%d retries and %d successes, want %d of each", len(retries), ok, n)
	}
	for _, r := range retries {
		if r < time.Second {
			t.Fatalf("a retry at %v, before Retry-After: 1", r)
		}
	}
	if share > 0.10 {
		t.Errorf("%.1f%% of retries in one 100 ms bucket, want at most 10%%", 100*share)
	}

	fixed, ok := herd(t, n, func(int) []Opt { return []Opt{WithRand(zeroSource{})} })
	fshare, fat, fhist := largestShare(fixed)
	t.Logf("fixed delay (exactly Retry-After): %d retries, largest share %.1f%% (at %v); buckets %s", len(fixed), 100*fshare, fat, fhist)
	if ok != n || fshare <= 0.10 {
		t.Errorf("the fixed-delay herd: %d successes, largest share %.1f%%; want %d, and above 10%% (else the assertion above cannot fail)", ok, 100*fshare, n)
	}
}
