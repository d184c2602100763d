package main

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/syncbuf"

	"github.com/sluice-rl/sluice/internal/redistest"
)

var appliedVersion = regexp.MustCompile(`rule set applied" source=(\w+) version=(\d+)`)

// waitLog waits until the serve log matches re n times.
func waitLog(t *testing.T, log *syncbuf.Buffer, re *regexp.Regexp, n int) [][]string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if m := re.FindAllStringSubmatch(log.String(), -1); len(m) >= n {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d matches of %q in the log within 10 s, want %d:\n%s", len(re.FindAllString(log.String(), -1)), re, n, log)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestServeFollowsRuleFile: serve --rules reloads the file when it changes
// and keeps the rules in force when the new file is broken.
func TestServeFollowsRuleFile(t *testing.T) {
	dir := t.TempDir()
	p := writeRules(t, dir, "rules.yaml", 10, "enforce")
	_, _, log := serve(t, "--redis", redistest.Addr(t), "--rules", p, "--rules-poll", "50ms")
	if m := waitLog(t, log, appliedVersion, 1); m[0][1] != "file" || m[0][2] != "1" {
		t.Fatalf("first set: %v", m)
	}
	os.WriteFile(p, []byte("domain: d\nrules: [\n"), 0o644)
	waitLog(t, log, regexp.MustCompile(`rule set refused: invalid; keeping the one in force" source=file candidate=0 version=1`), 1)
	writeRules(t, dir, "rules.yaml", 20, "enforce")
	if m := waitLog(t, log, appliedVersion, 2); m[1][2] != "2" {
		t.Fatalf("after a change: %v", m)
	}
}

// TestServeRulesRedis: serve --rules-redis takes the set pushed to the
// region's Redis, and follows later pushes.
func TestServeRulesRedis(t *testing.T) {
	dir := t.TempDir()
	addr := redistest.Addr(t)
	must(t, "rules", "push", writeRules(t, dir, "a.yaml", 10, "enforce"), "--redis", addr, "--version", "41")
	_, _, log := serve(t, "--redis", addr, "--rules-redis", "--rules", "../../testdata/rules/per-ip-60.yaml")
	if m := waitLog(t, log, appliedVersion, 1); m[0][1] != "redis" || m[0][2] != "41" {
		t.Fatalf("first set: %v", m)
	}
	if !strings.Contains(log.String(), "rules_version=41 rules_source=redis") {
		t.Errorf("serving without the version in force:\n%s", log)
	}
	must(t, "rules", "push", writeRules(t, dir, "b.yaml", 20, "enforce"), "--redis", addr)
	if m := waitLog(t, log, appliedVersion, 2); m[1][2] != "42" {
		t.Fatalf("after a push: %v", m)
	}
}

// TestServeRulesRedisEmpty: with no set in Redis yet, the --rules file is
// in force, and a push replaces it.
func TestServeRulesRedisEmpty(t *testing.T) {
	addr := redistest.Addr(t)
	_, _, log := serve(t, "--redis", addr, "--rules-redis", "--rules", "../../testdata/rules/per-ip-60.yaml", "--rules-poll", "50ms")
	waitLog(t, log, regexp.MustCompile(`no rule set from Redis yet`), 1)
	if !strings.Contains(log.String(), "domain=replay rules=1 rules_version=0 rules_source=redis") {
		t.Errorf("serving without the file's set:\n%s", log)
	}
	must(t, "rules", "push", writeRules(t, t.TempDir(), "a.yaml", 10, "enforce"), "--redis", addr)
	if m := waitLog(t, log, appliedVersion, 1); m[0][2] != "1" {
		t.Fatalf("after the first push: %v", m)
	}
}

// TestServeHelpNoDynamic: --no-dynamic is a switch; its help names no
// argument (pflag takes a `quoted` word of a usage string as one).
func TestServeHelpNoDynamic(t *testing.T) {
	help := must(t, "serve", "--help")
	if !regexp.MustCompile(`--no-dynamic +this sidecar's kill switch`).MatchString(help) {
		t.Errorf("serve --help:\n%s", help)
	}
}

// TestServeRulesFileErrorOnce: `sluice serve --rules` with a missing or an
// invalid file exits 1 and prints the error once, not also as a log line
// (a fresh user's finding).
func TestServeRulesFileErrorOnce(t *testing.T) {
	for name, c := range map[string]struct{ file, want string }{
		"missing": {"../../testdata/docs/no-such-file.yaml", "no-such-file.yaml: no such file or directory"},
		"invalid": {"../../testdata/docs/bad.yaml", `bad.yaml:4:12: rule 1: invalid rule "x"`},
	} {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "serve", "--rules", c.file, "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--redis", "127.0.0.1:1")
			cmd.Env = append(os.Environ(), "SLUICE_TEST_AS_MAIN=1")
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("exit 0, want 1:\n%s", out)
			}
			if n := strings.Count(string(out), c.want); n != 1 || !strings.HasPrefix(string(out), "sluice: sidecar: rule file: ") {
				t.Errorf("the error %q printed %d times, want once, as the command's error:\n%s", c.want, n, out)
			}
		})
	}
}
