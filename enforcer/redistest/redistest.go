// Package redistest gives tests a real redis-server on loopback.
//
// Server returns a client for REDIS_ADDR when it is set (the test script's
// server), else starts a private redis-server on a free loopback port for the
// test. Without either, the test is skipped with the reason — except under CI
// (CI=true), where a missing Redis fails the test, since .ci/run installs it.
package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

var db atomic.Int32

// Server returns a client on a real Redis whose selected database the test
// owns: it is flushed now and closed at cleanup. Tests that share REDIS_ADDR
// get databases 1-15 in turn, so up to 15 may run at once.
func Server(t testing.TB) *redis.Client {
	t.Helper()
	addr := os.Getenv("REDIS_ADDR")
	n := 0
	if addr == "" {
		addr = start(t)
	} else {
		n = int(db.Add(1)%15) + 1
	}
	c := redis.NewClient(&redis.Options{Addr: addr, DB: n})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.FlushDB(ctx).Err(); err != nil {
		t.Fatalf("redis at %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Addr returns the address of a real Redis for tests that build their own
// clients, starting one as Server does.
func Addr(t testing.TB) string {
	t.Helper()
	if a := os.Getenv("REDIS_ADDR"); a != "" {
		return a
	}
	return start(t)
}

func start(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("redis-server not found and REDIS_ADDR unset: .ci/run must install it")
		}
		t.Skip("no redis-server on PATH and REDIS_ADDR unset: run `make test`, which installs and starts one")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting redis-server: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	for i := 0; i < 200; i++ {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return addr
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("redis-server did not listen on %s", addr)
	return ""
}
