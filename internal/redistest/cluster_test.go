package redistest_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/internal/redistest"
)

// TestCluster checks that Cluster is a real, sharded cluster: keys spread
// over every master, and a multi-key command across slots is refused with
// CROSSSLOT, as only Redis Cluster does.
func TestCluster(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Cluster(t)

	const n = 1000
	slots := map[int64]bool{}
	for i := range n {
		k := fmt.Sprintf("key:%d", i)
		if err := rdb.Set(ctx, k, i, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
		s, err := rdb.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		slots[s] = true
	}
	for i := range n {
		k := fmt.Sprintf("key:%d", i)
		if v, err := rdb.Get(ctx, k).Int(); err != nil || v != i {
			t.Fatalf("GET %s = %d, %v; want %d", k, v, err, i)
		}
	}
	if len(slots) < n*9/10 {
		t.Errorf("%d keys fell in only %d slots", n, len(slots))
	}

	// Every master holds some of the keys. ForEachMaster calls in parallel.
	var mu sync.Mutex
	var sizes []int64
	err := rdb.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		size, err := c.DBSize(ctx).Result()
		mu.Lock()
		sizes = append(sizes, size)
		mu.Unlock()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(sizes) != 3 || slices.Contains(sizes, 0) {
		t.Errorf("keys per master = %v, want 3 masters holding some each", sizes)
	}

	a, b := "a", "b"
	sa, errA := rdb.ClusterKeySlot(ctx, a).Result()
	sb, errB := rdb.ClusterKeySlot(ctx, b).Result()
	if errA != nil || errB != nil {
		t.Fatal(errA, errB)
	}
	if sa == sb {
		t.Fatalf("%q and %q share slot %d; pick other keys", a, b, sa)
	}
	err = rdb.MSet(ctx, a, "1", b, "2").Err()
	if err == nil || !strings.HasPrefix(err.Error(), "CROSSSLOT") {
		t.Fatalf("MSET across slots %d and %d: err = %v, want CROSSSLOT", sa, sb, err)
	}
	// The same keys under one hash tag share a slot and are accepted.
	if err := rdb.MSet(ctx, "{t}a", "1", "{t}b", "2").Err(); err != nil {
		t.Fatalf("MSET in one slot: %v", err)
	}
}

// TestClusterWithReplicas: every master has a synced replica that takes
// over with CLUSTER FAILOVER, as the cluster reports it (ClusterFailover:
// node roles in every node's CLUSTER NODES, cluster_state:ok), within the
// bound Redis sets from cluster-node-timeout. It failed 2 runs in 5 when it
// waited a fixed 10 s for INFO's role, on nodes not yet on one epoch (issue
// 20, item 12).
func TestClusterWithReplicas(t *testing.T) {
	ctx := context.Background()
	masters, replicaOf := redistest.ClusterWithReplicas(t)
	if len(masters) != 3 || len(replicaOf) != 3 {
		t.Fatalf("masters %v, replicas %v", masters, replicaOf)
	}
	var all []string
	for _, m := range masters {
		all = append(all, m, replicaOf[m])
	}
	start := time.Now()
	if err := redistest.ClusterFailover(ctx, replicaOf[masters[0]], all); err != nil {
		t.Fatal(err)
	}
	t.Logf("the replica took over in %v", time.Since(start))
	r := redis.NewClient(&redis.Options{Addr: replicaOf[masters[0]]})
	defer r.Close()
	if info := r.Info(ctx, "replication").Val(); !strings.Contains(info, "role:master") {
		t.Errorf("the new master's INFO replication:\n%s", info)
	}
	if d := redistest.FailoverWait(15 * time.Second); d != 36*time.Second {
		t.Errorf("FailoverWait(15 s) = %v, want 5 s + 30 s + 1 s", d)
	}
}
