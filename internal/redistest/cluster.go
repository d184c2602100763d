package redistest

import (
	"context"
	"fmt"
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
	return startClusterWith(t, replicas, "")
}

// startClusterWith is startCluster with requirepass and masterauth password
// on every node ("": none).
func startClusterWith(t testing.TB, replicas int, password string) (masters []string, replicaOf map[string]string) {
	t.Helper()
	cli := lookPath(t, "redis-cli")
	if password != "" && replicas > 0 {
		t.Fatal("redistest: a Cluster with replicas and a password is not supported (its replica checks dial without one)")
	}
	addrs := make([]string, clusterNodes*(1+replicas))
	var auth []string
	if password != "" {
		auth = []string{"--requirepass", password, "--masterauth", password}
	}
	for i := range addrs {
		addrs[i] = start(t, true, auth...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterWait)
	defer cancel()
	var args []string
	if password != "" {
		args = []string{"-a", password, "--no-auth-warning"}
	}
	args = append(append(args, "--cluster", "create"), addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create %s: %v; its output:\n%s", strings.Join(addrs, " "), err, out)
	}
	for _, addr := range addrs {
		if info, ok := clusterOK(ctx, addr, password, len(addrs)); !ok {
			t.Fatalf("cluster node %s not ok within %v; its CLUSTER INFO:\n%s\nredis-cli --cluster create output:\n%s",
				addr, clusterWait, info, out)
		}
	}
	// Every node on one current epoch: a replica whose epoch lags a
	// master's (redis-cli gives each node its own config epoch, which
	// spreads by gossip) asks for votes in an election that master refuses
	// as old, and a manual failover then times out.
	if info, ok := sameEpoch(ctx, addrs, password); !ok {
		t.Fatalf("cluster nodes not on one current epoch within %v; CLUSTER INFO cluster_current_epoch per node: %s", clusterWait, info)
	}
	if replicas == 0 {
		return addrs, nil
	}
	// Which node is whose replica: redis-cli chooses.
	c := redis.NewClient(&redis.Options{Addr: addrs[0], Password: password, MaxRetries: -1})
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
		n := redis.NewClient(&redis.Options{Addr: a, Password: password, MaxRetries: -1})
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

// sameEpoch polls every node's CLUSTER INFO until they report the same
// cluster_current_epoch, or ctx ends. It returns the last epochs seen.
func sameEpoch(ctx context.Context, addrs []string, password string) (string, bool) {
	clients := make([]*redis.Client, len(addrs))
	for i, a := range addrs {
		clients[i] = redis.NewClient(&redis.Options{Addr: a, Password: password, MaxRetries: -1})
		defer clients[i].Close()
	}
	last := ""
	for {
		epochs := map[string]bool{}
		var seen []string
		for i, c := range clients {
			info, err := c.ClusterInfo(ctx).Result()
			e := infoField(info, "cluster_current_epoch")
			if err != nil || e == "" {
				e = "?"
			}
			epochs[e] = true
			seen = append(seen, addrs[i]+"="+e)
		}
		last = strings.Join(seen, " ")
		if len(epochs) == 1 && !epochs["?"] {
			return last, true
		}
		select {
		case <-ctx.Done():
			return last, false
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// infoField returns the value of field in CLUSTER INFO or INFO text, or "".
func infoField(info, field string) string {
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return v
		}
	}
	return ""
}

// mfTimeout is how long Redis gives a manual failover (CLUSTER FAILOVER)
// before it aborts it: CLUSTER_MF_TIMEOUT.
const mfTimeout = 5 * time.Second

// FailoverWait is the bound ClusterFailover waits for: a manual failover's
// own timeout plus one election's, which Redis sets to twice
// cluster-node-timeout, at least 2 s (clusterHandleSlaveFailover's
// auth_timeout), plus a second of slack for the news to spread by gossip.
func FailoverWait(nodeTimeout time.Duration) time.Duration {
	return mfTimeout + max(2*nodeTimeout, 2*time.Second) + time.Second
}

// ClusterFailover makes replica take over from its master with CLUSTER
// FAILOVER, and waits until the cluster reports it, as Redis does: the
// replica's CLUSTER NODES says myself,master; every one of nodes lists the
// replica as a master; the old master says it is a replica; and every
// node's CLUSTER INFO says cluster_state:ok. It waits at most FailoverWait of the
// replica's cluster-node-timeout (and until ctx ends), and once the manual
// failover's own 5 s are past with the replica still one, it fails: asking
// again would not help, since the masters that voted refuse a second vote
// for a replica of the same master within twice cluster-node-timeout.
func ClusterFailover(ctx context.Context, replica string, nodes []string) error {
	r := redis.NewClient(&redis.Options{Addr: replica, MaxRetries: -1})
	defer r.Close()
	cfg, err := r.ConfigGet(ctx, "cluster-node-timeout").Result()
	if err != nil {
		return fmt.Errorf("CONFIG GET cluster-node-timeout on %s: %w", replica, err)
	}
	ms, err := strconv.Atoi(cfg["cluster-node-timeout"])
	if err != nil {
		return fmt.Errorf("cluster-node-timeout %q on %s: %w", cfg["cluster-node-timeout"], replica, err)
	}
	nodesText, err := r.ClusterNodes(ctx).Result()
	if err != nil {
		return err
	}
	old := ""
	self := nodeLine(nodesText, replica)
	if self == nil || !strings.Contains(self[2], "slave") {
		return fmt.Errorf("%s is not a cluster replica; CLUSTER NODES:\n%s", replica, nodesText)
	}
	for _, line := range strings.Split(strings.TrimSpace(nodesText), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == self[3] {
			old, _, _ = strings.Cut(f[1], "@")
		}
	}
	wait := FailoverWait(time.Duration(ms) * time.Millisecond)
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	start := time.Now()
	if err := r.ClusterFailover(ctx).Err(); err != nil {
		return fmt.Errorf("CLUSTER FAILOVER on %s: %w", replica, err)
	}
	clients := make([]*redis.Client, len(nodes))
	for i, a := range nodes {
		clients[i] = redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1})
		defer clients[i].Close()
	}
	last := ""
	for {
		done, why := failedOver(ctx, clients, nodes, replica, old)
		if done {
			return nil
		}
		last = why
		select {
		case <-ctx.Done():
			return fmt.Errorf("replica %s did not take over from %s within %v (cluster-node-timeout %d ms): %s", replica, old, wait, ms, last)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Since(start) > mfTimeout+time.Second {
			if text, err := r.ClusterNodes(ctx).Result(); err == nil {
				if l := nodeLine(text, replica); l != nil && !strings.Contains(l[2], "master") {
					return fmt.Errorf("replica %s still a replica of %s %v after CLUSTER FAILOVER: Redis aborted the manual failover (%v); %s", replica, old, time.Since(start).Round(time.Millisecond), mfTimeout, last)
				}
			}
		}
	}
}

// failedOver reports whether every node lists replica as a master, old says
// it is a replica, and every node says cluster_state:ok; else what it saw
// first that is not so.
func failedOver(ctx context.Context, clients []*redis.Client, addrs []string, replica, old string) (bool, string) {
	for i, c := range clients {
		text, err := c.ClusterNodes(ctx).Result()
		if err != nil {
			return false, fmt.Sprintf("CLUSTER NODES on %s: %v", addrs[i], err)
		}
		if l := nodeLine(text, replica); l == nil || !strings.Contains(l[2], "master") {
			return false, fmt.Sprintf("%s does not list %s as a master yet: %v", addrs[i], replica, l)
		}
		// The old master knows it is a replica at once; the others learn its
		// role from its own pings, which reach each within half the node
		// timeout: not waited for (the slots' owner is what clients need).
		if l := nodeLine(text, old); addrs[i] == old && (l == nil || !strings.Contains(l[2], "slave")) {
			return false, fmt.Sprintf("%s does not say it is a replica yet: %v", old, l)
		}
		info, err := c.ClusterInfo(ctx).Result()
		if err != nil || infoField(info, "cluster_state") != "ok" {
			return false, fmt.Sprintf("%s: cluster_state %q (%v)", addrs[i], infoField(info, "cluster_state"), err)
		}
	}
	return true, ""
}

// nodeLine returns the fields of the CLUSTER NODES line of addr, or nil.
func nodeLine(text, addr string) []string {
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		if a, _, _ := strings.Cut(f[1], "@"); a == addr {
			return f
		}
	}
	return nil
}

// clusterOK polls CLUSTER INFO on addr until it reports the cluster ok, every
// slot assigned and ok, and every node known, or ctx ends. It returns the
// last answer (or error) for the failure message.
func clusterOK(ctx context.Context, addr, password string, nodes int) (string, bool) {
	c := redis.NewClient(&redis.Options{Addr: addr, Password: password, MaxRetries: -1})
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
