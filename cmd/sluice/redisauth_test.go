package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/syncbuf"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/internal/redistest"
)

// Issue 32: credentials, ACL users and TLS everywhere sluice talks to
// Redis, and a readiness that tells the truth about the decision path. Every
// test here runs `sluice serve` (the command, flags and environment
// variables as an operator gives them) against real redis-servers that
// redistest starts with requirepass, ACL users, TLS, a Sentinel and a
// Cluster, and hands everything the processes said (logs, errors,
// /readyz, /metrics, --help) to a secretScan, which fails the test if any
// password is in it.

// authRules: one fail-closed rule, so that a working Redis answers 200 200
// 200 429 for one user and a refusing one 503 (--fail-closed-status 503)
// every time.
const authRules = `domain: t
rules:
  - id: per-user
    match: [{key: user}]
    algorithm: fixed_window
    limit: 3
    period: 1h
    failure_mode: closed
`

// secretScan holds the passwords of a test and everything its processes
// said; check (at the test's end) fails it if one holds a password.
type secretScan struct {
	t       *testing.T
	secrets []string
	texts   map[string]string
}

// newSecretScan returns a scan checked at the test's cleanup, after every
// cleanup registered later (the sidecars' stops, whose logs it reads).
func newSecretScan(t *testing.T, secrets ...string) *secretScan {
	t.Helper()
	s := &secretScan{t: t, secrets: secrets, texts: map[string]string{}}
	t.Cleanup(s.check)
	return s
}

// add records what a process said; a *syncbuf.Buffer is read at check time.
func (s *secretScan) add(what string, text any) {
	s.t.Helper()
	n := fmt.Sprintf("%s #%d", what, len(s.texts))
	switch v := text.(type) {
	case string:
		s.texts[n] = v
	case *syncbuf.Buffer:
		s.texts[n] = "" // read at check
		s.t.Cleanup(func() { s.texts[n] = v.String() })
	}
}

func (s *secretScan) check() {
	s.t.Helper()
	if len(s.texts) == 0 {
		s.t.Error("secretScan: nothing was scanned")
	}
	for _, secret := range s.secrets {
		if len(secret) < 8 {
			s.t.Fatalf("secretScan: %q is too short to grep for", secret)
		}
		for what, text := range s.texts {
			if strings.Contains(text, secret) {
				s.t.Errorf("%s holds a password:\n%s", what, text)
			}
		}
	}
}

// authServe runs `sluice serve` with the test's rules, a 100 ms refresh
// (the probe's period) and no drain delay, plus args, until the test ends.
// It returns the HTTP address, or the error serve exited with before
// listening (then "").
func authServe(t *testing.T, scan *secretScan, args ...string) (string, *syncbuf.Buffer, error) {
	t.Helper()
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rulesFile, []byte(authRules), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	log := new(syncbuf.Buffer)
	root := newRoot()
	root.SetArgs(append([]string{"serve", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--admin-http", "127.0.0.1:0", "--budget", "1s",
		"--rules", rulesFile, "--refresh", "100ms", "--drain-delay", "0s", "--fail-closed-status", "503"}, args...))
	root.SetErr(log)
	root.SetOut(log)
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	scan.add("serve's log", log)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if m := listening.FindStringSubmatch(log.String()); m != nil {
			t.Cleanup(func() {
				// Whatever the test read, the scan reads both at the end.
				for _, path := range []string{"/readyz", "/metrics"} {
					getText(t, scan, m[2], path)
				}
				cancel()
				select {
				case err := <-done:
					if err != nil {
						t.Errorf("serve: %v", err)
					}
				case <-time.After(15 * time.Second):
					t.Error("serve did not stop within 15 s of its context's end")
				}
			})
			return m[2], log, nil
		}
		select {
		case err := <-done:
			cancel()
			if err == nil {
				t.Fatalf("serve exited 0 before listening:\n%s", log)
			}
			scan.add("serve's error", err.Error())
			return "", log, err
		case <-time.After(10 * time.Millisecond):
		}
	}
	cancel()
	t.Fatalf("serve neither listened nor failed within 20 s:\n%s", log)
	return "", nil, nil
}

// mustAuthServe is authServe that fails the test if serve exits.
func mustAuthServe(t *testing.T, scan *secretScan, args ...string) (string, *syncbuf.Buffer) {
	t.Helper()
	addr, log, err := authServe(t, scan, args...)
	if err != nil {
		t.Fatalf("serve %v: %v\n%s", args, err, log)
	}
	return addr, log
}

// mustRefuse runs serve and wants it to exit with an error holding every
// one of want.
func mustRefuse(t *testing.T, scan *secretScan, want []string, args ...string) {
	t.Helper()
	_, log, err := authServe(t, scan, args...)
	if err == nil {
		t.Fatalf("serve %v started; want an error with %q", args, want)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("serve %v: %v\nwant %q in it; log:\n%s", args, err, w, log)
		}
	}
}

// checkStatuses sends n checks for user to serve's /v1/check and returns
// their statuses.
func checkStatuses(t *testing.T, scan *secretScan, addr, user string, n int) []int {
	t.Helper()
	var out []int
	for range n {
		r, err := http.Post("http://"+addr+"/v1/check", "application/json",
			strings.NewReader(`{"domain":"t","descriptors":[{"entries":[{"key":"user","value":"`+user+`"}]}]}`))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		scan.add("/v1/check", string(b))
		out = append(out, r.StatusCode)
	}
	return out
}

// wantDecisions wants Redis to decide: three allowed, the fourth denied.
func wantDecisions(t *testing.T, scan *secretScan, addr, user string) {
	t.Helper()
	if got := fmt.Sprint(checkStatuses(t, scan, addr, user, 4)); got != "[200 200 200 429]" {
		t.Errorf("checks of %s: %s, want [200 200 200 429] (Redis deciding); metrics:\n%s", user, got, grepMetrics(t, scan, addr, "sluice_enforcer_redis_errors_total"))
	}
}

// getText GETs a path of serve's HTTP API, for the scan too.
func getText(t *testing.T, scan *secretScan, addr, path string) (int, string) {
	t.Helper()
	r, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	scan.add(path, string(b))
	return r.StatusCode, string(b)
}

// grepMetrics returns the /metrics lines that start with prefix.
func grepMetrics(t *testing.T, scan *secretScan, addr, prefix string) string {
	t.Helper()
	_, body := getText(t, scan, addr, "/metrics")
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// waitReadyz polls /readyz until its body matches re (within 10 s) and
// returns its status and body.
func waitReadyz(t *testing.T, scan *secretScan, addr string, re *regexp.Regexp) (int, string) {
	t.Helper()
	var code int
	var body string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if code, body = getText(t, scan, addr, "/readyz"); re.MatchString(body) {
			return code, body
		}
	}
	t.Fatalf("/readyz did not match %s within 10 s: %d\n%s", re, code, body)
	return 0, ""
}

// wantReady wants /readyz 200 with Redis ok and its memory policy read.
func wantReady(t *testing.T, scan *secretScan, addr string) {
	t.Helper()
	code, body := waitReadyz(t, scan, addr, regexp.MustCompile(`redis: ok\nredis maxmemory-policy: noeviction\n`))
	if code != http.StatusOK {
		t.Errorf("/readyz: %d\n%s", code, body)
	}
}

// passwordFile writes password to a file of the test's.
func passwordFile(t *testing.T, password string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "redis-password")
	if err := os.WriteFile(p, []byte(password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// clearRedisEnv unsets every Redis variable for the test: only what it

// TestServeHomes: another region's Redis (--home) that refuses sluice (a
// wrong password, a database it lacks) stops the start, as the region's own
// does, unless --redis-start-degraded, and never with the password in the
// error; one that does not answer is shown on /readyz, which stays ready.
func TestServeHomes(t *testing.T) {
	clearRedisEnv(t)
	pw, wrong := redistest.Password(t), redistest.Password(t)
	home := redistest.RequirePass(t, pw)
	own := redistest.Addr(t)
	scan := newSecretScan(t, pw, wrong)
	mustRefuse(t, scan, []string{"--home eu", "(wrongpass)", "--redis-start-degraded"},
		"--redis", own, "--region", "us", "--home", "eu=redis://:"+wrong+"@"+home)
	mustRefuse(t, scan, []string{"--home eu", "no such database"},
		"--redis", own, "--region", "us", "--home", "eu=redis://:"+pw+"@"+home+"/99")

	h, _ := mustAuthServe(t, scan, "--redis", own, "--region", "us", "--home", "eu=redis://:"+pw+"@"+home)
	if code, body := waitReadyz(t, scan, h, regexp.MustCompile(`home redis eu: ok`)); code != http.StatusOK {
		t.Errorf("/readyz with a working home: %d\n%s", code, body)
	}
	h, _ = mustAuthServe(t, scan, "--redis", own, "--region", "us", "--home", "eu=redis://:"+wrong+"@"+home, "--redis-start-degraded")
	if code, body := waitReadyz(t, scan, h, regexp.MustCompile(`home redis eu: the decision script fails \(cause wrongpass\)`)); code != http.StatusOK {
		t.Errorf("/readyz with a home refusing sluice: %d, want 200 (another region's Redis never makes this one unready)\n%s", code, body)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	h, _ = mustAuthServe(t, scan, "--redis", own, "--region", "us", "--home", "eu="+dead)
	if code, body := waitReadyz(t, scan, h, regexp.MustCompile(`home redis eu: the decision script fails \(cause unreachable\)`)); code != http.StatusOK {
		t.Errorf("/readyz with a home that does not answer: %d, want 200\n%s", code, body)
	}
}

// sets counts.
func clearRedisEnv(t *testing.T) {
	t.Helper()
	var f redisFlags
	f.add(newRoot().Flags(), "", anyTopology)
	for _, n := range f.names {
		unsetenv(t, envName(n))
	}
}

func TestServeRequirePass(t *testing.T) {
	clearRedisEnv(t)
	pw := redistest.Password(t)
	addr := redistest.RequirePass(t, pw)
	scan := newSecretScan(t, pw)

	t.Run("no password", func(t *testing.T) {
		mustRefuse(t, scan, []string{"(noauth)", "--redis-password-file", "--redis-start-degraded"}, "--redis", addr)
	})
	t.Run("wrong password", func(t *testing.T) {
		t.Setenv("REDIS_PASSWORD", redistest.Password(t))
		mustRefuse(t, scan, []string{"(wrongpass)", "--redis-username", "--redis-password-file"}, "--redis", addr)
	})
	t.Run("REDIS_PASSWORD", func(t *testing.T) {
		t.Setenv("REDIS_PASSWORD", pw)
		h, log := mustAuthServe(t, scan, "--redis", addr)
		wantDecisions(t, scan, h, "env")
		wantReady(t, scan, h)
		if !strings.Contains(log.String(), "(password)") {
			t.Errorf("the start line does not say a password is used:\n%s", log)
		}
	})
	t.Run("URL in REDIS_ADDR", func(t *testing.T) {
		t.Setenv("REDIS_ADDR", "redis://:"+pw+"@"+addr+"/0")
		h, _ := mustAuthServe(t, scan)
		wantDecisions(t, scan, h, "url")
		wantReady(t, scan, h)
	})
	t.Run("password file", func(t *testing.T) {
		h, _ := mustAuthServe(t, scan, "--redis", addr, "--redis-password-file", passwordFile(t, pw))
		wantDecisions(t, scan, h, "file")
	})
	t.Run("bad URLs", func(t *testing.T) {
		for _, u := range []string{
			"redis://user:" + pw + "@" + addr + "/notadb",
			"redis://user:" + pw + "@127.0.0.1:notaport",
			"redis://user:" + pw + "/oops@127.0.0.1:6379",
			"redis://user:" + pw + "@" + addr + "?dial_timeout=" + pw,
			"http://user:" + pw + "@" + addr,
			"redis://user:" + pw + "@127.0.0.1",
			"redis://" + pw + ":x@" + addr,
			// Found by a fresh user: no scheme or a misspelt one, and a
			// parser's error quoting addr=.
			"user:" + pw + "@" + addr,
			"redis:/user:" + pw + "@" + addr,
			"redis://user:" + pw + "@" + addr + "?addr=u:" + pw + "@b:1",
			// Found by a fresh user: a third slash, no host.
			"redis:///:" + pw + "@" + addr,
			"redis://user:" + pw + "@" + addr + "/-1",
			"rediss:///user:" + pw + "@" + addr,
		} {
			_, _, err := authServe(t, scan, "--redis", u)
			if err == nil {
				t.Errorf("--redis %s: started", redactURL(u))
				continue
			}
			if !strings.Contains(err.Error(), "--redis") {
				t.Errorf("--redis %s: %v, want the flag named", redactURL(u), err)
			}
		}
		// The other commands that take a Redis URL.
		for _, bad := range []string{"redis://user:" + pw + "@127.0.0.1:notaport", "redis:///:" + pw + "@127.0.0.1:6379"} {
			for _, args := range [][]string{
				{"serve", "--home", "eu=" + bad},
				{"apply", "--brokers", "127.0.0.1:1", "--region", "eu", "--redis", bad},
				{"pipeline", "--brokers", "127.0.0.1:1", "--output", "redis", "--region", "eu=" + bad},
				{"rules", "list", "--redis", bad},
				{"replay", "--redis", bad},
				{"crowdsec", "--lapi", "http://127.0.0.1:1", "--api-key-file", passwordFile(t, "bouncer-key"), "--region", "eu=" + bad},
			} {
				if _, err := sluiceCmd(t, scan, args...); err == nil || !strings.Contains(err.Error(), "xxxxx") {
					t.Errorf("%v: %v, want an error showing the URL without its password", args[:2], err)
				}
			}
		}
		t.Setenv("REDIS_ADDR", "redis://user:"+pw+"@127.0.0.1:notaport")
		if _, _, err := authServe(t, scan); err == nil || !strings.Contains(err.Error(), "REDIS_ADDR") {
			t.Errorf("a bad REDIS_ADDR: %v, want it named", err)
		}
	})
	t.Run("flags twice", func(t *testing.T) {
		t.Setenv("REDIS_PASSWORD", pw)
		mustRefuse(t, scan, []string{"give them once"}, "--redis", "redis://:"+pw+"@"+addr)
		mustRefuse(t, scan, []string{"give one"}, "--redis", addr, "--redis-password-file", passwordFile(t, pw))
	})
	t.Run("start degraded", func(t *testing.T) {
		h, _ := mustAuthServe(t, scan, "--redis", addr, "--redis-start-degraded", "--ready-needs-redis")
		code, body := waitReadyz(t, scan, h, regexp.MustCompile(`cause noauth`))
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "--redis-password-file") {
			t.Errorf("/readyz without the password: %d, want 503 naming --redis-password-file\n%s", code, body)
		}
		if got := fmt.Sprint(checkStatuses(t, scan, h, "u", 2)); got != "[503 503]" {
			t.Errorf("checks without the password: %s, want the fail-closed rule's 503s", got)
		}
		m := grepMetrics(t, scan, h, "sluice_enforcer_redis_")
		for _, want := range []string{`sluice_enforcer_redis_down_cause{cause="noauth"} 1`, `sluice_enforcer_redis_up 0`} {
			if !strings.Contains(m, want) {
				t.Errorf("metrics lack %s:\n%s", want, m)
			}
		}
		if !regexp.MustCompile(`sluice_enforcer_redis_errors_total\{cause="noauth"\} [1-9]`).MatchString(m) {
			t.Errorf("no noauth error counted:\n%s", m)
		}
	})
	t.Run("help", func(t *testing.T) {
		for _, env := range []string{"REDIS_PASSWORD", "REDIS_SENTINEL_PASSWORD", "REDIS_ADDR"} {
			t.Setenv(env, "redis://u:"+pw+"@"+addr)
		}
		for _, sub := range [][]string{{"serve"}, {"rules", "push"}, {"apply"}, {"pipeline"}, {"replay"}, {"eval"}, {"crowdsec"}} {
			var out strings.Builder
			root := newRoot()
			root.SetArgs(append(sub, "--help"))
			root.SetOut(&out)
			root.SetErr(&out)
			if err := root.Execute(); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out.String(), "--redis-password-file") {
				t.Errorf("%v --help lacks --redis-password-file", sub)
			}
			scan.add(strings.Join(sub, " ")+" --help", out.String())
		}
	})
}

// docsACL returns the ACL lines of docs/operations.md, "Production Redis",
// by user, each as ACL SETUSER's arguments with PASSWORD replaced.
func docsACL(t *testing.T, passwords map[string]string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, f := range fences(t, "../../docs/operations.md") {
		if f.info != "text" || !strings.HasPrefix(f.text, "user sluice ") {
			continue
		}
		for _, line := range strings.Split(strings.TrimSpace(f.text), "\n") {
			fields := strings.Fields(strings.TrimPrefix(line, "user "))
			pw, ok := passwords[fields[0]]
			if !ok {
				t.Fatalf("docs/operations.md: an ACL line of user %s, which the test has no password for", fields[0])
			}
			out[fields[0]] = strings.ReplaceAll(strings.Join(fields, " "), ">PASSWORD", ">"+pw)
		}
	}
	if len(out) != len(passwords) {
		t.Fatalf("docs/operations.md: ACL lines of %d users, want %d (%v)", len(out), len(passwords), passwords)
	}
	return out
}

// sluiceCmd runs a sluice command line and returns its output and error.
func sluiceCmd(t *testing.T, scan *secretScan, args ...string) (string, error) {
	t.Helper()
	var out strings.Builder
	root := newRoot()
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&out)
	err := root.ExecuteContext(context.Background())
	scan.add(strings.Join(args[:min(2, len(args))], " "), out.String())
	if err != nil {
		scan.add(args[0]+"'s error", err.Error())
	}
	return out.String(), err
}

// TestServeACL: the ACL lines that docs/operations.md gives are exactly
// enough. As sluice-ops, rules push and rules keys work; as sluice, serve
// with --rules-redis and --key-store starts, decides, answers /v1/usage and
// is ready, and Redis's ACL LOG records no refusal. A user without EVALSHA
// stops serve at start naming the command, and started degraded it is
// unready with cause noperm, opens the breaker, and decides by the failure
// modes.
func TestServeACL(t *testing.T) {
	clearRedisEnv(t)
	pw := map[string]string{"sluice": redistest.Password(t), "sluice-ops": redistest.Password(t)}
	lines := docsACL(t, pw)
	noEval := redistest.Password(t)
	lines["sluice-noevalsha"] = strings.Replace(strings.Replace(lines["sluice"], " +evalsha ", " ", 1), ">"+pw["sluice"], ">"+noEval, 1)
	lines["sluice-noevalsha"] = strings.Replace(lines["sluice-noevalsha"], "sluice ", "sluice-noevalsha ", 1)
	if lines["sluice-noevalsha"] == lines["sluice"] || strings.Contains(lines["sluice-noevalsha"], "+evalsha ") {
		t.Fatalf("could not take +evalsha out of %q", lines["sluice"])
	}
	noMget := redistest.Password(t)
	lines["sluice-nomget"] = strings.Replace(strings.Replace(lines["sluice"], " +mget ", " ", 1), ">"+pw["sluice"], ">"+noMget, 1)
	lines["sluice-nomget"] = strings.Replace(lines["sluice-nomget"], "sluice ", "sluice-nomget ", 1)
	if strings.Contains(lines["sluice-nomget"], "+mget ") {
		t.Fatalf("could not take +mget out of %q", lines["sluice"])
	}
	// Found by a fresh user: without ZADD (or PEXPIRE) the enforcer-count
	// heartbeat failed silently.
	noZadd := redistest.Password(t)
	lines["sluice-nozadd"] = strings.Replace(strings.Replace(lines["sluice"], " +zadd ", " ", 1), ">"+pw["sluice"], ">"+noZadd, 1)
	lines["sluice-nozadd"] = strings.Replace(lines["sluice-nozadd"], "sluice ", "sluice-nozadd ", 1)
	if strings.Contains(lines["sluice-nozadd"], "+zadd ") {
		t.Fatalf("could not take +zadd out of %q", lines["sluice"])
	}
	// Found by a fresh user: without the read-only scripts and SUBSCRIBE
	// serve started silently, and /v1/usage blamed Redis for the decisions.
	noRO := redistest.Password(t)
	lines["sluice-noro"] = strings.Replace(lines["sluice"], ">"+pw["sluice"], ">"+noRO, 1)
	for _, c := range []string{" +evalsha_ro ", " +eval_ro ", " +subscribe "} {
		lines["sluice-noro"] = strings.Replace(lines["sluice-noro"], c, " ", 1)
	}
	lines["sluice-noro"] = strings.Replace(lines["sluice-noro"], "sluice ", "sluice-noro ", 1)
	if strings.Contains(lines["sluice-noro"], "_ro ") || strings.Contains(lines["sluice-noro"], "+subscribe") {
		t.Fatalf("could not take the read-only scripts and subscribe out of %q", lines["sluice"])
	}
	var acl []string
	for _, l := range lines {
		acl = append(acl, l)
	}
	s := redistest.WithACL(t, acl)
	scan := newSecretScan(t, pw["sluice"], pw["sluice-ops"], noEval, noMget, noZadd, noRO, s.AdminPassword)
	admin := s.Admin(t)
	// authRules and a rule of every other algorithm, so that every script
	// path runs as the documented user.
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rulesFile, []byte(authRules+`  - id: per-key
    match: [{key: api_key}]
    algorithm: sliding_window
    limit: 100
    period: 1m
  - id: per-ip
    match: [{key: client_ip}]
    limit: 10
    period: 1s
  - id: per-tenant
    match: [{key: tenant}]
    algorithm: concurrency
    limit: 5
`), 0o600); err != nil {
		t.Fatal(err)
	}

	t.Run("sluice-ops", func(t *testing.T) {
		t.Setenv("REDIS_USERNAME", "sluice-ops")
		t.Setenv("REDIS_PASSWORD", pw["sluice-ops"])
		for _, args := range [][]string{
			{"rules", "push", "--redis", s.Addr, rulesFile},
			{"rules", "keys", "account", "--redis", s.Addr, "acme", "--org", "acme", "--tier", "pro"},
			{"rules", "keys", "key", "--redis", s.Addr, "k-1", "acme"},
			{"rules", "list", "--redis", s.Addr},
		} {
			if out, err := sluiceCmd(t, scan, args...); err != nil {
				t.Errorf("%v as sluice-ops: %v\n%s", args, err, out)
			}
		}
	})
	t.Run("sluice", func(t *testing.T) {
		t.Setenv("REDIS_PASSWORD", pw["sluice"])
		h, _ := mustAuthServe(t, scan, "--redis", s.Addr, "--redis-username", "sluice", "--rules-redis", "--key-store", "--ready-needs-redis")
		wantDecisions(t, scan, h, "acl")
		wantReady(t, scan, h)
		for range 2 {
			r, err := http.Post("http://"+h+"/v1/check", "application/json", strings.NewReader(`{"domain":"t","descriptors":[`+
				`{"entries":[{"key":"api_key","value":"k-1"}]},{"entries":[{"key":"remote_address","value":"192.0.2.1"}]},{"entries":[{"key":"tenant","value":"acme"}]}]}`))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(r.Body)
			r.Body.Close()
			scan.add("/v1/check", string(b))
			if r.StatusCode != http.StatusOK || len(regexp.MustCompile(`"code":\s*"OK"`).FindAllString(string(b), -1)) != 3 {
				t.Errorf("a check of every algorithm as sluice: %d\n%s", r.StatusCode, b)
			}
		}
		if m := grepMetrics(t, scan, h, "sluice_enforcer_degraded_decisions_total"); !strings.HasSuffix(m, " 0") {
			t.Errorf("degraded decisions as the documented user: %s", m)
		}
		code, b := getUsage(t, h, "k-1")
		scan.add("/v1/usage", b)
		if code != http.StatusOK || !strings.Contains(b, `"tier": "pro"`) {
			t.Errorf("/v1/usage as sluice: %d\n%s", code, b)
		}
	})
	entries, err := admin.ACLLog(context.Background(), 100).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("ACL LOG: user %s refused %s %s (%s): the documented lines miss it", e.Username, e.Context, e.Object, e.Reason)
	}

	t.Run("without evalsha", func(t *testing.T) {
		t.Setenv("REDIS_USERNAME", "sluice-noevalsha")
		t.Setenv("REDIS_PASSWORD", noEval)
		mustRefuse(t, scan, []string{"(noperm)", "evalsha", "--redis-username", "--redis-start-degraded"}, "--redis", s.Addr)
		h, log := mustAuthServe(t, scan, "--redis", s.Addr, "--redis-start-degraded", "--ready-needs-redis")
		code, body := waitReadyz(t, scan, h, regexp.MustCompile(`cause noperm`))
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "'evalsha'") {
			t.Errorf("/readyz without EVALSHA: %d, want 503 naming evalsha\n%s", code, body)
		}
		statuses := checkStatuses(t, scan, h, "noperm", 20)
		for _, st := range statuses {
			if st != http.StatusServiceUnavailable {
				t.Fatalf("checks without EVALSHA: %v, want every one the fail-closed rule's 503", statuses)
			}
		}
		m := grepMetrics(t, scan, h, "sluice_enforcer_")
		for _, re := range []string{`sluice_enforcer_breaker_trips_total [1-9]`, `sluice_enforcer_redis_errors_total\{cause="noperm"\} [1-9]`,
			`sluice_enforcer_redis_down_cause\{cause="noperm"\} 1`, `sluice_enforcer_redis_up 0`} {
			if !regexp.MustCompile(re).MatchString(m) {
				t.Errorf("metrics without EVALSHA lack %s:\n%s", re, m)
			}
		}
		if !strings.Contains(log.String(), "command=evalsha") {
			t.Errorf("the log does not name the refused command:\n%s", log)
		}
	})
	// A command refused inside the script comes back in Redis 7.0's own
	// words, without NOPERM ("The user executing the script can't run this
	// command"): serve stops at start all the same (it started degraded).
	t.Run("without mget", func(t *testing.T) {
		t.Setenv("REDIS_USERNAME", "sluice-nomget")
		t.Setenv("REDIS_PASSWORD", noMget)
		mustRefuse(t, scan, []string{"(noperm)", "--redis-username", "--redis-start-degraded"}, "--redis", s.Addr)
	})
	t.Run("without zadd", func(t *testing.T) {
		t.Setenv("REDIS_USERNAME", "sluice-nozadd")
		t.Setenv("REDIS_PASSWORD", noZadd)
		mustRefuse(t, scan, []string{"heartbeat", "(noperm)", "--redis-username", "--redis-start-degraded"}, "--redis", s.Addr)
		_, log := mustAuthServe(t, scan, "--redis", s.Addr, "--redis-start-degraded")
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(log.String(), "refuses the enforcer-count heartbeat") && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
		if n := strings.Count(log.String(), "refuses the enforcer-count heartbeat"); n != 1 {
			t.Errorf("%d log lines on the refused heartbeat, want 1 (once per cause):\n%s", n, log)
		}
	})
	t.Run("without the read-only scripts and subscribe", func(t *testing.T) {
		t.Setenv("REDIS_USERNAME", "sluice-noro")
		t.Setenv("REDIS_PASSWORD", noRO)
		h, log := mustAuthServe(t, scan, "--redis", s.Addr, "--rules-redis", "--key-store")
		wantDecisions(t, scan, h, "noro")
		for _, w := range []string{"redis refuses the read-only usage script", "redis refuses SUBSCRIBE to rule-set pushes"} {
			if !strings.Contains(log.String(), w) {
				t.Errorf("no %q in serve's log:\n%s", w, log)
			}
		}
		code, b := getUsage(t, h, "k-1")
		scan.add("/v1/usage", b)
		if !strings.Contains(b, "decisions are not affected") || strings.Contains(b, "decided by each rule's failure mode") {
			t.Errorf("/v1/usage without the read-only scripts: %d, want it to say decisions are not affected\n%s", code, b)
		}
	})
}

// TestServeTLS: TLS with certificates made now (redistest.StartTLS), with
// and without client certificates; a wrong CA, a missing client
// certificate and a wrong server name are refused with the flag to check.
func TestServeTLS(t *testing.T) {
	clearRedisEnv(t)
	pw := redistest.Password(t)
	plain := redistest.StartTLS(t, redistest.TLSOptions{})
	mutual := redistest.StartTLS(t, redistest.TLSOptions{ClientCerts: true, Password: pw})
	scan := newSecretScan(t, pw)

	t.Run("CA", func(t *testing.T) {
		h, log := mustAuthServe(t, scan, "--redis", plain.Addr, "--redis-tls-ca", plain.CAFile)
		wantDecisions(t, scan, h, "tls")
		wantReady(t, scan, h)
		if !strings.Contains(log.String(), "TLS)") {
			t.Errorf("the start line does not say TLS:\n%s", log)
		}
	})
	t.Run("server name", func(t *testing.T) {
		h, _ := mustAuthServe(t, scan, "--redis", plain.Addr, "--redis-tls-ca", plain.CAFile, "--redis-tls-server-name", "localhost")
		wantDecisions(t, scan, h, "tls-name")
		mustRefuse(t, scan, []string{"(tls)", "--redis-tls-server-name"}, "--redis", plain.Addr, "--redis-tls-ca", plain.CAFile, "--redis-tls-server-name", "redis.example.com")
	})
	t.Run("client certificate from the environment", func(t *testing.T) {
		t.Setenv("REDIS_ADDR", "rediss://:"+pw+"@"+mutual.Addr)
		t.Setenv("REDIS_TLS_CA", mutual.CAFile)
		t.Setenv("REDIS_TLS_CERT", mutual.ClientCertFile)
		t.Setenv("REDIS_TLS_KEY", mutual.ClientKeyFile)
		h, _ := mustAuthServe(t, scan, "--ready-needs-redis")
		wantDecisions(t, scan, h, "mtls")
		wantReady(t, scan, h)
	})
	t.Run("no client certificate", func(t *testing.T) {
		mustRefuse(t, scan, []string{"(tls)", "--redis-tls-cert"}, "--redis", "rediss://:"+pw+"@"+mutual.Addr, "--redis-tls-ca", mutual.CAFile)
	})
	t.Run("wrong CA", func(t *testing.T) {
		mustRefuse(t, scan, []string{"(tls)", "unknown authority", "--redis-tls-ca"}, "--redis", plain.Addr, "--redis-tls-ca", plain.OtherCAFile)
	})
	t.Run("plain text to a TLS server", func(t *testing.T) {
		// Redis closes the connection without a word; a TLS handshake on
		// the same address completes: serve stops, naming TLS and the
		// flag (found by a fresh user: it started "ready" and every
		// decision degraded). With --redis-start-degraded it starts, with
		// the hint in its log.
		mustRefuse(t, scan, []string{"speaks TLS", "--redis-tls", "rediss://"}, "--redis", plain.Addr)
		_, log := mustAuthServe(t, scan, "--redis", plain.Addr, "--redis-start-degraded")
		if !strings.Contains(log.String(), "if it takes TLS only, pass --redis-tls") {
			t.Errorf("no hint at --redis-tls in the log:\n%s", log)
		}
	})
	t.Run("no such database", func(t *testing.T) {
		// Every decision would fail on SELECT: serve stops, naming the flag.
		addr := redistest.Server(t).Options().Addr
		mustRefuse(t, scan, []string{"no database 99", "--redis URL's /DB"}, "--redis", "redis://:"+pw+"@"+addr+"/99")
	})
	t.Run("TLS to a plain-text server", func(t *testing.T) {
		// The handshake times out rather than fails (Redis waits for the
		// end of what it takes for an inline command): serve stops, naming
		// plain text and the flag, as a failed handshake does.
		addr := redistest.Server(t).Options().Addr
		mustRefuse(t, scan, []string{"speaks plain text, not TLS", "--redis-tls", "rediss://"}, "--redis", "rediss://:"+pw+"@"+addr)
	})
	t.Run("bad TLS flags", func(t *testing.T) {
		mustRefuse(t, scan, []string{"--redis-tls-cert and --redis-tls-key go together"}, "--redis", plain.Addr, "--redis-tls-cert", mutual.ClientCertFile)
		mustRefuse(t, scan, []string{"--redis-tls-ca", "no PEM certificate"}, "--redis", plain.Addr, "--redis-tls-ca", mutual.ClientKeyFile)
		mustRefuse(t, scan, []string{"redis:// URL (plain text)"}, "--redis", "redis://"+plain.Addr, "--redis-tls")
	})
}

// TestServeSentinelAuth: a master and a Sentinel with passwords of their
// own; the Sentinel's from REDIS_SENTINEL_PASSWORD, the master's from a
// file. Without the Sentinel's, serve stops naming its flag.
func TestServeSentinelAuth(t *testing.T) {
	clearRedisEnv(t)
	g := redistest.NewSentinelAuth(t)
	scan := newSecretScan(t, g.MasterPassword, g.SentinelPassword)
	file := passwordFile(t, g.MasterPassword)
	mustRefuse(t, scan, []string{"Sentinel", "(noauth)", "--redis-sentinel-password-file"},
		"--redis", g.Sentinel, "--redis-sentinel", redistest.SentinelMaster, "--redis-password-file", file)
	t.Setenv("REDIS_SENTINEL_PASSWORD", g.SentinelPassword)
	h, _ := mustAuthServe(t, scan, "--redis", g.Sentinel, "--redis-sentinel", redistest.SentinelMaster, "--redis-password-file", file, "--ready-needs-redis")
	wantDecisions(t, scan, h, "sentinel")
	wantReady(t, scan, h)
}

// TestServeClusterAuth: a Cluster with requirepass on every node, found
// from one address: the probe writes its key on every master, and checks
// of users on every master are decided by Redis.
func TestServeClusterAuth(t *testing.T) {
	clearRedisEnv(t)
	pw := redistest.Password(t)
	addrs := redistest.ClusterAuth(t, pw)
	scan := newSecretScan(t, pw)
	mustRefuse(t, scan, []string{"(noauth)"}, "--redis", addrs[0], "--redis-cluster")
	t.Setenv("REDIS_PASSWORD", pw)
	h, _ := mustAuthServe(t, scan, "--redis", addrs[0], "--redis-cluster", "--ready-needs-redis")
	for i := range 6 {
		wantDecisions(t, scan, h, fmt.Sprint("cluster-user-", i))
	}
	wantReady(t, scan, h)
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a, Password: pw})
		keys, err := c.Keys(context.Background(), "sl:*:sluice.readiness-probe:*").Result()
		c.Close()
		if err != nil || len(keys) == 0 {
			t.Errorf("master %s: no probe key (%v): the probe does not reach every master", a, err)
		}
	}
	if m := grepMetrics(t, scan, h, "sluice_enforcer_degraded_decisions_total"); !strings.HasSuffix(m, " 0") {
		t.Errorf("degraded decisions on a Cluster with its password: %s", m)
	}
}

// TestServePasswordFileRotation: the server's password changes, its
// connections are cut, and /readyz says wrongpass while the file holds the
// old one; once the file holds the new one, decisions recover without a
// restart.
func TestServePasswordFileRotation(t *testing.T) {
	clearRedisEnv(t)
	old, next := redistest.Password(t), redistest.Password(t)
	addr := redistest.RequirePass(t, old)
	scan := newSecretScan(t, old, next)
	file := passwordFile(t, old)
	h, _ := mustAuthServe(t, scan, "--redis", addr, "--redis-password-file", file)
	wantDecisions(t, scan, h, "before")
	admin := redis.NewClient(&redis.Options{Addr: addr, Password: old, PoolSize: 1})
	defer admin.Close()
	ctx := context.Background()
	if err := admin.ConfigSet(ctx, "requirepass", next).Err(); err != nil {
		t.Fatal(err)
	}
	// The sidecar's connections stay authenticated until Redis drops them,
	// as a restart or failover does (the admin's own is spared).
	if err := admin.ClientKillByFilter(ctx, "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	if code, body := waitReadyz(t, scan, h, regexp.MustCompile(`cause wrongpass`)); code != http.StatusOK {
		t.Errorf("/readyz (no --ready-needs-redis) with the old password: %d\n%s", code, body)
	}
	// The file gone (found by a fresh user: /readyz said Redis did not
	// answer): this host's file, named as such.
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if err := admin.ClientKillByFilter(ctx, "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	waitReadyz(t, scan, h, regexp.MustCompile(`sluice cannot read a file it connects to redis with: --redis-password-file: open`))
	if err := os.WriteFile(file, []byte(next+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	wantReady(t, scan, h)
	wantDecisions(t, scan, h, "after")
}

// TestServeMaxmemoryPolicy: an evicting policy is refused at start naming
// --redis-allow-eviction; with it the sidecar starts, warns, and says it in
// /readyz and a gauge.
func TestServeMaxmemoryPolicy(t *testing.T) {
	clearRedisEnv(t)
	scan := newSecretScan(t)
	lru := redistest.AddrWith(t, "--maxmemory-policy", "allkeys-lru")
	mustRefuse(t, scan, []string{"maxmemory-policy allkeys-lru", "--redis-allow-eviction"}, "--redis", lru)
	mustRefuse(t, scan, []string{"maxmemory-policy volatile-ttl", "--redis-allow-eviction"}, "--redis", redistest.AddrWith(t, "--maxmemory-policy", "volatile-ttl"))
	h, log := mustAuthServe(t, scan, "--redis", lru, "--redis-allow-eviction")
	if !strings.Contains(log.String(), "level=WARN") || !strings.Contains(log.String(), "policy=allkeys-lru") {
		t.Errorf("no warning of the policy in the log:\n%s", log)
	}
	code, body := waitReadyz(t, scan, h, regexp.MustCompile(`redis maxmemory-policy: allkeys-lru: can evict live counters and reset limits \(allowed by --redis-allow-eviction\)`))
	if code != http.StatusOK {
		t.Errorf("/readyz with an allowed evicting policy: %d\n%s", code, body)
	}
	if m := grepMetrics(t, scan, h, "sluice_enforcer_redis_maxmemory_policy"); !strings.Contains(m, `{policy="allkeys-lru"} 1`) || !strings.Contains(m, `{policy="noeviction"} 0`) {
		t.Errorf("policy gauge:\n%s", m)
	}
	wantDecisions(t, scan, h, "lru")
}

// TestServeOOM: under noeviction, a Redis over maxmemory refuses the
// decisions' writes: /readyz names oom, the checks follow the failure
// modes, the error metric counts oom; then it recovers.
func TestServeOOM(t *testing.T) {
	clearRedisEnv(t)
	scan := newSecretScan(t)
	addr := redistest.Addr(t)
	h, _ := mustAuthServe(t, scan, "--redis", addr, "--ready-needs-redis")
	wantDecisions(t, scan, h, "before")
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	if err := admin.ConfigSet(context.Background(), "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	code, body := waitReadyz(t, scan, h, regexp.MustCompile(`cause oom`))
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "OOM command not allowed") {
		t.Errorf("/readyz over maxmemory: %d\n%s", code, body)
	}
	if got := fmt.Sprint(checkStatuses(t, scan, h, "oom", 2)); got != "[503 503]" {
		t.Errorf("checks over maxmemory: %s, want the fail-closed rule's 503s", got)
	}
	if m := grepMetrics(t, scan, h, "sluice_enforcer_redis_errors_total"); !regexp.MustCompile(`\{cause="oom"\} [1-9]`).MatchString(m) {
		t.Errorf("no oom error counted:\n%s", m)
	}
	if err := admin.ConfigSet(context.Background(), "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	wantReady(t, scan, h)
	wantDecisions(t, scan, h, "after")
}

// TestReplayRedisCredentials: sluice replay --redis takes the same
// credentials (here a URL, and REDIS_PASSWORD): each region's database is
// reached and flushed; a wrong password is named, never shown.
func TestReplayRedisCredentials(t *testing.T) {
	clearRedisEnv(t)
	pw := redistest.Password(t)
	addr := redistest.RequirePass(t, pw)
	scan := newSecretScan(t, pw)
	junk := filepath.Join(t.TempDir(), "junk.log")
	if err := os.WriteFile(junk, []byte("not a log\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	replay := func(args ...string) (string, error) {
		t.Helper()
		return sluiceCmd(t, scan, append(append([]string{"replay"}, args...), junk)...)
	}
	for _, args := range [][]string{{"--redis", "redis://:" + pw + "@" + addr + "/2"}, {"--redis", addr, "--redis-db", "2", "--redis-password", pw}} {
		out, err := replay(args...)
		if err == nil || !strings.Contains(err.Error(), "PROBLEMS") || !strings.Contains(out, "redis-server at "+addr+", databases 2-") {
			t.Errorf("replay %s: %v\n%s", redactURL(args[1]), err, out)
		}
	}
	if _, err := replay("--redis", "redis://:"+pw+"@"+addr+"/2", "--redis-db", "3"); err == nil || !strings.Contains(err.Error(), "give the database once") {
		t.Errorf("two databases: %v", err)
	}
	t.Setenv("REDIS_PASSWORD", pw+"-not")
	if _, err := replay("--redis", addr); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Errorf("a wrong REDIS_PASSWORD: %v, want WRONGPASS", err)
	}
}

// getUsage asks the sidecar at addr for /v1/usage as the caller of apiKey
// and returns the status and body.
func getUsage(t *testing.T, addr, apiKey string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/usage", nil)
	req.Header.Set("x-api-key", apiKey)
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return r.StatusCode, string(b)
}
