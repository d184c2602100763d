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

// TestSignals: found by fresh users. SIGHUP, which operators send to
// reload, ended serve at once (Go's default), without draining, and its
// notice was the only line not in slog's key=value format; a second SIGTERM
// could not cut a drain short; and a second SIGINT was ignored by a serve
// started with SIGINT ignored (a script's background job: bash starts those
// so). SIGHUP is logged and ignored; the first SIGTERM or SIGINT drains; a
// second ends the process at once.
func TestSignals(t *testing.T) {
	for _, c := range []struct {
		name string
		sig  syscall.Signal
		// ignored starts serve with the signal ignored, as a
		// non-interactive shell starts a background job with SIGINT.
		ignored bool
		code    int
	}{
		{"SIGTERM twice", syscall.SIGTERM, false, 128 + int(syscall.SIGTERM)},
		{"SIGINT twice, started with SIGINT ignored", syscall.SIGINT, true, 128 + int(syscall.SIGINT)},
	} {
		t.Run(c.name, func(t *testing.T) { testSignals(t, c.sig, c.ignored, c.code) })
	}
}

func testSignals(t *testing.T, sig syscall.Signal, ignored bool, code int) {
	args := []string{os.Args[0], "serve", "--redis", redistest.Addr(t), "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0",
		"--admin-http", "", "--drain-delay", "30s"}
	if ignored {
		// sh's trap '' sets the disposition to ignore, which exec keeps.
		args = append([]string{"/bin/sh", "-c", `trap '' INT; exec "$0" "$@"`}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
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
	waitLog(`level=WARN msg="SIGHUP ignored`)
	select {
	case err := <-exited:
		t.Fatalf("serve ended on SIGHUP (%v):\n%s", err, out.String())
	case <-time.After(300 * time.Millisecond):
	}
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	waitLog("sluice sidecar unready") // draining: 30 s unready before the listeners close
	start := time.Now()
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("serve took %v to end after a second %v", took, sig)
		}
		if got := cmd.ProcessState.ExitCode(); got != code {
			t.Errorf("exit code %d after a second %v (%v), want %d", got, sig, err, code)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("serve still ran 10 s after a second %v, in a 30 s drain:\n%s", sig, out.String())
	}
}
