package main

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// deploy/local/up starts a two-region stack on loopback; checks sent to a
// region's enforcer are decided (the 21st of one API key is denied: its
// global limit's static split), logged to Kafka, consumed by the pipeline
// and written to the stack's ClickHouse, whose report names the denied key;
// a replay runs against the stack's Kafka and Redis; and deploy/local/down
// stops every process it started.
func TestLocalStack(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server is needed (deploy/ci/deps.sh installs it): %v", err)
	}
	dir := t.TempDir()
	var base int
	var env []string
	runErr := func(name string, args ...string) (string, error) {
		cmd := exec.Command(name, args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			return string(out), fmt.Errorf("%s %v: %w\n%s", name, args, err, out)
		}
		return string(out), nil
	}
	run := func(name string, args ...string) string {
		out, err := runErr(name, args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	// Ports below Linux's ephemeral range (32768 on), where other tests'
	// connections take theirs; another base if one is taken meanwhile.
	for try := 0; ; try++ {
		base = 20000 + 400*rand.IntN(30)
		env = append(os.Environ(), "SLUICE_LOCAL_DIR="+dir, "SLUICE_LOCAL_PORT="+strconv.Itoa(base))
		_, err := runErr("../../deploy/local/up", "2")
		if err == nil {
			break
		}
		if try == 2 {
			t.Fatal(err)
		}
		t.Logf("another base port after: %v", err)
	}
	pids := readPids(t, filepath.Join(dir, "pids"))
	stopped := false
	t.Cleanup(func() {
		if t.Failed() { // each process's last lines, before down and the temporary directory go
			logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
			for _, f := range logs {
				if b, err := os.ReadFile(f); err == nil {
					t.Logf("%s, its last 2 KiB:\n%s", filepath.Base(f), b[max(0, len(b)-2048):])
				}
			}
		}
		if !stopped {
			run("../../deploy/local/down")
		}
	})
	if len(pids) != 10 { // kafka, 2 redis, 2 enforcers, pipeline, 2 appliers, clickhouse-server, its sink
		t.Fatalf("%d processes started, want 10: %v", len(pids), pids)
	}

	codes := map[int]int{}
	for range 25 {
		resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/v1/check", base+200), "application/json",
			strings.NewReader(`{"domain":"replay","descriptors":[{"entries":[{"key":"api_key","value":"k1"},{"key":"client_ip","value":"192.0.2.1"}]}]}`))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		codes[resp.StatusCode]++
	}
	// per-api-key: burst 40 globally, 1/2 of it per region without a share.
	if codes[200] != 20 || codes[429] != 5 {
		t.Errorf("answers %v, want 20 allowed and 5 denied", codes)
	}
	deadline := time.Now().Add(30 * time.Second)
	for metric := `sluice_pipeline_records_in_total{stage="decode"} 25`; ; {
		body := get(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", base+1))
		if strings.Contains(body, metric) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pipeline did not decode the 25 decision records within 30 s")
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The decisions reach ClickHouse: the report names the key denied 5 times.
	deadline = time.Now().Add(60 * time.Second)
	for {
		out, err := runErr(filepath.Join(dir, "sluice"), "report", "top_denied_keys", "--clickhouse", "127.0.0.1:"+strconv.Itoa(base+2))
		if err == nil && strings.Contains(out, "k1") && strings.Contains(out, " 5") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no report of the denied key from the stack's ClickHouse within 60 s: %v\n%s", err, out)
		}
		time.Sleep(time.Second)
	}
	for _, port := range []int{base + 1, base + 3, base + 300, base + 301} {
		if body := get(t, fmt.Sprintf("http://127.0.0.1:%d/readyz", port)); strings.TrimSpace(body) != "ok" {
			t.Errorf("port %d /readyz: %q", port, body)
		}
	}

	out := run(filepath.Join(dir, "sluice"), "replay", "--brokers", "127.0.0.1:"+strconv.Itoa(base),
		"--redis", "127.0.0.1:"+strconv.Itoa(base+10), "--redis-db", "1")
	if !strings.Contains(out, " 0 dropped") || !strings.Contains(out, "bad 0, late 0") {
		t.Errorf("the replay against the stack:\n%s", out)
	}

	run("../../deploy/local/down")
	stopped = true
	for pid, name := range pids {
		if err := syscall.Kill(pid, 0); err == nil {
			t.Errorf("%s (pid %d) still runs after down", name, pid)
		}
	}
}

func readPids(t *testing.T, path string) map[int]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pids := map[int]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		pid, name, _ := strings.Cut(sc.Text(), " ")
		n, err := strconv.Atoi(pid)
		if err != nil {
			t.Fatalf("%s: %q", path, sc.Text())
		}
		pids[n] = name
	}
	return pids
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
