// Package clickhousetest gives tests a real clickhouse-server on a free
// loopback port, with its data and configuration in a temporary directory,
// as package redistest does for redis-server.
//
// Starting one takes a second or more: a package's tests share one server
// (Start, once, by the first test that needs it; Close in TestMain), each
// test in a database of its own (Database). A test that stops the server
// (Kill, Restart) starts its own (New).
//
// When clickhouse-server is not installed, Start and New fail, with the
// fix: nothing is skipped. `make test` installs it (deploy/ci/deps.sh,
// Debian's clickhouse-server package, 18.16 on bookworm).
package clickhousetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	chschema "github.com/sluice-rl/sluice/deploy/clickhouse"
)

// Server is one clickhouse-server process owned by a test or a package's
// TestMain. Its methods are not safe for concurrent use, except Addr.
type Server struct {
	addr   string
	dir    string
	bin    string
	cmd    *exec.Cmd
	exited chan struct{}
}

// ErrNotInstalled is returned when clickhouse-server is not on PATH.
var ErrNotInstalled = errors.New("clickhouse-server not found on PATH or in /usr/sbin: install Debian's clickhouse-server package (`make test` does, through deploy/ci/deps.sh)")

// Start runs a clickhouse-server with its files in a new temporary
// directory, removed by Close, and returns once it answers a ping (within
// 60 s).
func Start() (*Server, error) {
	bin, err := lookPath()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "clickhousetest-")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, bin: bin}
	const attempts = 3
	for range attempts {
		var port int
		if port, err = freePort(); err != nil {
			break
		}
		s.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if err = s.writeConfig(port); err != nil {
			break
		}
		if err = s.run(); err == nil {
			return s, nil
		}
		// The port may have been taken between the choice and the bind:
		// try another.
	}
	os.RemoveAll(dir)
	return nil, err
}

// lookPath finds clickhouse-server on PATH, else in /usr/sbin, where
// Debian installs it (and which a user's PATH often lacks).
func lookPath() (string, error) {
	if bin, err := exec.LookPath("clickhouse-server"); err == nil {
		return bin, nil
	}
	const debian = "/usr/sbin/clickhouse-server"
	if fi, err := os.Stat(debian); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
		return debian, nil
	}
	return "", ErrNotInstalled
}

// New starts a server for t, closed at its cleanup; it fails t when the
// server cannot start.
func New(t testing.TB) *Server {
	t.Helper()
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// Addr is the server's native-protocol address, 127.0.0.1:PORT.
func (s *Server) Addr() string { return s.addr }

var dbSeq atomic.Int64

// Database creates a new, empty database on s for t and returns its name;
// it is dropped at t's cleanup.
func (s *Server) Database(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("t%d_%d", os.Getpid(), dbSeq.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("creating database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = s.exec(ctx, "DROP DATABASE IF EXISTS "+name)
	})
	return name
}

// exec runs one statement in the default database.
func (s *Server) exec(ctx context.Context, q string) error {
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{s.addr}, DialTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Exec(ctx, q)
}

// Kill stops the server at once (SIGKILL) and waits for it to exit: what
// ClickHouse acknowledged is on disk, the rest is lost, as in a crash.
func (s *Server) Kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

// Restart starts the server again on the same port and data, after Kill,
// and returns once it answers a ping.
func (s *Server) Restart() error {
	s.Kill()
	return s.run()
}

// Close kills the server and removes its files. Safe to call twice.
func (s *Server) Close() {
	s.Kill()
	if s.dir != "" {
		os.RemoveAll(s.dir)
		s.dir = ""
	}
}

// run starts the process and waits for it to answer.
func (s *Server) run() error {
	logf, err := os.OpenFile(filepath.Join(s.dir, "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(s.bin, "--config-file="+filepath.Join(s.dir, "config.xml"))
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("starting %s: %w", s.bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(exited) }()
	s.cmd, s.exited = cmd, exited
	if err := s.ready(exited); err != nil {
		s.Kill()
		log, _ := os.ReadFile(filepath.Join(s.dir, "server.err.log"))
		out, _ := os.ReadFile(filepath.Join(s.dir, "stdout.log"))
		return fmt.Errorf("clickhouse-server on %s: %w; its output:\n%s\nits error log (end):\n%s", s.addr, err, out, tail(log, 4000))
	}
	return nil
}

// ready waits up to 60 s for the server to answer a ping.
func (s *Server) ready(exited <-chan struct{}) error {
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{s.addr}, DialTimeout: time.Second})
	if err != nil {
		return err
	}
	defer conn.Close()
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-exited:
			return errors.New("it exited before answering")
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err = conn.Ping(ctx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer within 60 s: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// writeConfig writes config.xml: loopback only, the native port, files in
// s.dir, UTC, user default without a password.
func (s *Server) writeConfig(port int) error {
	d := s.dir
	for _, sub := range []string{"data", "tmp", "user_files", "format_schemas"} {
		if err := os.MkdirAll(filepath.Join(d, sub), 0o755); err != nil {
			return err
		}
	}
	cfg := strings.NewReplacer("{dir}", d, "{port}", strconv.Itoa(port)).Replace(chschema.ServerConfig)
	return os.WriteFile(filepath.Join(d, "config.xml"), []byte(cfg), 0o644)
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
