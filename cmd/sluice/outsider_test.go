package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestOutsiderCannotReach (issue 35): with the default flags, decisions
// (/v1/check, forward-auth, the gRPC rate limit service) and /v1/usage
// listen on loopback only, and the probes and metrics on every interface.
// An outsider spent a victim's bucket through /v1/check and read 100 keys'
// usage when the HTTP API listened on every interface beside the probes.
//
// As root with iproute2, the test makes a pod of its own: two network
// namespaces joined by a veth pair, the sidecar's (198.51.100.1, TEST-NET-2)
// and an outsider's (198.51.100.2), runs `sluice serve` with no listen
// flag in the sidecar's, and dials from each: from the outsider, /v1/check,
// /v1/usage and gRPC are refused and the probes and metrics answer; inside,
// /v1/check answers. Elsewhere it checks the flags' defaults alone.
func TestOutsiderCannotReach(t *testing.T) {
	fl := serveCmd().Flags()
	for _, c := range []struct {
		flag     string
		loopback bool
	}{{"http", true}, {"grpc", true}, {"admin-http", false}} {
		host, _, err := net.SplitHostPort(fl.Lookup(c.flag).DefValue)
		if err != nil {
			t.Fatalf("--%s default %q: %v", c.flag, fl.Lookup(c.flag).DefValue, err)
		}
		a, err := netip.ParseAddr(host)
		if got := err == nil && a.IsLoopback(); got != c.loopback {
			t.Errorf("--%s defaults to %q: loopback %v, want %v", c.flag, fl.Lookup(c.flag).DefValue, got, c.loopback)
		}
	}
	ip, err := exec.LookPath("ip")
	if err != nil && fileExists("/usr/sbin/ip") {
		ip, err = "/usr/sbin/ip", nil
	}
	if os.Geteuid() != 0 || err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("CI runs as root with iproute2 (deploy/ci/deps.sh): the namespaces should be possible")
		}
		t.Log("not root, or no ip command: checked the listen flags' defaults only")
		return
	}
	pod, outside := fmt.Sprintf("sluice-pod-%d", os.Getpid()), fmt.Sprintf("sluice-out-%d", os.Getpid())
	vp, vo := fmt.Sprintf("sp%d", os.Getpid()%1e9), fmt.Sprintf("so%d", os.Getpid()%1e9)
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(ip, args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run("netns", "add", pod)
	t.Cleanup(func() { _ = exec.Command(ip, "netns", "del", pod).Run() })
	run("netns", "add", outside)
	t.Cleanup(func() { _ = exec.Command(ip, "netns", "del", outside).Run() })
	run("link", "add", vp, "netns", pod, "type", "veth", "peer", "name", vo, "netns", outside)
	run("-n", pod, "addr", "add", "198.51.100.1/24", "dev", vp)
	run("-n", outside, "addr", "add", "198.51.100.2/24", "dev", vo)
	for _, ns := range [][2]string{{pod, vp}, {outside, vo}} {
		run("-n", ns[0], "link", "set", "lo", "up")
		run("-n", ns[0], "link", "set", ns[1], "up")
	}

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var log syncWriter
	var logText strings.Builder
	log.w = &logText
	// No listen flag: the defaults. The in-process Redis and the example
	// rules; no drain delay, so that the test ends at once.
	cmd := exec.Command(ip, "netns", "exec", pod, self, "serve", "--drain-delay=0s")
	cmd.Env = append(environWithout("REDIS_ADDR"), "SLUICE_TEST_AS_MAIN=1")
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })

	check := `{"domain":"sluice","descriptors":[{"entries":[{"key":"remote_address","value":"192.0.2.1"}]}]}`
	var inside int
	deadline := time.Now().Add(30 * time.Second)
	for inside != http.StatusOK && time.Now().Before(deadline) {
		select {
		case <-exited:
			log.mu.Lock()
			t.Fatalf("sluice serve exited:\n%s", logText.String())
		default:
		}
		time.Sleep(50 * time.Millisecond)
		inNetns(t, pod, func() { inside, _ = rawHTTP("127.0.0.1:8080", "POST", "/v1/check", check) })
	}
	if inside != http.StatusOK {
		log.mu.Lock()
		t.Fatalf("inside the pod, /v1/check on 127.0.0.1:8080 did not answer 200 within 30 s:\n%s", logText.String())
	}

	inNetns(t, outside, func() {
		for _, c := range []struct {
			addr, method, path string
			want               int // 0: the connection is refused
		}{
			{"198.51.100.1:8080", "POST", "/v1/check", 0},
			{"198.51.100.1:8080", "GET", "/v1/usage", 0},
			{"198.51.100.1:8080", "GET", "/v1/forward-auth", 0},
			{"198.51.100.1:8081", "", "", 0}, // gRPC
			{"198.51.100.1:8082", "GET", "/readyz", http.StatusOK},
			{"198.51.100.1:8082", "GET", "/healthz", http.StatusOK},
			{"198.51.100.1:8082", "GET", "/metrics", http.StatusOK},
			{"198.51.100.1:8082", "POST", "/v1/check", http.StatusNotFound},
			{"198.51.100.1:8082", "GET", "/v1/usage", http.StatusNotFound},
			{"198.51.100.1:8082", "GET", "/v1/forward-auth", http.StatusNotFound},
		} {
			if c.method == "" {
				conn, err := net.DialTimeout("tcp", c.addr, 2*time.Second)
				if err == nil {
					conn.Close()
					t.Errorf("the outsider connected to %s (gRPC)", c.addr)
				}
				continue
			}
			code, err := rawHTTP(c.addr, c.method, c.path, check)
			switch {
			case c.want == 0 && err == nil:
				t.Errorf("the outsider reached %s %s on %s: %d", c.method, c.path, c.addr, code)
			case c.want != 0 && code != c.want:
				t.Errorf("the outsider's %s %s on %s: %d %v, want %d", c.method, c.path, c.addr, code, err, c.want)
			}
		}
	})
}

// inNetns runs f on an OS thread moved into the network namespace name
// (ip netns's /run/netns/name): sockets f opens itself are in it. The
// thread is never handed back to Go's scheduler, so no other goroutine runs
// in the namespace.
func inNetns(t *testing.T, name string, f func()) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // not unlocked: the thread ends with this goroutine
		ns, err := os.Open("/run/netns/" + name)
		if err != nil {
			errc <- err
			return
		}
		defer ns.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", name, err)
			return
		}
		f()
		errc <- nil
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// rawHTTP sends one request over a connection it dials itself (an
// http.Client dials on goroutines of its own, outside inNetns's thread) and
// returns the status.
func rawHTTP(addr, method, path, body string) (int, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", method, path, addr, len(body), body)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}
