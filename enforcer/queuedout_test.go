package enforcer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// TestQueuedOutBehindAFailedCallOpensTheBreaker: with Redis silent, two
// decisions hold the node's two connections and the others wait in the
// batcher's queue until their deadlines pass, unsent. Those count as
// failures for the circuit breaker when the node's last call failed, up to
// 4 × Breaker.Failures of them per failed call: a stalled Redis makes few,
// long calls, and counting only the calls (4 failures here against 4
// healthy ones: not more than half) would leave it closed while every
// decision fails; with 12 of the 18 queued-out decisions, 16 of 20.
func TestQueuedOutBehindAFailedCallOpensTheBreaker(t *testing.T) {
	addr := redistest.Addr(t)
	rdb, stall := stallingClient(t, addr)
	l, err := enforcer.New(rdb, mustSet(t, "domain: f\nrules: [{id: r, match: [{key: user}], limit: 1000, period: 1s, failure_mode: open_unlimited}]"),
		enforcer.Options{Budget: 50 * time.Millisecond, Breaker: enforcer.BreakerOptions{Failures: 3, Cooldown: time.Hour}, HotKeys: enforcer.HotKeyOptions{Table: -1, LeaseBlock: -1},
			MaxInFlight: -1}) // no in-flight gate: every decision reaches the batcher's queue
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if d := decideAny(t, l, req(0, 1, rules.KeyUser, fmt.Sprint("h", i))); d.Err != nil {
			t.Fatalf("healthy %d: %v (err %v)", i, d.Outcome, d.Err)
		}
	}
	stall.Store(addr)
	// A wave: two decisions take the connections (their calls time out after
	// 2 × Budget), then short ones queue behind them and leave at their
	// callers' 30 ms deadlines.
	wave := func(w, short int) (queuedOut int) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		decideIn := func(user string, timeout time.Duration) {
			defer wg.Done()
			ctx := context.Background()
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			d, err := l.Check(ctx, req(0, 1, rules.KeyUser, user))
			if err != nil {
				t.Errorf("%s: %v", user, err)
				return
			}
			if d.Err == nil {
				t.Errorf("%s: %v with Redis silent", user, d.Outcome)
			}
			if errors.Is(d.Err, context.DeadlineExceeded) && timeout > 0 {
				mu.Lock()
				queuedOut++
				mu.Unlock()
			}
		}
		wg.Add(2)
		go decideIn(fmt.Sprint("w", w, "a"), 0)
		go decideIn(fmt.Sprint("w", w, "b"), 0)
		time.Sleep(10 * time.Millisecond)
		for i := range short {
			wg.Add(1)
			go decideIn(fmt.Sprint("w", w, "s", i), 30*time.Millisecond)
		}
		wg.Wait()
		return queuedOut
	}
	wave(1, 0) // two failed calls: the node's last call failed
	if n := wave(2, 18); n < 18 {
		t.Fatalf("%d of 18 decisions left the queue unsent at their deadlines, want all", n)
	}
	stall.Store("")
	if d := decideAny(t, l, req(0, 1, rules.KeyUser, "after")); !errors.Is(d.Err, enforcer.ErrBreakerOpen) {
		t.Errorf("after two calls failed and the decisions queued behind them left unsent: %v (err %v), want the breaker open", d.Outcome, d.Err)
	}
}
