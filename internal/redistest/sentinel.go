package redistest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelMaster is the master name Sentinel monitors.
const SentinelMaster = "sluice"

// Sentinel starts a redis-server and one Redis Sentinel monitoring it as
// SentinelMaster, owned by the test, and returns a failover client through
// the Sentinel (go-redis's Sentinel support), closed at cleanup.
func Sentinel(t testing.TB) *redis.Client {
	t.Helper()
	addr := startSentinel(t, start(t, false))
	return failoverClient(t, addr)
}

// SentinelGroup is a master with one replica and a Sentinel that monitors
// them as SentinelMaster, for failover tests. Start one with
// NewSentinelGroup.
type SentinelGroup struct {
	// Master and Replica are the addresses of the master and its replica;
	// Failover swaps them.
	Master, Replica string
	// Sentinel is the Sentinel's address.
	Sentinel string
	// Client is a failover client through the Sentinel, as the enforcer
	// wants it (no retries, context deadlines applied, one dial per
	// connection), closed at cleanup.
	Client *redis.Client
}

// NewSentinelGroup starts a master, a replica that has synced from it, and
// a Sentinel that knows both, owned by the test.
func NewSentinelGroup(t testing.TB) *SentinelGroup {
	t.Helper()
	master := start(t, false)
	replica := ReplicaOf(t, master)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Synced before the Sentinel starts: it learns of replicas from the
	// master's INFO, which it reads on connecting and then every 10 s.
	if info, ok := waitInfo(ctx, replica, "replication", "role:slave", "master_link_status:up"); !ok {
		t.Fatalf("replica %s of %s not synced within 10 s; its INFO replication:\n%s", replica, master, info)
	}
	addr := startSentinel(t, master)
	s := redis.NewSentinelClient(&redis.Options{Addr: addr})
	defer s.Close()
	for {
		if known(ctx, s, replica) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("sentinel on %s does not know replica %s within 10 s", addr, replica)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return &SentinelGroup{Master: master, Replica: replica, Sentinel: addr, Client: failoverClient(t, addr)}
}

// known reports whether the Sentinel lists replica as a healthy replica
// that it can promote.
func known(ctx context.Context, s *redis.SentinelClient, replica string) bool {
	rs, err := s.Replicas(ctx, SentinelMaster).Result()
	if err != nil {
		return false
	}
	for _, r := range rs {
		if r["ip"]+":"+r["port"] == replica && r["flags"] == "slave" && r["master-link-status"] == "ok" {
			return true
		}
	}
	return false
}

// Failover promotes the replica and demotes the old master to a replica of
// it: SENTINEL FAILOVER, a wait until the replica reports itself master,
// then REPLICAOF on the old master at once (the Sentinel itself would demote
// it only some 8 s after it sees it again; until then it still takes writes
// from clients that have not switched). It returns when both are done, or
// ctx ends, and swaps Master and Replica.
func (g *SentinelGroup) Failover(ctx context.Context) error {
	s := redis.NewSentinelClient(&redis.Options{Addr: g.Sentinel})
	defer s.Close()
	if err := s.Failover(ctx, SentinelMaster).Err(); err != nil {
		return fmt.Errorf("SENTINEL FAILOVER: %w", err)
	}
	if info, ok := waitInfo(ctx, g.Replica, "replication", "role:master"); !ok {
		return fmt.Errorf("replica %s not promoted: %w; its INFO replication:\n%s", g.Replica, ctx.Err(), info)
	}
	old := redis.NewClient(&redis.Options{Addr: g.Master})
	defer old.Close()
	host, port, _ := strings.Cut(g.Replica, ":")
	if err := old.ReplicaOf(ctx, host, port).Err(); err != nil {
		return fmt.Errorf("REPLICAOF on the old master %s: %w", g.Master, err)
	}
	g.Master, g.Replica = g.Replica, g.Master
	return nil
}

// startSentinel starts a Sentinel monitoring master as SentinelMaster with a
// quorum of 1 and returns its address once it answers for the master.
func startSentinel(t testing.TB, master string) string {
	t.Helper()
	return startSentinelWith(t, master, "", "")
}

// startSentinelWith is startSentinel for a master that needs masterPass,
// with a Sentinel that needs sentinelPass ("": none).
func startSentinelWith(t testing.TB, master, masterPass, sentinelPass string) string {
	t.Helper()
	bin := lookPath(t, "redis-server")
	dir := t.TempDir()
	port := freePort(t)
	conf := filepath.Join(dir, "sentinel.conf")
	host, mport, _ := strings.Cut(master, ":")
	// A master silent for 1 s is down (default 30 s), so that a test of a
	// failed master fails over within seconds.
	body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\nsentinel monitor %s %s %s 1\n"+
		"sentinel down-after-milliseconds %s 1000\nsentinel failover-timeout %s 10000\n",
		port, dir, filepath.Join(dir, "sentinel.log"), SentinelMaster, host, mport, SentinelMaster, SentinelMaster)
	if masterPass != "" {
		body += fmt.Sprintf("sentinel auth-pass %s %s\n", SentinelMaster, masterPass)
	}
	if sentinelPass != "" {
		body += fmt.Sprintf("requirepass %s\n", sentinelPass)
	}
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	exited := spawn(t, bin, conf, "--sentinel")
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if !listening(addr, exited) {
		log, _ := os.ReadFile(filepath.Join(dir, "sentinel.log"))
		t.Fatalf("redis sentinel did not listen on %s; its log:\n%s", addr, log)
	}
	// Wait until the Sentinel answers for the master.
	s := redis.NewSentinelClient(&redis.Options{Addr: addr, Password: sentinelPass})
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		if a, err := s.GetMasterAddrByName(ctx, SentinelMaster).Result(); err == nil && len(a) == 2 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("sentinel on %s does not know master %s within 10 s", addr, SentinelMaster)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return addr
}

func failoverClient(t testing.TB, sentinel string) *redis.Client {
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: SentinelMaster, SentinelAddrs: []string{sentinel},
		MaxRetries: -1, ContextTimeoutEnabled: true, DialerRetries: 1})
	t.Cleanup(func() { c.Close() })
	return c
}

// waitInfo polls INFO section on addr until it has every line in want, or
// ctx ends. It returns the last answer (or error) for a failure message.
func waitInfo(ctx context.Context, addr, section string, want ...string) (string, bool) {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	return pollLines(ctx, 10*time.Millisecond, func(ctx context.Context) (string, error) { return c.Info(ctx, section).Result() }, want)
}

// pollLines calls get every interval until its answer holds every line of
// want, or ctx ends. It returns the last answer (or error text).
func pollLines(ctx context.Context, every time.Duration, get func(context.Context) (string, error), want []string) (string, bool) {
	last := ""
	for {
		info, err := get(ctx)
		if err != nil {
			last = err.Error()
		} else {
			last = info
			if hasLines(info, want) {
				return info, true
			}
		}
		select {
		case <-ctx.Done():
			return last, false
		case <-time.After(every):
		}
	}
}
