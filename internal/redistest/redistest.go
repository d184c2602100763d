// Package redistest gives tests a real redis-server on loopback, a replica,
// a master and replica behind a Sentinel (SentinelGroup, with Failover), a
// real three-master Redis Cluster with or without a replica per master, and
// a fault-injecting TCP proxy (Proxy: refuse, blackhole, delay) to put
// between a client and any of them.
//
// Each call starts private redis-server processes on free loopback ports,
// owned by the test and killed at its cleanup, so tests in parallel packages
// never share state. Without the redis-server binary (and redis-cli, for a
// cluster) the test is skipped with the reason, except under CI (CI=true),
// where that fails the test: .ci/run installs them.
package redistest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server starts a redis-server for the test and returns a client on it,
// closed at cleanup, set up as the enforcer wants: no retries of timed-out
// commands, context deadlines applied, one dial per connection.
func Server(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: Addr(t), MaxRetries: -1, ContextTimeoutEnabled: true, DialerRetries: 1})
	t.Cleanup(func() { c.Close() })
	return c
}

// Addr starts a redis-server for the test and returns its address.
func Addr(t testing.TB) string {
	t.Helper()
	return start(t, false)
}

// AddrWith starts a redis-server for the test with extra config arguments,
// such as "--enable-debug-command", "local" (for DEBUG SLEEP), and returns
// its address.
func AddrWith(t testing.TB, extra ...string) string {
	t.Helper()
	return start(t, false, extra...)
}

// ReplicaOf starts a redis-server replicating from master (which may be an
// address where nothing listens) and returns its address; extra are more
// config arguments, such as "--replica-serve-stale-data", "no". It does not
// wait for the replica to sync.
func ReplicaOf(t testing.TB, master string, extra ...string) string {
	t.Helper()
	host, port, err := net.SplitHostPort(master)
	if err != nil {
		t.Fatal(err)
	}
	return start(t, false, append([]string{"--replicaof", host, port}, extra...)...)
}

// lookPath returns the path of the named binary. When it is missing it skips
// the test, or fails it under CI.
func lookPath(t testing.TB, name string) string {
	t.Helper()
	bin, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s not found: .ci/run must install it (deploy/ci/deps.sh)", name)
		}
		t.Skipf("no %s on PATH: run `make test`, which installs it", name)
	}
	return bin
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// start runs one redis-server with its data directory in a fresh temporary
// directory and returns its address once it accepts connections. A cluster
// node also gets --cluster-enabled with its nodes.conf in that directory and
// an explicit cluster bus port (the default, port+10000, may not exist).
//
// The port is free when chosen but another process may take it before
// redis-server binds it; a server that exits before listening is retried on
// new ports.
func start(t testing.TB, cluster bool, extra ...string) string {
	t.Helper()
	return startOn(t, cluster, func(port int) []string { return []string{"--port", strconv.Itoa(port)} }, extra...)
}

// startOn is start with the listening arguments of port (--port, or
// --port 0 and --tls-port for a TLS-only server).
func startOn(t testing.TB, cluster bool, listen func(port int) []string, extra ...string) string {
	t.Helper()
	bin := lookPath(t, "redis-server")
	const attempts = 3
	var log []byte
	for range attempts {
		dir := t.TempDir()
		port := freePort(t)
		args := append(listen(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", filepath.Join(dir, "redis.log"),
			// A replica syncs at once (the default waits 5 s for others).
			"--repl-diskless-sync-delay", "0")
		if cluster {
			args = append(args, "--cluster-enabled", "yes",
				"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
				"--cluster-port", strconv.Itoa(freePort(t)))
		}
		args = append(args, extra...)
		exited := spawn(t, bin, args...)
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		if listening(addr, exited) {
			return addr
		}
		log, _ = os.ReadFile(filepath.Join(dir, "redis.log"))
		select {
		case <-exited: // e.g. the port was taken: try others
		default:
			t.Fatalf("redis-server did not listen on %s within 2 s; its log:\n%s", addr, log)
		}
	}
	t.Fatalf("redis-server exited before listening, %d times; the last log:\n%s", attempts, log)
	return ""
}

// spawn starts bin with args, killed at the test's cleanup, and returns a
// channel closed when it exits. It is killed too if the test binary dies
// first (go test's timeout, a SIGKILL): Linux's parent-death signal, which
// fires when the thread that started it ends. Go ends a thread only with a
// goroutine that locked it and did not unlock it: do not call this from
// such a goroutine (a network namespace's, say).
func spawn(t testing.TB, bin string, args ...string) <-chan struct{} {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s %v: %v", bin, args, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	return exited
}

// listening waits up to 2 s for addr to accept a connection, and reports
// false early if the server exits.
func listening(addr string, exited <-chan struct{}) bool {
	for range 200 {
		select {
		case <-exited:
			return false
		default:
		}
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}
