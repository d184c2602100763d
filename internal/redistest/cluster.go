package redistest

import (
	"context"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterNodes is how many masters Cluster starts.
const clusterNodes = 3

// clusterWait bounds the creation of a cluster, from redis-cli's start until
// every node reports the cluster ok.
const clusterWait = 30 * time.Second

// Cluster starts a three-master Redis Cluster for the test (see ClusterAddrs)
// and returns a cluster client on it, closed at cleanup.
func Cluster(t testing.TB) *redis.ClusterClient {
	t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: ClusterAddrs(t), ContextTimeoutEnabled: true, DialerRetries: 1})
	t.Cleanup(func() { c.Close() })
	return c
}

// ClusterAddrs starts a Redis Cluster of three masters and no replicas on
// loopback, owned by the test, and returns the masters' addresses once every
// node reports cluster_state:ok with all 16384 slots assigned and ok. It
// creates the cluster with `redis-cli --cluster create`, so it needs
// redis-cli as well as redis-server.
func ClusterAddrs(t testing.TB) []string {
	t.Helper()
	masters, _ := startCluster(t, 0)
	return masters
}

// ClusterWithReplicas starts a Redis Cluster of three masters with one
// replica each, as ClusterAddrs does, and returns the masters' addresses and
// each master's replica, once every replica has synced. A replica can take
// over from its master with CLUSTER FAILOVER.
func ClusterWithReplicas(t testing.TB) (masters []string, replicaOf map[string]string) {
	t.Helper()
	return startCluster(t, 1)
}

func startCluster(t testing.TB, replicas int) (masters []string, replicaOf map[string]string) {
	t.Helper()
	cli := lookPath(t, "redis-cli")
	addrs := make([]string, clusterNodes*(1+replicas))
	for i := range addrs {
		addrs[i] = start(t, true)
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterWait)
	defer cancel()
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create %s: %v; its output:\n%s", strings.Join(addrs, " "), err, out)
	}
	for _, addr := range addrs {
		if info, ok := clusterOK(ctx, addr, len(addrs)); !ok {
			t.Fatalf("cluster node %s not ok within %v; its CLUSTER INFO:\n%s\nredis-cli --cluster create output:\n%s",
				addr, clusterWait, info, out)
		}
	}
	if replicas == 0 {
		return addrs, nil
	}
	// Which node is whose replica: redis-cli chooses.
	c := redis.NewClient(&redis.Options{Addr: addrs[0], MaxRetries: -1})
	defer c.Close()
	// The roles spread by gossip after redis-cli returns.
	var nodes string
	for {
		var err error
		nodes, err = c.ClusterNodes(ctx).Result()
		if err == nil && strings.Count(nodes, "slave") == clusterNodes*replicas {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("cluster replicas not known within %v: %v; CLUSTER NODES:\n%s", clusterWait, err, nodes)
		case <-time.After(20 * time.Millisecond):
		}
	}
	addrOf, masterOf := map[string]string{}, map[string]string{} // node id -> address; replica address -> master id
	for _, line := range strings.Split(strings.TrimSpace(nodes), "\n") {
		// <id> <ip:port@cport> <flags> <master id or -> ...
		f := strings.Fields(line)
		if len(f) < 4 {
			t.Fatalf("CLUSTER NODES line %q", line)
		}
		addr, _, _ := strings.Cut(f[1], "@")
		addrOf[f[0]] = addr
		if strings.Contains(f[2], "slave") {
			masterOf[addr] = f[3]
		}
	}
	replicaOf = map[string]string{}
	for replica, id := range masterOf {
		replicaOf[addrOf[id]] = replica
		if info, ok := waitInfo(ctx, replica, "replication", "master_link_status:up"); !ok {
			t.Fatalf("cluster replica %s not synced within %v; its INFO replication:\n%s", replica, clusterWait, info)
		}
	}
	// Every node, not only the first, must know every replica: a master
	// that has not heard of a replica yet ignores its failover vote request,
	// and a manual failover then times out.
	for _, a := range addrs {
		n := redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1})
		for {
			nodes, err := n.ClusterNodes(ctx).Result()
			if err == nil && strings.Count(nodes, "slave") == clusterNodes*replicas {
				break
			}
			select {
			case <-ctx.Done():
				n.Close()
				t.Fatalf("node %s does not know every replica within %v: %v; CLUSTER NODES:\n%s", a, clusterWait, err, nodes)
			case <-time.After(20 * time.Millisecond):
			}
		}
		n.Close()
	}
	for _, a := range addrs {
		if _, ok := masterOf[a]; !ok {
			masters = append(masters, a)
		}
	}
	if len(masters) != clusterNodes || len(replicaOf) != clusterNodes {
		t.Fatalf("cluster of %d masters and %d replicas, want %d of each:\n%s", len(masters), len(replicaOf), clusterNodes, nodes)
	}
	return masters, replicaOf
}

// clusterOK polls CLUSTER INFO on addr until it reports the cluster ok, every
// slot assigned and ok, and every node known, or ctx ends. It returns the
// last answer (or error) for the failure message.
func clusterOK(ctx context.Context, addr string, nodes int) (string, bool) {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	want := []string{
		"cluster_state:ok",
		"cluster_slots_assigned:16384",
		"cluster_slots_ok:16384",
		"cluster_known_nodes:" + strconv.Itoa(nodes),
	}
	return pollLines(ctx, 20*time.Millisecond, func(ctx context.Context) (string, error) { return c.ClusterInfo(ctx).Result() }, want)
}

// hasLines reports whether every line in want is a line of the CRLF-separated
// text info.
func hasLines(info string, want []string) bool {
	lines := strings.Split(info, "\r\n")
	for _, w := range want {
		if !slices.Contains(lines, w) {
			return false
		}
	}
	return true
}
