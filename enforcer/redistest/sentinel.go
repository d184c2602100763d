package redistest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
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
	master := start(t, false)
	bin := lookPath(t, "redis-server")
	dir := t.TempDir()
	port := freePort(t)
	conf := filepath.Join(dir, "sentinel.conf")
	host, mport := master[:len("127.0.0.1")], master[len("127.0.0.1:"):]
	body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\nsentinel monitor %s %s %s 1\n",
		port, dir, filepath.Join(dir, "sentinel.log"), SentinelMaster, host, mport)
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
	s := redis.NewSentinelClient(&redis.Options{Addr: addr})
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
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: SentinelMaster, SentinelAddrs: []string{addr},
		MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	return c
}
