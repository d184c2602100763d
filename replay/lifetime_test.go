package replay

import (
	"context"
	"runtime"
	"testing"
	"time"
	"weak"

	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/pipeline"
)

// A replay is a library call that a process can make again and again: once
// Run has returned, one GC frees its limiters (their 64K-entry hot-key
// tables) and its producer (its buffer), and a second replay keeps none of
// the first's. Before Limiter.Close and the limiters' own pool of calls, a
// pending timer and sync's list of pools kept them, 93 MiB at 200 000
// lines, for a second and a GC after Run (TestReplayMemoryBounded).
func TestRunLetsItsPartsGo(t *testing.T) {
	var parts []func() bool // each reports whether its part is still reachable
	testHookParts = func(prod *pipeline.Producer, lims []regionLimiter) {
		p := weak.Make(prod)
		parts = append(parts, func() bool { return p.Value() != nil })
		for _, l := range lims {
			w := weak.Make(l.(*enforcer.Limiter))
			parts = append(parts, func() bool { return w.Value() != nil })
		}
	}
	defer func() { testHookParts = nil }()
	for run := 1; run <= 2; run++ {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		rep, err := Run(ctx, Options{}, Generate(Scenario{Duration: 20 * time.Second, Clients: 20}))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if rep.Requests == 0 {
			t.Fatal("no request replayed")
		}
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		t.Logf("replay %d: %d requests; heap in use after a GC: %d MiB", run, rep.Requests, ms.HeapInuse>>20)
		for i, alive := range parts {
			if alive() {
				t.Errorf("after replay %d and a GC: replay %d's %s is still reachable", run, i/4+1, []string{"producer", "limiter", "limiter", "limiter"}[i%4])
			}
		}
	}
	if len(parts) != 8 {
		t.Fatalf("%d parts seen, want a producer and 3 limiters a replay", len(parts))
	}
}
