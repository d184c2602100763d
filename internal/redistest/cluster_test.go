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

// TestClusterWithReplicas: every master has a synced replica that can take
// over with CLUSTER FAILOVER.
func TestClusterWithReplicas(t *testing.T) {
	ctx := context.Background()
	masters, replicaOf := redistest.ClusterWithReplicas(t)
	if len(masters) != 3 || len(replicaOf) != 3 {
		t.Fatalf("masters %v, replicas %v", masters, replicaOf)
	}
	r := redis.NewClient(&redis.Options{Addr: replicaOf[masters[0]]})
	defer r.Close()
	// A manual failover that the master does not acknowledge within Redis's
	// 5 s (CLUSTER_MF_TIMEOUT, seen on a loaded machine) is aborted and the
	// replica stays one: ask once more before calling it a failure.
	tookOver := func() bool {
		if err := r.ClusterFailover(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if info := r.Info(ctx, "replication").Val(); strings.Contains(info, "role:master") {
				return true
			}
		}
		return false
	}
	if !tookOver() && !tookOver() {
		t.Fatal("the replica did not take over within 10 s, twice")
	}
}
