package replay

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// A barrier's wait lasts as long as the pipeline makes progress, however
// long that is, and ends once it has made none for the stall time: a
// pipeline slowed by a busy machine (here one that advances every 20 ms,
// for 10 times the stall of 50 ms) is waited for; a stuck one is not.
func TestStallContext(t *testing.T) {
	var n atomic.Int64
	// Progress every 20 ms against a stall of 500 ms: a loaded machine
	// (load 17 under -race) held one 20 ms sleep past a 50 ms stall.
	const stall = 500 * time.Millisecond
	ctx, cancel := stallContext(context.Background(), stall, n.Load)
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		n.Add(1)
		if ctx.Err() != nil {
			t.Fatalf("ended after %d steps of progress: %v", n.Load(), context.Cause(ctx))
		}
	}
	stopped := time.Now()
	<-ctx.Done()
	if waited := time.Since(stopped); waited < stall {
		t.Errorf("ended %v after the last progress, before the stall time", waited)
	}
	cancel()
	cancel() // twice is safe
}
