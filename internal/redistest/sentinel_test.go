package redistest_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/redistest"
)

// TestSentinelGroupFailover: after Failover the client writes to the
// promoted replica, and the old master is its replica.
func TestSentinelGroupFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	g := redistest.NewSentinelGroup(t)
	old := g.Master
	if err := g.Client.Set(ctx, "k", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := g.Failover(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("failover done in %v", time.Since(start))
	if g.Master == old || g.Replica != old {
		t.Fatalf("master %s, replica %s; the old master was %s", g.Master, g.Replica, old)
	}
	for {
		err := g.Client.Set(ctx, "k", "2", 0).Err()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no write through the Sentinel after the failover: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("writes again %v after the failover started", time.Since(start))
}
