package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

// sluice runs the command line args and returns its output, its error
// output and its error.
func sluice(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	unsetenv(t, "REDIS_ADDR") // only what the test names
	root := newRoot()
	var o, e bytes.Buffer
	root.SetArgs(args)
	root.SetOut(&o)
	root.SetErr(&e)
	err = root.ExecuteContext(context.Background())
	return o.String(), e.String(), err
}

// must runs args and fails the test on an error; it returns the output.
func must(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, err := sluice(t, args...)
	if err != nil {
		t.Fatalf("sluice %s: %v\n%s", strings.Join(args, " "), err, errOut)
	}
	return out
}

// writeRules writes a rule file (domain d, one per-user rule of limit per
// minute, mode) into dir and returns its path.
func writeRules(t *testing.T, dir, name string, limit int, mode string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	y := fmt.Sprintf("domain: d\nrules:\n  - id: per-user\n    match: [{key: user}]\n    limit: %d\n    period: 1m\n    mode: %s\n", limit, mode)
	if err := os.WriteFile(p, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRulesValidate(t *testing.T) {
	dir := t.TempDir()
	good := writeRules(t, dir, "good.yaml", 10, "enforce")
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("domain: d\nrules:\n  - id: x\n    match: [{key: nope}]\n    limit: 1\n    period: 1s\n"), 0o644)

	if out := must(t, "rules", "validate", good, "../../testdata/rules/per-ip-60.yaml"); !strings.Contains(out, "good.yaml: ok: domain d, 1 rule") {
		t.Errorf("validate good: %q", out)
	}
	out, errOut, err := sluice(t, "rules", "validate", good, bad)
	if err == nil || !strings.Contains(err.Error(), "1 of 2 rule files is invalid") {
		t.Errorf("validate with a bad file: %v", err)
	}
	if !strings.Contains(errOut, "bad.yaml:4:12: rule 1") || !strings.Contains(out, "good.yaml: ok") {
		t.Errorf("validate output %q, errors %q; want bad.yaml:4:12 (the match) named", out, errOut)
	}
	if _, _, err := sluice(t, "rules", "validate"); err == nil {
		t.Error("validate without files: no error")
	}
	// Found by a fresh user: 70 rules on one key validated silently, and
	// serve then refused every check (more than one request may match).
	var many strings.Builder
	many.WriteString("domain: d\nrules:\n")
	for i := range 70 {
		fmt.Fprintf(&many, "  - {id: r%d, match: [{key: client_ip}], limit: %d, period: 1s}\n", i, 100+i)
	}
	manyFile := filepath.Join(dir, "many.yaml")
	os.WriteFile(manyFile, []byte(many.String()), 0o644)
	out, errOut, err = sluice(t, "rules", "validate", manyFile)
	if err != nil || !strings.Contains(out, "many.yaml: ok: domain d, 70 rules") || !strings.Contains(errOut, "warning: 70 rules, more than one request may match (64)") {
		t.Errorf("validate of 70 rules: %v, output %q, errors %q; want ok and a warning", err, out, errOut)
	}
}

func TestRulesDiff(t *testing.T) {
	dir := t.TempDir()
	a := writeRules(t, dir, "a.yaml", 10, "enforce")
	b := writeRules(t, dir, "b.yaml", 20, "shadow")
	out := must(t, "rules", "diff", a, b)
	if !strings.Contains(out, "~ per-user: limit 10 → 20, burst 10 → 20, mode enforce → shadow") {
		t.Errorf("diff of files:\n%s", out)
	}
	if out := must(t, "rules", "diff", a, a); !strings.Contains(out, "no changes") {
		t.Errorf("diff of a file with itself:\n%s", out)
	}
	addr := redistest.Addr(t)
	if out := must(t, "rules", "diff", b, "--redis", addr); !strings.Contains(out, "--- in force: none") || !strings.Contains(out, "+ per-user") {
		t.Errorf("diff against an empty store:\n%s", out)
	}
	must(t, "rules", "push", a, "--redis", addr)
	if out := must(t, "rules", "diff", b, "--redis", addr); !strings.Contains(out, "--- in force: version 1") || !strings.Contains(out, "limit 10 → 20") {
		t.Errorf("diff against the set in force:\n%s", out)
	}
	if _, _, err := sluice(t, "rules", "diff", a); err == nil {
		t.Error("diff of one file without Redis: no error")
	}
}

func TestRulesPushListRollback(t *testing.T) {
	dir := t.TempDir()
	addr := redistest.Addr(t)
	a := writeRules(t, dir, "a.yaml", 10, "enforce")
	b := writeRules(t, dir, "b.yaml", 20, "enforce")
	if out := must(t, "rules", "push", a, "--redis", addr); !strings.Contains(out, "pushed "+a+" as version 1 (was none): +1 -0 ~0") {
		t.Errorf("push: %q", out)
	}
	if out := must(t, "rules", "push", b, "--redis", addr, "--version", "7"); !strings.Contains(out, "as version 7 (was 1): +0 -0 ~1") {
		t.Errorf("push --version 7: %q", out)
	}
	if _, _, err := sluice(t, "rules", "push", a, "--redis", addr, "--version", "7"); err == nil || !strings.Contains(err.Error(), "not above the version in force") {
		t.Errorf("push of version 7 again: %v", err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("domain: d\nrules:\n  - id: x\n    limit: 1\n"), 0o644)
	if _, _, err := sluice(t, "rules", "push", bad, "--redis", addr); err == nil || !strings.Contains(err.Error(), "bad.yaml:3:5") {
		t.Errorf("push of a bad file: %v", err)
	}
	if _, _, err := sluice(t, "rules", "push", a); err == nil || !strings.Contains(err.Error(), "--redis") {
		t.Errorf("push without Redis: %v", err)
	}

	if out := must(t, "rules", "push", b, "--redis", addr); !strings.Contains(out, b+" is already in force as version 7: nothing pushed") {
		t.Errorf("push of the content in force: %q", out)
	}
	out := must(t, "rules", "list", "--redis", addr)
	for _, want := range []string{
		"static rule set: version 7, sha " + store.SHA(mustRead(t, b))[:12] + ", pushed ",
		"domain d, 1 rule",
		"per-user  user  20 per 1m0s, burst 20 (token bucket), enforce",
		"history (newest first, 2 kept):",
		"  v1  ",
		"dynamic rules: 0 active of 0 stored, cap 1000, kill switch off",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("list lacks %q:\n%s", want, out)
		}
	}

	if out := must(t, "rules", "rollback", "--redis", addr); !strings.Contains(out, "rolled back to version 1's content as version 8 (was 7): +0 -0 ~1") {
		t.Errorf("rollback: %q", out)
	}
	if out := must(t, "rules", "list", "--redis", addr); !strings.Contains(out, "version 8, rollback to v1") || !strings.Contains(out, "10 per 1m0s") {
		t.Errorf("list after rollback:\n%s", out)
	}
	if _, _, err := sluice(t, "rules", "rollback", "--redis", addr); err == nil || !strings.Contains(err.Error(), "no earlier version") {
		t.Errorf("rollback past the first version: %v", err)
	}
	if out := must(t, "rules", "rollback", "--to", "7", "--redis", addr); !strings.Contains(out, "version 7's content as version 9 (was 8): +0 -0 ~1") {
		t.Errorf("rollback --to 7: %q", out)
	}
	if out := must(t, "rules", "rollback", "--to", "9", "--redis", addr); !strings.Contains(out, "version 9's content is already in force (version 9): nothing written") {
		t.Errorf("rollback --to the version in force: %q", out)
	}
	if out := must(t, "rules", "list", "--redis", addr); !strings.Contains(out, "static rule set: version 9, rollback to v7") {
		t.Errorf("list after a no-op rollback:\n%s", out)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// slowClient returns a client of addr through a proxy, with one connection
// already open, and the proxy: a delay injected then holds the replies to
// its commands, not its handshake.
func slowClient(t *testing.T, addr string, timeout time.Duration) (*redis.Client, *redistest.Proxy) {
	t.Helper()
	p := redistest.NewProxy(t, addr)
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), PoolSize: 1, MaxRetries: -1, ReadTimeout: timeout})
	t.Cleanup(func() { c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	return c, p
}

// TestRulesPushSummary: the summary compares the new set with the version
// the push replaced, even when other pushes land while it runs (here, while
// Redis's replies to it are delayed), and says so when that version can no
// longer be read.
func TestRulesPushSummary(t *testing.T) {
	dir := t.TempDir()
	addr := redistest.Addr(t)
	must(t, "rules", "push", writeRules(t, dir, "a.yaml", 10, "enforce"), "--redis", addr) // version 1, and the script loaded
	slow, p := slowClient(t, addr, 10*time.Second)
	p.Inject(redistest.Delay, time.Second)
	done := make(chan string, 1)
	go func() {
		var out bytes.Buffer
		if err := push(context.Background(), &out, store.NewSetStore(slow), "b.yaml", mustRead(t, writeRules(t, dir, "b.yaml", 20, "enforce")), 0); err != nil {
			out.WriteString(err.Error())
		}
		done <- out.String()
	}()
	// While the slow push waits for its replies, 20 others land: the history
	// (20 versions) no longer holds the one it replaced. Its write reaches
	// Redis at once (only the replies are delayed): wait until Redis holds
	// it, rather than a fixed time, which a loaded machine's scheduler can
	// outlast before the push's goroutine has sent anything.
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	st := store.NewSetStore(rdb)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if e, err := st.Current(context.Background()); err == nil && e.Version == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the slow push never reached Redis as version 2")
		}
	}
	for i := range 20 {
		if _, err := st.Push(context.Background(), "c.yaml", mustRead(t, writeRules(t, dir, "c.yaml", 100+i, "enforce")), 0); err != nil {
			t.Fatal(err)
		}
	}
	out := <-done
	m := regexp.MustCompile(`as version (\d+) \(was (\d+)`).FindStringSubmatch(out)
	if m == nil || m[1] != "2" || m[2] != "1" {
		t.Fatalf("slow push: %q; want version 2, replacing version 1", out)
	}
	if !strings.Contains(out, "cannot read it for a summary") || !strings.Contains(out, "not in the history") {
		t.Errorf("slow push: %q; want it to say the replaced version is gone from the history", out)
	}
	// Sequential pushes diff against the version each replaced.
	if out := must(t, "rules", "push", writeRules(t, dir, "d.yaml", 20, "shadow"), "--redis", addr); !strings.Contains(out, "as version 23 (was 22): +0 -0 ~1") {
		t.Errorf("push: %q", out)
	}
}

// TestRulesPushTimeout: a push that Redis does not answer in time says that
// it may or may not have been written, and how to check.
func TestRulesPushTimeout(t *testing.T) {
	addr := redistest.Addr(t)
	dir := t.TempDir()
	must(t, "rules", "push", writeRules(t, dir, "a.yaml", 10, "enforce"), "--redis", addr) // the script loaded
	slow, p := slowClient(t, addr, 300*time.Millisecond)
	p.Inject(redistest.Delay, time.Second)
	var out bytes.Buffer
	err := push(context.Background(), &out, store.NewSetStore(slow), "b.yaml", mustRead(t, writeRules(t, dir, "b.yaml", 20, "enforce")), 0)
	if err == nil || !strings.Contains(err.Error(), "may or may not have happened") || !strings.Contains(err.Error(), "sluice rules list") {
		t.Fatalf("push without an answer: %v; want it to say the write may or may not have happened, and to check with list", err)
	}
	if out := must(t, "rules", "list", "--redis", addr); !strings.Contains(out, "static rule set: version 2") {
		t.Errorf("list after the unanswered push (which reached Redis):\n%s", out)
	}
}

// TestRulesListEnforcers: list shows what each sidecar following the store
// holds, and flags one whose set differs from the store's.
func TestRulesListEnforcers(t *testing.T) {
	dir := t.TempDir()
	addr := redistest.Addr(t)
	if out := must(t, "rules", "list", "--redis", addr); !strings.Contains(out, "enforcers: none reporting") {
		t.Errorf("list without enforcers:\n%s", out)
	}
	must(t, "rules", "push", writeRules(t, dir, "a.yaml", 10, "enforce"), "--redis", addr, "--version", "9")
	_, _, log := serve(t, "--redis", addr, "--rules-redis", "--instance", "sc-1", "--rules-poll", "50ms")
	waitLog(t, log, appliedVersion, 1)
	sha := store.SHA(mustRead(t, filepath.Join(dir, "a.yaml")))[:12]
	if out := must(t, "rules", "list", "--redis", addr); !regexp.MustCompile(`enforcers: 1 reporting, 0 differ from the store, 0 stale\n.*\n  sc-1 +9 +` + sha + ` +\d+s ago`).MatchString(out) {
		t.Errorf("list with one enforcer:\n%s", out)
	}

	// Version 9 rewritten in place: the running sidecar refuses it, and
	// list shows the split.
	other := []byte(strings.Replace(string(mustRead(t, filepath.Join(dir, "a.yaml"))), "limit: 10", "limit: 300", 1))
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	rdb.HSet(context.Background(), store.RuleSetKey, "yaml", other, "sha", store.SHA(other))
	waitLog(t, log, regexp.MustCompile(`rule set refused: same version as the one in force, other content`), 1)
	if out := must(t, "rules", "list", "--redis", addr); !regexp.MustCompile(`sc-1 +9 +` + sha + ` .*DIFFERS: same version, other content than the store's \(sha ` + store.SHA(other)[:12] + `\)`).MatchString(out) {
		t.Errorf("list of a split:\n%s", out)
	}

	// Redis loses its data: the sidecar reports again, and the next push
	// goes above its version.
	rdb.FlushAll(context.Background())
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(must(t, "rules", "list", "--redis", addr), "enforcers hold up to version 9") {
		if time.Now().After(deadline) {
			t.Fatalf("the sidecar did not report again within 10 s:\n%s", must(t, "rules", "list", "--redis", addr))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if out := must(t, "rules", "push", writeRules(t, dir, "b.yaml", 20, "enforce"), "--redis", addr); !strings.Contains(out, "as version 10 (was none)") {
		t.Errorf("push after Redis lost its data: %q; want version 10", out)
	}
	if m := waitLog(t, log, appliedVersion, 2); m[1][2] != "10" {
		t.Errorf("the sidecar applied %v, want version 10", m)
	}
}

func TestRulesDynamic(t *testing.T) {
	addr := redistest.Addr(t)
	out := must(t, "rules", "dynamic", "add", "--redis", addr, "--id", "asn-64500", "--match", "asn=64500", "--match", "client_ip",
		"--limit", "10", "--period", "1m", "--ttl", "30m", "--reason", "scraping /v1/search", "--origin", "detector/test")
	if !strings.Contains(out, "dynamic rule asn-64500: 10 per 1m0s, burst 10 (token bucket), shadow, expires ") {
		t.Errorf("dynamic add: %q", out)
	}
	for _, args := range [][]string{
		{"--id", "x", "--match", "user", "--limit", "1"},                                // no TTL
		{"--id", "x", "--match", "user", "--limit", "1", "--ttl", "-1m"},                // negative TTL
		{"--id", "x", "--match", "no pe", "--limit", "1", "--ttl", "1m"},                // bad key (any other name is a custom key)
		{"--id", "x", "--match", "user", "--limit", "-1", "--ttl", "1m"},                // invalid rule
		{"--id", "x", "--match", "user", "--limit", "1", "--ttl", "1m", "--mode", "no"}, // bad mode
	} {
		if _, _, err := sluice(t, append([]string{"rules", "dynamic", "add", "--redis", addr}, args...)...); err == nil {
			t.Errorf("dynamic add %v: no error", args)
		}
	}
	// The cap: one more rule into a cap of 1 is refused.
	if _, _, err := sluice(t, "rules", "dynamic", "add", "--redis", addr, "--cap", "1", "--id", "y", "--match", "user", "--limit", "1", "--ttl", "1m"); err == nil || !strings.Contains(err.Error(), "cap reached") {
		t.Errorf("dynamic add over the cap: %v", err)
	}

	out = must(t, "rules", "list", "--redis", addr)
	if !regexp.MustCompile(`asn-64500\s+shadow\s+detector/test\s+(29m59s|30m0s)\s+asn = 64500; client_ip\s+10 per 1m0s.*scraping /v1/search`).MatchString(out) ||
		!strings.Contains(out, "static rule set: none pushed") || !strings.Contains(out, "1 active of 1 stored") {
		t.Errorf("list of a dynamic rule:\n%s", out)
	}

	if out := must(t, "rules", "promote", "asn-64500", "--redis", addr); !strings.Contains(out, "asn-64500 now enforces (version 1)") {
		t.Errorf("promote: %q", out)
	}
	if out := must(t, "rules", "list", "--redis", addr); !strings.Contains(out, "enforce (promoted)") {
		t.Errorf("list after promote:\n%s", out)
	}
	if _, _, err := sluice(t, "rules", "promote", "asn-64500", "--redis", addr); err == nil {
		t.Error("promoting an enforcing rule: no error")
	}
	if out := must(t, "rules", "rollback", "--rule", "asn-64500", "--redis", addr); !strings.Contains(out, "asn-64500 back to shadow (version 2)") {
		t.Errorf("rollback --rule: %q", out)
	}
	if out := must(t, "rules", "list", "--redis", addr); !strings.Contains(out, "shadow (rolled back)") {
		t.Errorf("list after rollback --rule:\n%s", out)
	}
	if _, _, err := sluice(t, "rules", "promote", "nope", "--redis", addr); err == nil || !strings.Contains(err.Error(), "no dynamic rule") {
		t.Errorf("promote of an unknown rule: %v", err)
	}
}

// TestRulesDynamicAddChecks: dynamic add refuses an empty value after =,
// a TTL beyond the dynamic rules' 24 h, and the id of a rule of the static
// set in the store; it takes custom keys.
func TestRulesDynamicAddChecks(t *testing.T) {
	addr := redistest.Addr(t)
	add := func(args ...string) (string, error) {
		out, _, err := sluice(t, append([]string{"rules", "dynamic", "add", "--redis", addr, "--limit", "1", "--ttl", "1h"}, args...)...)
		return out, err
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--id", "x", "--match", "user="}, `--match "user=": an empty value`},
		{[]string{"--id", "x", "--match", "=u"}, `--match "=u"`},
		{[]string{"--id", "x", "--match", "user", "--ttl", "876000h"}, "a dynamic rule lives at most 24h; make it a static rule for longer"},
		{[]string{"--id", "x", "--match", "user", "--algorithm", "leaky"}, "unknown algorithm"},
	} {
		if _, err := add(c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("dynamic add %v: %v; want an error with %q", c.args, err, c.want)
		}
	}
	if ds, err := store.NewStore(redis.NewClient(&redis.Options{Addr: addr})).Dynamic(context.Background()); err != nil || len(ds) != 0 {
		t.Fatalf("refused adds stored %d rules (%v)", len(ds), err)
	}

	// No static set in the store: any id.
	if _, err := add("--id", "per-user", "--match", "user=u1"); err != nil {
		t.Errorf("dynamic add without a static set: %v", err)
	}
	must(t, "rules", "push", writeRules(t, t.TempDir(), "a.yaml", 10, "enforce"), "--redis", addr)
	if _, err := add("--id", "per-user", "--match", "user=u1"); err == nil || !strings.Contains(err.Error(), `"per-user" is the id of a rule of the static set (version 1)`) {
		t.Errorf("dynamic add of a static rule's id: %v", err)
	}

	// Custom keys, and the aliases of well-known ones.
	if _, err := add("--id", "slow", "--match", "generic_key=slow", "--match", "user_id", "--algorithm", "concurrency"); err != nil {
		t.Fatalf("dynamic add with a custom key: %v", err)
	}
	out := must(t, "rules", "list", "--redis", addr)
	if !regexp.MustCompile(`slow\s+shadow\s+operator/\S+\s+\S+\s+generic_key = slow; user\s+1 in flight`).MatchString(out) {
		t.Errorf("list of a dynamic rule on a custom key:\n%s", out)
	}
	help := must(t, "rules", "dynamic", "add", "--help")
	for _, want := range []string{"token_bucket (default), sliding_window, fixed_window or concurrency", "custom key", "at most 24h"} {
		if !strings.Contains(help, want) {
			t.Errorf("dynamic add --help lacks %q:\n%s", want, help)
		}
	}
}

func TestRulesKill(t *testing.T) {
	addr := redistest.Addr(t)
	must(t, "rules", "dynamic", "add", "--redis", addr, "--id", "a", "--match", "user", "--limit", "1", "--ttl", "1h")
	if out := must(t, "rules", "kill", "on", "--reason", "false positives", "--redis", addr); !strings.Contains(out, "kill switch on (") || !strings.Contains(out, ": false positives)") {
		t.Errorf("kill on: %q", out)
	}
	if out := must(t, "rules", "list", "--redis", addr); !strings.Contains(out, "kill switch ON (") {
		t.Errorf("list while killed:\n%s", out)
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	st := store.NewStore(rdb)
	if c, err := st.Load(context.Background(), time.Now()); err != nil || !c.Killed || len(c.Rules) != 0 {
		t.Errorf("load while killed: %+v %v", c, err)
	}
	if out := must(t, "rules", "kill", "off", "--redis", addr); !strings.Contains(out, "kill switch off") {
		t.Errorf("kill off: %q", out)
	}
	if c, err := st.Load(context.Background(), time.Now()); err != nil || c.Killed || len(c.Rules) != 1 {
		t.Errorf("load after kill off: %+v %v", c, err)
	}
	if _, _, err := sluice(t, "rules", "kill", "maybe", "--redis", addr); err == nil {
		t.Error("kill maybe: no error")
	}
}

func TestRulesKeys(t *testing.T) {
	addr := redistest.Addr(t)
	if out := must(t, "rules", "keys", "account", "acme-eu", "--org", "acme", "--tier", "enterprise", "--redis", addr); !strings.Contains(out, `account acme-eu: org "acme", tier "enterprise"`) {
		t.Errorf("account: %q", out)
	}
	must(t, "rules", "keys", "key", "k1", "acme-eu", "--redis", addr)
	if out := must(t, "rules", "keys", "get", "k1", "--redis", addr); !strings.Contains(out, `key k1: account acme-eu, org "acme", tier "enterprise"`) {
		t.Errorf("get: %q", out)
	}
	if _, _, err := sluice(t, "rules", "keys", "get", "nobody", "--redis", addr); err == nil || !strings.Contains(err.Error(), "not in the key store") {
		t.Errorf("get of an unknown key: %v", err)
	}
}

// TestPushAfterDataLoss: Redis lost its data while an enforcer kept version
// 12; a push into the empty store goes above it instead of being refused by
// every enforcer as older. A static rule that takes a dynamic rule's id is
// warned about.
func TestPushAfterDataLoss(t *testing.T) {
	defer func(w time.Duration) { enforcerWait = w }(enforcerWait)
	enforcerWait = 2 * time.Second
	rdb := redistest.Server(t)
	addr := rdb.Options().Addr
	ctx := context.Background()
	dyn := rules.Rule{ID: "per-user", Match: []rules.Match{{Key: rules.KeyUser}}, Limit: 1, Period: time.Minute,
		Mode: rules.Enforce, Origin: "operator/test", Reason: "test", ExpiresAt: time.Now().Add(time.Hour)}
	if _, err := store.NewStore(rdb).PutDynamic(ctx, time.Now(), []rules.Rule{dyn}); err != nil {
		t.Fatal(err)
	}
	go func() { // the enforcer's first poll after the restart, a moment later
		time.Sleep(300 * time.Millisecond)
		now, _ := rdb.Time(ctx).Result()
		rdb.HSet(ctx, store.RuleSetEnforcersKey, "sc-a", fmt.Sprintf("12 abc %d", now.UnixMilli()))
	}()
	file := writeRules(t, t.TempDir(), "r.yaml", 5, "enforce")
	out := must(t, "rules", "push", file, "--redis", addr)
	if !strings.Contains(out, "enforcers hold version 12") || !strings.Contains(out, "pushed "+file+" again as version 13") {
		t.Errorf("push after data loss:\n%s", out)
	}
	if v, _ := rdb.HGet(ctx, store.RuleSetKey, "version").Result(); v != "13" {
		t.Errorf("version in the store %q, want 13", v)
	}
	if !strings.Contains(out, "warning: dynamic rule per-user") {
		t.Errorf("no warning for the dynamic rule the set switches off:\n%s", out)
	}
}

func TestRulesDynamicCIDR(t *testing.T) {
	addr := redistest.Addr(t)
	if _, _, err := sluice(t, "rules", "dynamic", "add", "--redis", addr, "--id", "net", "--match", "client_ip=10.0.0.0/8", "--limit", "0", "--ttl", "1m"); err == nil || !strings.Contains(err.Error(), "--cidr") {
		t.Errorf("a network as a client_ip value: %v, want a pointer to --cidr", err)
	}
	must(t, "rules", "dynamic", "add", "--redis", addr, "--id", "net", "--cidr", "10.0.0.0/8", "--cidr", "2001:db8::/32", "--limit", "0", "--ttl", "1m")
	if out := must(t, "rules", "list", "--redis", addr); !strings.Contains(out, "client_ip in cidr [10.0.0.0/8, 2001:db8::/32]") {
		t.Errorf("list of a network rule:\n%s", out)
	}
}
