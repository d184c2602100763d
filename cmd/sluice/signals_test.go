package main

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/internal/syncbuf"
)

// TestSignals: found by a fresh user. SIGHUP, which operators send to
// reload, ended serve at once (Go's default), without draining; and a
// second SIGTERM could not cut a drain short. SIGHUP is logged and
// ignored; the first SIGTERM drains; a second ends the process at once.
func TestSignals(t *testing.T) {
	cmd := exec.Command(os.Args[0], "serve", "--redis", redistest.Addr(t), "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0",
		"--admin-http", "", "--drain-delay", "30s")
	cmd.Env = append(os.Environ(), "SLUICE_TEST_AS_MAIN=1")
	var out syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	waitLog := func(what string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !strings.Contains(out.String(), what); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q in serve's log within 30 s:\n%s", what, out.String())
			}
		}
	}
	waitLog("sluice sidecar serving")
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitLog("SIGHUP ignored")
	select {
	case err := <-exited:
		t.Fatalf("serve ended on SIGHUP (%v):\n%s", err, out.String())
	case <-time.After(300 * time.Millisecond):
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitLog("sluice sidecar unready") // draining: 30 s unready before the listeners close
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("serve took %v to end after a second SIGTERM", took)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("serve still ran 10 s after a second SIGTERM, in a 30 s drain:\n%s", out.String())
	}
}
