package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// The gateway tests (issue 35) run the real gateways, Debian's nginx and
// Caddy and a Traefik built from its Go module, on loopback with the configs
// that deploy/forward-auth ships (their addresses replaced by the test's),
// in front of a small Go backend, with sluice serve's forward-auth endpoint
// as their auth service, and send real HTTP through each.

// gatewayRules: an exact path rule, and a per-client rule on /api/ that a
// client spoofing X-Forwarded-For must not get past.
const gatewayRules = `domain: gw
rules:
  - {id: login, match: [{key: path, value: /v1/login}], limit: 3, period: 1h}
  - {id: per-client, match: [{key: client_ip}, {key: path, prefix: /api/, shared: true}], limit: 2, period: 1h}
`

// gatewayClient is the clients' address: another loopback address than the
// gateway's 127.0.0.1, the only trusted proxy, so that sluice tells the
// gateway and its clients apart as it would across a network.
var gatewayClient = net.IPv4(127, 0, 0, 2)

// gatewayBin returns the path of a gateway's binary: on PATH or in
// /usr/sbin (Debian's nginx). Missing, the test is skipped, or fails under
// CI, whose deploy/ci/deps.sh installs it.
func gatewayBin(t *testing.T, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if p := "/usr/sbin/" + name; fileExists(p) {
		return p
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s not found: .ci/run must install it (deploy/ci/deps.sh)", name)
	}
	t.Skipf("no %s: run deploy/ci/deps.sh (make test does)", name)
	return ""
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// shipped reads a file of deploy/forward-auth with its addresses replaced:
// old → new pairs.
func shipped(t *testing.T, name string, pairs ...string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "forward-auth", name))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for i := 0; i+1 < len(pairs); i += 2 {
		if !strings.Contains(s, pairs[i]) {
			t.Fatalf("deploy/forward-auth/%s has no %q to replace", name, pairs[i])
		}
		s = strings.ReplaceAll(s, pairs[i], pairs[i+1])
	}
	return s
}

// startProcess runs a gateway until the test ends and waits until addr
// accepts connections; its log (stderr and stdout) is shown if it does not.
func startProcess(t *testing.T, addr string, env []string, name string, args ...string) {
	t.Helper()
	var log strings.Builder
	out := &syncWriter{w: &log}
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			out.mu.Lock()
			defer out.mu.Unlock()
			t.Fatalf("%s exited before it listened:\n%s", filepath.Base(name), log.String())
		default:
		}
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	out.mu.Lock()
	defer out.mu.Unlock()
	t.Fatalf("%s did not listen on %s within 20 s:\n%s", filepath.Base(name), addr, log.String())
}

// syncWriter serializes a process's two output streams into one log.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// startNginx runs Debian's nginx on a free loopback port with site (a
// server block for the http context, its listen directive "listen 80;"),
// in a throwaway prefix, and returns its address.
func startNginx(t *testing.T, site string) string {
	t.Helper()
	bin := gatewayBin(t, "nginx")
	dir := t.TempDir()
	port := freePort(t)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	if !strings.Contains(site, "listen 80;") {
		t.Fatal("the site has no `listen 80;` to replace")
	}
	site = strings.ReplaceAll(site, "listen 80;", "listen "+addr+";")
	if err := os.WriteFile(filepath.Join(dir, "site.conf"), []byte(site), 0o644); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf(`daemon off;
master_process off;
worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 256; }
http {
    access_log off;
    client_body_temp_path %[1]s/body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    include %[1]s/site.conf;
}
`, dir)
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"-p", dir, "-c", path, "-e", filepath.Join(dir, "error.log")}
	if out, err := exec.Command(bin, append(args, "-t")...).CombinedOutput(); err != nil {
		t.Fatalf("nginx -t: %v\n%s", err, out)
	}
	startProcess(t, addr, nil, bin, args...)
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Logf("nginx's error log:\n%s", b)
		}
	})
	return addr
}

// startCaddy runs Debian's Caddy with the shipped Caddyfile on a free
// loopback port, and returns its address.
func startCaddy(t *testing.T, sluiceAddr, backendAddr string) string {
	t.Helper()
	bin := gatewayBin(t, "caddy")
	dir := t.TempDir()
	port := strconv.Itoa(freePort(t))
	site := shipped(t, "Caddyfile", ":80 {", ":"+port+" {\n\tbind 127.0.0.1", "127.0.0.1:8080", sluiceAddr, "127.0.0.1:9000", backendAddr)
	conf := fmt.Sprintf("{\n\tadmin off\n\tauto_https off\n\tstorage file_system %s\n}\n%s", filepath.Join(dir, "data"), site)
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"HOME=" + dir, "XDG_DATA_HOME=" + dir, "XDG_CONFIG_HOME=" + dir}
	startProcess(t, "127.0.0.1:"+port, env, bin, "run", "--config", path, "--adapter", "caddyfile")
	return "127.0.0.1:" + port
}

// startTraefik runs Traefik with the shipped static and dynamic
// configurations on a free loopback port, and returns its address once its
// router is loaded.
func startTraefik(t *testing.T, sluiceAddr, backendAddr string) string {
	t.Helper()
	bin := gatewayBin(t, "traefik")
	dir := t.TempDir()
	addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	dynamic := filepath.Join(dir, "dynamic.yml")
	static := shipped(t, "traefik.yml", `":80"`, `"`+addr+`"`, "/etc/traefik/dynamic.yml", dynamic) + "log:\n  level: ERROR\n"
	dyn := shipped(t, "traefik-dynamic.yml", "127.0.0.1:8080", sluiceAddr, "127.0.0.1:9000", backendAddr)
	for name, s := range map[string]string{"traefik.yml": static, "dynamic.yml": dyn} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	startProcess(t, addr, []string{"HOME=" + dir}, bin, "--configFile="+filepath.Join(dir, "traefik.yml"))
	// The file provider loads the router a moment after the listener opens.
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if r, _ := gatewayGet(t, addr, "/healthz-probe"); r.StatusCode != http.StatusNotFound {
			return addr
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("Traefik did not load its router within 20 s")
	return ""
}

// gatewayGet sends GET target to addr from gatewayClient, as raw HTTP (the
// target as it is, no client-side cleaning), with the header lines given
// as name, value pairs.
func gatewayGet(t *testing.T, addr, target string, headers ...string) (*http.Response, string) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: gatewayClient}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	var req strings.Builder
	fmt.Fprintf(&req, "GET %s HTTP/1.1\r\nHost: gw.test\r\nConnection: close\r\n", target)
	for i := 0; i+1 < len(headers); i += 2 {
		fmt.Fprintf(&req, "%s: %s\r\n", headers[i], headers[i+1])
	}
	req.WriteString("\r\n")
	if _, err := io.WriteString(c, req.String()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("GET %s: %v", target, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// gatewayCase is one gateway of TestGateways*: how to start it in front of
// sluice and the backend, and what it answers while sluice is down.
type gatewayCase struct {
	start      func(t *testing.T, sluiceAddr, backendAddr string) string
	downStatus int
}

// TestGatewaysNginx: Debian's nginx with the shipped auth_request recipe
// (deny_status=401, auth_request_set and error_page turning the denial into
// 429 with the headers). With sluice down, auth_request's subrequest fails
// and nginx answers 500: it fails closed.
func TestGatewaysNginx(t *testing.T) {
	gatewayScenario(t, gatewayCase{
		start: func(t *testing.T, sluiceAddr, backendAddr string) string {
			return startNginx(t, shipped(t, "nginx.conf", "127.0.0.1:8080", sluiceAddr, "127.0.0.1:9000", backendAddr))
		},
		downStatus: http.StatusInternalServerError,
	})
}

// TestGatewaysCaddy: Debian's Caddy with the shipped forward_auth. With
// sluice down, forward_auth's reverse proxy answers 502: it fails closed.
func TestGatewaysCaddy(t *testing.T) {
	gatewayScenario(t, gatewayCase{start: startCaddy, downStatus: http.StatusBadGateway})
}

// TestGatewaysTraefik: Traefik v3.6.12 (built from its Go module by
// deploy/ci/deps.sh; Debian has no package) with the shipped ForwardAuth
// middleware. With sluice down, ForwardAuth answers 500: it fails closed.
func TestGatewaysTraefik(t *testing.T) {
	gatewayScenario(t, gatewayCase{start: startTraefik, downStatus: http.StatusInternalServerError})
}

// gatewayScenario sends real HTTP through a gateway in front of a backend,
// with sluice serve as its forward-auth service: allowed requests reach the
// backend; the limit+1th, whatever its spelling, gets 429 with Retry-After
// and the RateLimit headers at the client and never reaches the backend; a
// client's forged X-Forwarded-For moves it to no other bucket; an API key
// given twice is answered 400; with sluice down, the gateway answers as its
// case says, and nothing reaches the backend.
func gatewayScenario(t *testing.T, g gatewayCase) {
	var hits atomic.Int64
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprintf(w, "backend %s", r.URL.Path)
	}))
	t.Cleanup(backend.Close)
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rulesFile, []byte(gatewayRules), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := serveConfig{Redis: []string{redistest.Addr(t)}, RulesFile: rulesFile}
	// A budget that a loaded machine's healthy Redis always meets: past
	// it, the failure modes' local buckets would decide, and the test
	// checks the gateways, not the deadline.
	c.Limiter.Budget = time.Second
	c.Server.ForwardAuth.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	a, done := mustServe(t, ctx, c)
	gw := g.start(t, a[1].String(), backend.Listener.Addr().String())
	hits.Store(0) // a gateway's start-up probe may have reached it

	// Three spellings of /v1/login pass, and reach the backend.
	for i, p := range []string{"/v1/login?x=1", "//v1/./login", "/v1/%6Cogin?"} {
		r, body := gatewayGet(t, gw, p)
		if r.StatusCode != http.StatusOK || !strings.HasPrefix(body, "backend ") {
			t.Fatalf("request %d, %s: %d %q, want the backend's 200", i+1, p, r.StatusCode, body)
		}
	}
	if n := hits.Load(); n != 3 {
		t.Fatalf("the backend saw %d requests, want 3", n)
	}
	// The fourth, spelt another way again, is denied at the gateway.
	r, body := gatewayGet(t, gw, "/v1/login/")
	if r.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("the 4th request: %d %q, want 429", r.StatusCode, body)
	}
	if ra, err := strconv.Atoi(r.Header.Get("Retry-After")); err != nil || ra < 1 {
		t.Errorf("Retry-After %q, want whole seconds", r.Header.Get("Retry-After"))
	}
	for h, want := range map[string]string{"RateLimit": `"login";r=0;t=`, "RateLimit-Policy": `"login";q=3;w=3600`, "X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "0"} {
		if got := r.Header.Get(h); !strings.HasPrefix(got, want) {
			t.Errorf("%s: %q, want %q...", h, got, want)
		}
	}
	if n := hits.Load(); n != 3 {
		t.Errorf("the backend saw %d requests, want 3: the denied one reached it", n)
	}

	// A client that forges X-Forwarded-For stays itself: 2 of /api/ pass.
	for i := range 4 {
		r, _ := gatewayGet(t, gw, "/api/items", "X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i), "X-Real-IP", fmt.Sprintf("203.0.113.%d", i))
		if want := map[bool]int{true: 200, false: 429}[i < 2]; r.StatusCode != want {
			t.Errorf("/api/items with a forged address, request %d: %d, want %d", i+1, r.StatusCode, want)
		}
	}

	// An API key given twice.
	before := hits.Load()
	if r, body := gatewayGet(t, gw, "/other", "X-Api-Key", "k1", "X-Api-Key", "k2"); r.StatusCode != http.StatusBadRequest {
		t.Errorf("two API keys: %d %q, want 400", r.StatusCode, body)
	}
	if hits.Load() != before {
		t.Error("a request with two API keys reached the backend")
	}

	// sluice down.
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("sluice serve did not stop")
	}
	before = hits.Load()
	if r, body := gatewayGet(t, gw, "/other"); r.StatusCode != g.downStatus {
		t.Errorf("sluice down: %d %q, want %d", r.StatusCode, body, g.downStatus)
	}
	if hits.Load() != before {
		t.Error("with sluice down, a request reached the backend")
	}
}

// TestNginxRoutesRespellingsAlike is issue 35's property against a real
// origin: every respelling of a path that nginx routes to the same location,
// with the same captured segment, normalizes (rules.NormalizePath) to the
// same path, so it matches the same rules with the same key. (The rules
// package checks the same against Go's ServeMux.)
func TestNginxRoutesRespellingsAlike(t *testing.T) {
	addr := startNginx(t, `server {
    listen 80;
    location = /v1/login { return 200 "login"; }
    location ~ ^/v1/users/([^/]+)/orders$ { return 200 "orders $1"; }
    location / { return 404; }
}
`)
	bases := map[string]string{"/v1/login": "login", "/v1/users/42/orders": "orders 42", "/v1/users/a.b/orders": "orders a.b"}
	checked := 0
	for base, want := range bases {
		for i, s := range respellings(base) {
			r, body := gatewayGet(t, addr, s)
			if r.StatusCode != http.StatusOK || body != want {
				continue // nginx routes it elsewhere, or refuses it
			}
			checked++
			if got := normalizedPath(s); got != normalizedPath(base) {
				t.Errorf("respelling %d of %s, %q: nginx routes it as %q, but it normalizes to %q, not %q", i, base, s, want, got, normalizedPath(base))
			}
		}
	}
	if checked < 60 {
		t.Errorf("only %d respellings routed alike", checked)
	}
	t.Logf("%d respellings that nginx routed to their path's location, all normalized alike", checked)
}

func normalizedPath(s string) string { return rules.NormalizePath(s) }

// respellings returns spellings of the canonical path p that an origin may
// route as p: every byte of a segment escaped in either hex case, dot
// segments, detours through "..", doubled slashes, escaped slashes, a
// trailing slash, queries, and some of them together; and some it must not
// (escapes of '?' and '/' inside a segment, other case), which the property
// skips when nginx routes them elsewhere.
func respellings(p string) []string {
	segs := strings.Split(p[1:], "/")
	escape := func(seg string, upper bool) string {
		var b strings.Builder
		for i := 0; i < len(seg); i++ {
			h := fmt.Sprintf("%%%02x", seg[i])
			if upper {
				h = strings.ToUpper(h)
			}
			b.WriteString(h)
		}
		return b.String()
	}
	join := func(ss []string) string { return "/" + strings.Join(ss, "/") }
	var out []string
	for i := range segs {
		for _, upper := range []bool{false, true} {
			c := append([]string(nil), segs...)
			c[i] = escape(segs[i], upper)
			out = append(out, join(c))
		}
		c := append([]string(nil), segs...)
		c[i] = "x/../" + segs[i]
		out = append(out, join(c))
		c[i] = "./" + segs[i]
		out = append(out, join(c))
		c[i] = "/" + segs[i]
		out = append(out, join(c))
		c[i] = "%2e/" + segs[i]
		out = append(out, join(c))
		c[i] = "x%2F..%2F" + segs[i]
		out = append(out, join(c))
		c[i] = "x%2f%2E%2E/" + segs[i]
		out = append(out, join(c))
		c[i] = strings.ToUpper(segs[i])
		out = append(out, join(c))
		c[i] = segs[i] + "%3F"
		out = append(out, join(c))
	}
	for _, suffix := range []string{"?", "?x=1", "?a=%2F&b", "/", "/?x", "/.", "#frag"} {
		out = append(out, p+suffix)
	}
	for _, prefix := range []string{"//", "/./", "/../", "/x/../"} {
		out = append(out, prefix+p[1:])
	}
	all := escape(p[1:], true)
	out = append(out, "/"+strings.ReplaceAll(all, "%2F", "/"), "/"+all, "//"+strings.ReplaceAll(p[1:], "/", "//")+"?q")
	return out
}

// TestForwardAuthDocsShowTheShippedFiles: docs/forward-auth.md shows each
// file of deploy/forward-auth whole, as the gateway tests run it.
func TestForwardAuthDocsShowTheShippedFiles(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "forward-auth.md"))
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join("..", "..", "deploy", "forward-auth", "*"))
	if err != nil || len(files) != 4 {
		t.Fatalf("deploy/forward-auth: %v %v, want the 4 files", files, err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(doc), "\n"+string(b)+"```\n") {
			t.Errorf("docs/forward-auth.md does not show %s as it is: copy it into its block", filepath.Base(f))
		}
	}
}
