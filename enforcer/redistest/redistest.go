// Package redistest gives tests a real redis-server on loopback.
//
// Each call starts a private redis-server on a free loopback port, owned by
// the test and stopped at its cleanup, so tests in parallel packages never
// share state. Without a redis-server binary the test is skipped with the
// reason, except under CI (CI=true), where that fails the test: .ci/run
// installs it.
package redistest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server starts a redis-server for the test and returns a client on it,
// closed at cleanup.
func Server(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: Addr(t)})
	t.Cleanup(func() { c.Close() })
	return c
}

// Addr starts a redis-server for the test and returns its address.
func Addr(t testing.TB) string {
	t.Helper()
	return start(t)
}

func start(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("redis-server not found: .ci/run must install it")
		}
		t.Skip("no redis-server on PATH: run `make test`, which installs it")
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
