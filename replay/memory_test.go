package replay_test

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/replay"
)

// TestReplayMemoryBounded replays 200 000 generated lines of a day's log and
// checks that what the replay keeps is bounded, not what it took: the
// report's summaries stay within their caps whatever the input's size (top-k
// denied keys, timeline buckets, share series and their points, the lists
// of shares, rules and malformed lines), the heap in use stays well under
// the 512 MiB a 10-million-line replay is meant to fit in while it runs
// (sampled every 20 000 requests, no GC forced), and after a GC at the end
// the heap is under a generous bound. It measures no time.
func TestReplayMemoryBounded(t *testing.T) {
	if testing.Short() || raceDetector {
		t.Skip("replays 200 000 lines: not in -short or under the race detector")
	}
	const lines = 200_000
	path := filepath.Join(t.TempDir(), "big.log")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := replay.WriteBigLog(f, lines, 7); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	src, err := replay.OpenFile(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	const heapCap = 300 << 20 // bytes in use while running
	var peak uint64
	o := replay.Options{Progress: func(n int) {
		if n%20_000 != 0 {
			return
		}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		peak = max(peak, ms.HeapInuse)
	}}
	ctx, cancel := hangGuard(t)
	defer cancel()
	rep, err := replay.Run(ctx, o, src)
	if err != nil {
		t.Fatal(err)
	}
	st := rep.Sources[0].Stats
	if st.Lines != lines || st.Malformed == 0 {
		t.Fatalf("stats %+v: want %d lines, some malformed", st, lines)
	}
	if pr := rep.Producer; pr.Dropped != 0 || pr.Produced != pr.Logged {
		t.Errorf("producer %+v: want every record produced (a buffer sized for the replay drops none)", pr)
	}
	t.Logf("%d lines in %v; heap in use at most %d MiB while running", lines, rep.Elapsed.Round(time.Second), peak>>20)
	if peak > heapCap {
		t.Errorf("heap in use reached %d MiB while running; want at most %d MiB", peak>>20, heapCap>>20)
	}

	if n := len(rep.Sources[0].Malformed); n == 0 || n > 20 || n >= st.Malformed {
		t.Errorf("%d malformed lines listed of %d: want the first 20", n, st.Malformed)
	}
	if rep.Timeline.Len() > replay.MaxBuckets {
		t.Errorf("timeline: %d buckets > %d", rep.Timeline.Len(), replay.MaxBuckets)
	}
	denied := 0
	for _, rule := range rep.Rules.Rules {
		n := len(rep.DeniedKeys(rule.ID))
		denied += n
		if n > replay.DeniedKeysTracked {
			t.Errorf("rule %s: %d denied keys kept > %d", rule.ID, n, replay.DeniedKeysTracked)
		}
		if len(rep.TopDenied[rule.ID]) > 5 {
			t.Errorf("rule %s: %d top denied keys", rule.ID, len(rep.TopDenied[rule.ID]))
		}
	}
	if denied == 0 {
		t.Error("no key denied: the generated log should trip per-ip")
	}
	if len(rep.ShareSeries) > replay.MaxShareSeries+len(rep.Rules.Rules) {
		t.Errorf("%d share series > %d busiest keys and a default split per rule", len(rep.ShareSeries), replay.MaxShareSeries)
	}
	for k, s := range rep.ShareSeries {
		for reg, ps := range s.Points {
			if len(ps) > replay.MaxSharePoints {
				t.Errorf("share series %s, region %s: %d points > %d", k, reg, len(ps), replay.MaxSharePoints)
			}
		}
	}
	if rep.SharesWritten == 0 || len(rep.ShareLog) > replay.MaxShareLog || len(rep.LatestShares()) > replay.MaxShareKeys {
		t.Errorf("shares: %d written, %d listed, %d keys: want some, listed at most %d, at most %d keys",
			rep.SharesWritten, len(rep.ShareLog), len(rep.LatestShares()), replay.MaxShareLog, replay.MaxShareKeys)
	}
	if len(rep.DynamicRules) > replay.MaxDynamicRules {
		t.Errorf("%d dynamic rules listed > %d", len(rep.DynamicRules), replay.MaxDynamicRules)
	}

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("heap in use after the replay and a GC: %d MiB", ms.HeapInuse>>20)
	// About 50 MiB at 200 000 lines: the detector's phrase matchers (12
	// MiB, built once a process), kfake's log (about 14 MiB, which kfake
	// itself still reaches for a few seconds after its Close; gone 3 s
	// later) and the report's summaries (a few MiB). Until Limiter.Close
	// and the limiters' own pool of calls, the producer's buffer and the
	// limiters' tables (93 MiB then) were still reachable here too: a
	// pending timer of the limiters and sync's list of pools kept them
	// (TestRunLetsItsPartsGo, enforcer.TestCloseLetsTheLimiterGo).
	if ms.HeapInuse > 128<<20 {
		t.Errorf("heap in use after the replay and a GC: %d MiB; want at most 128 MiB", ms.HeapInuse>>20)
	}
	runtime.KeepAlive(rep)
}
