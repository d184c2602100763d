package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"


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

// add records what a process said; a *syncBuffer is read at check time.
func (s *secretScan) add(what string, text any) {
	s.t.Helper()
	n := fmt.Sprintf("%s #%d", what, len(s.texts))
	switch v := text.(type) {
	case string:
		s.texts[n] = v
	case *syncBuffer:
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
func authServe(t *testing.T, scan *secretScan, args ...string) (string, *syncBuffer, error) {
	t.Helper()
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rulesFile, []byte(authRules), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	log := new(syncBuffer)
	root := newRoot()
	root.SetArgs(append([]string{"serve", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--budget", "1s",
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
func mustAuthServe(t *testing.T, scan *secretScan, args ...string) (string, *syncBuffer) {
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
// sets counts.
func clearRedisEnv(t *testing.T) {
	t.Helper()
	var f redisFlags
	f.add(newRoot().Flags(), "", anyTopology)
	for _, n := range f.names {
		t.Setenv(envName(n), "")
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
		for _, sub := range [][]string{{"serve"}, {"rules", "push"}, {"apply"}, {"pipeline"}, {"replay"}, {"eval"}} {
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
