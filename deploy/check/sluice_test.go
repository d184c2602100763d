package check

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// binDir holds the sluice binary the tests build, removed after them.
var binDir string

func TestMain(m *testing.M) {
	d, err := os.MkdirTemp("", "sluice-deploy-check-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = d
	code := m.Run()
	os.RemoveAll(d)
	os.Exit(code)
}

var (
	buildOnce sync.Once
	buildErr  error
)

// goCommand is the go command running these tests ($GOROOT/bin/go, which
// go test sets), else the one on PATH.
func goCommand() string {
	if root := os.Getenv("GOROOT"); root != "" {
		if p := filepath.Join(root, "bin", "go"); fileExists(p) {
			return p
		}
	}
	return "go"
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// sluiceBinary builds cmd/sluice once per test run, in the main module (its
// own go.mod and go.sum, as `make build` does), and returns its path.
func sluiceBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(binDir, "sluice")
	buildOnce.Do(func() {
		cmd := exec.Command(goCommand(), "build", "-o", bin, "./cmd/sluice")
		cmd.Dir = "../.."
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/sluice: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return bin
}

// syncBuffer is a bytes.Buffer a process's stderr and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// runSluice runs the built `sluice args...` until the test ends, with its
// stderr (its log) in the returned buffer. It returns a channel closed when
// the process exits. At cleanup it sends SIGTERM, as Kubernetes does, and
// wants a clean exit (status 0) within the given time with stopped in the
// log.
func runSluice(t *testing.T, args []string, stopped string, within time.Duration) (*syncBuffer, <-chan struct{}) {
	t.Helper()
	log := new(syncBuffer)
	cmd := exec.Command(sluiceBinary(t), args...)
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatalf("sluice %s: %v", args[0], err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
			if waitErr != nil {
				t.Errorf("%s: %v", args[0], waitErr)
			}
		case <-time.After(within):
			t.Errorf("%s did not stop within %v of SIGTERM", args[0], within)
			_ = cmd.Process.Kill()
			<-exited
		}
		if !strings.Contains(log.String(), stopped) {
			t.Errorf("no clean stop of %s in the log:\n%s", args[0], log)
		}
	})
	return log, exited
}

var serveListening = regexp.MustCompile(`grpc=(127\.0\.0\.1:\d+) http=(127\.0\.0\.1:\d+)`)

// serve runs the built `sluice serve args...` on free loopback ports until
// the test ends and returns its gRPC and HTTP addresses.
func serve(t *testing.T, args ...string) (grpcAddr, httpAddr string, log *syncBuffer) {
	t.Helper()
	// A budget that a loaded test machine's healthy Redis always meets: the
	// test checks the wiring, not the deadline.
	log, exited := runSluice(t, append([]string{"serve", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--admin-http", "127.0.0.1:0", "--budget", "1s"}, args...),
		"sluice sidecar stopped", 15*time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if m := serveListening.FindStringSubmatch(log.String()); m != nil {
			return m[1], m[2], log
		}
		select {
		case <-exited:
			t.Fatalf("serve exited:\n%s", log)
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("serve did not listen within 10 s:\n%s", log)
	return "", "", nil
}

// redisAddr starts a redis-server on a free loopback port, killed at the
// test's cleanup, and returns its address. Without redis-server on PATH the
// test is skipped, or fails under CI (CI=true). (sluice's
// internal/redistest.Addr, which this module cannot import.)
func redisAddr(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("redis-server not found: .ci/run must install it (deploy/ci/deps.sh)")
		}
		t.Skip("no redis-server on PATH: run `make test`, which installs it")
	}
	const attempts = 3
	var log []byte
	for range attempts {
		dir := t.TempDir()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", filepath.Join(dir, "redis.log"))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if listening(addr, exited) {
			return addr
		}
		log, _ = os.ReadFile(filepath.Join(dir, "redis.log"))
		select {
		case <-exited: // e.g. the port was taken meanwhile: try another
		default:
			t.Fatalf("redis-server did not listen on %s within 2 s; its log:\n%s", addr, log)
		}
	}
	t.Fatalf("redis-server exited before listening, %d times; the last log:\n%s", attempts, log)
	return ""
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

// redisClient starts a redis-server for the test and returns a client on
// it, closed at cleanup, set up as the enforcer wants: no retries of
// timed-out commands, context deadlines applied, one dial per connection.
func redisClient(t *testing.T) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: redisAddr(t), MaxRetries: -1, ContextTimeoutEnabled: true, DialerRetries: 1})
	t.Cleanup(func() { c.Close() })
	return c
}
