//go:build !nocharts

package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/syncbuf"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/internal/crowdsectest"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules/store"
)

// crowdsecOutage is how long TestCrowdSecBouncer stops the Local API: the
// issue's 60 s by default (make test runs it in full); shorter to iterate
// locally, e.g. go test ./cmd/sluice/ -run TestCrowdSecBouncer
// -crowdsec.outage=10s.
var crowdsecOutage = flag.Duration("crowdsec.outage", 60*time.Second, "how long TestCrowdSecBouncer stops the CrowdSec Local API")

var crowdsecMetrics = regexp.MustCompile(`msg="CrowdSec bouncer running".* metrics=(127\.0\.0\.1:\d+)`)

// secretFile writes a credential to a file of the test's and returns its
// path.
func secretFile(t *testing.T, s string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(s+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// crowdsecBouncer runs `sluice crowdsec args...` until the test ends, with
// the bouncer's key in --api-key-file, and returns its metrics address and
// its log.
func crowdsecBouncer(t *testing.T, key string, args ...string) (string, *syncbuf.Buffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	log := new(syncbuf.Buffer)
	root := newRoot()
	root.SetArgs(append([]string{"crowdsec", "--metrics", "127.0.0.1:0", "--api-key-file", secretFile(t, key)}, args...))
	root.SetErr(log)
	root.SetOut(io.Discard)
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("sluice crowdsec: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("sluice crowdsec did not stop within 15 s of its context's end")
		}
		if strings.Contains(log.String(), key) {
			t.Error("the bouncer's API key is in its log")
		}
	})
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		if m := crowdsecMetrics.FindStringSubmatch(log.String()); m != nil {
			return m[1], log
		}
		select {
		case err := <-done:
			t.Fatalf("sluice crowdsec exited: %v\n%s", err, log)
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("sluice crowdsec did not start within 10 s:\n%s", log)
	return "", nil
}

// scrape returns the value of one series of the text exposition at
// http://addr/metrics, written as in the exposition (name{labels}); -1
// when absent.
func scrape(t *testing.T, addr, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	return -1
}

// checker posts /v1/check for one client address to a sluice serve.
type checker struct {
	t    *testing.T
	addr string
	hc   *http.Client
}

// code returns the check's overall code (OK, OVER_LIMIT) and HTTP status;
// an error is a transport error or an answer other than 200 and 429.
func (c *checker) code(ip string) (string, error) {
	body := fmt.Sprintf(`{"domain":"cs","descriptors":[{"entries":[{"key":"remote_address","value":%q}]}]}`, ip)
	r, err := c.hc.Post("http://"+c.addr+"/v1/check", "application/json", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	var resp struct {
		OverallCode string `json:"overallCode"`
	}
	if err := json.Unmarshal(b, &resp); err != nil || (r.StatusCode != 200 && r.StatusCode != 429) {
		return "", fmt.Errorf("check of %s: status %d: %s", ip, r.StatusCode, b)
	}
	return resp.OverallCode, nil
}

// within waits up to d for ip's check to answer want and returns how long
// that took.
func (c *checker) within(d time.Duration, ip, want string) time.Duration {
	c.t.Helper()
	start := time.Now()
	var got string
	var err error
	for time.Since(start) < d {
		if got, err = c.code(ip); err == nil && got == want {
			return time.Since(start)
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.t.Fatalf("%s: %s (%v) after %v, want %s", ip, got, err, d, want)
	return 0
}

// TestCrowdSecBouncer (issue 37's must-show): Debian's CrowdSec Local API
// on loopback with a throwaway configuration and database; `sluice
// crowdsec` follows it as a bouncer and `sluice serve` (the same region's
// Redis) enforces its decisions: cscli's --ip ... --duration 2m ban and a
// range ban are denied within a few seconds, a captcha gets --limit's
// rate, a Country decision is counted and logged; then the Local API is
// stopped for -crowdsec.outage (60 s) while checks go on: none fails, the
// bans stay enforced; once it is back the stream resumes, new decisions
// arrive and no rule is duplicated or rewritten; deleted decisions stop
// being denied within a few seconds.
//
// It runs in parallel with TestCrowdSecAlertsFromReplay, whose replay
// takes most of the outage's minute under the race detector.
func TestCrowdSecBouncer(t *testing.T) {
	t.Parallel()
	lapi := crowdsectest.New(t)
	key := lapi.AddBouncer("sluice")
	redisAddr := redistest.Addr(t)
	dir := t.TempDir()
	rulesPath := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesPath, []byte("domain: cs\nrules: [{id: per-ip, match: [{key: client_ip}], limit: 100000, period: 1s}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, httpAddr, _ := serve(t, "--redis", redisAddr, "--rules", rulesPath)
	metrics, log := crowdsecBouncer(t, key, "--lapi", lapi.URL(), "--region", "local="+redisAddr,
		"--interval", "1s", "--retry-max", "2s", "--resync", "5s", "--limit", "captcha=2/1m")
	c := &checker{t: t, addr: httpAddr, hc: &http.Client{Timeout: 5 * time.Second}}
	cscli := func(args ...string) {
		t.Helper()
		if _, err := lapi.Cscli(args...); err != nil {
			t.Fatal(err)
		}
	}
	for _, ip := range []string{"192.0.2.7", "198.51.100.77", "203.0.113.1"} {
		if got, err := c.code(ip); err != nil || got != "OK" {
			t.Fatalf("before any decision, %s: %s %v", ip, got, err)
		}
	}

	cscli("decisions", "add", "--ip", "192.0.2.7", "--duration", "2m")
	cscli("decisions", "add", "--range", "198.51.100.0/24", "--duration", "2m")
	cscli("decisions", "add", "--ip", "2001:db8::5", "--type", "captcha", "--duration", "2m")
	cscli("decisions", "add", "--scope", "Country", "--value", "FR", "--duration", "2m")
	t.Logf("the ban of 192.0.2.7 denied after %v", c.within(10*time.Second, "192.0.2.7", "OVER_LIMIT"))
	t.Logf("the range 198.51.100.0/24 denied after %v", c.within(10*time.Second, "198.51.100.77", "OVER_LIMIT"))
	if got, err := c.code("203.0.113.1"); err != nil || got != "OK" {
		t.Errorf("an address without a decision: %s %v", got, err)
	}
	// The captcha: 2 a minute for its /64, then denied.
	c.within(10*time.Second, "2001:db8::5", "OVER_LIMIT")
	if got, _ := c.code("2001:db8::77"); got != "OVER_LIMIT" {
		t.Errorf("another address of the captcha's /64: %s, want OVER_LIMIT (its 2 a minute are spent)", got)
	}
	if got, _ := c.code("2001:db8:1::5"); got != "OK" {
		t.Errorf("an address of another /64: %s", got)
	}
	if n := scrape(t, metrics, `sluice_crowdsec_decisions_refused_total{reason="scope"}`); n != 1 {
		t.Errorf("decisions refused for their scope: %v, want 1 (Country FR)", n)
	}
	if !strings.Contains(log.String(), "scope=Country value=FR") {
		t.Errorf("the Country decision is not logged:\n%s", log)
	}
	rulesBefore := crowdsecRules(t, redisAddr)
	if len(rulesBefore) != 3 {
		t.Fatalf("CrowdSec rules in Redis: %v, want 3", rulesBefore)
	}

	// The Local API stopped: every check answers, the bans hold.
	lapi.Stop()
	stopped := time.Now()
	var checks, failed int
	for time.Since(stopped) < *crowdsecOutage {
		for ip, want := range map[string]string{"192.0.2.7": "OVER_LIMIT", "198.51.100.9": "OVER_LIMIT", "203.0.113.1": "OK"} {
			checks++
			if got, err := c.code(ip); err != nil || got != want {
				failed++
				if failed <= 5 {
					t.Errorf("%v into the outage, %s: %s %v, want %s", time.Since(stopped).Round(time.Millisecond), ip, got, err, want)
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	errs := scrape(t, metrics, "sluice_crowdsec_stream_errors_total")
	age := scrape(t, metrics, "sluice_crowdsec_stream_age_seconds")
	t.Logf("Local API down %v: %d checks, %d not as wanted; %v failed pulls, stream age %.0f s", time.Since(stopped).Round(time.Second), checks, failed, errs, age)
	if errs < 3 || age < crowdsecOutage.Seconds()-5 {
		t.Errorf("during the outage: %v failed pulls, stream age %v s; want the failures counted and the age grown", errs, age)
	}

	// Back: the stream resumes without rewriting or duplicating a rule.
	if err := lapi.Start(); err != nil {
		t.Fatal(err)
	}
	cscli("decisions", "add", "--ip", "192.0.2.8", "--duration", "2m")
	t.Logf("a decision made after the outage denied after %v", c.within(30*time.Second, "192.0.2.8", "OVER_LIMIT"))
	after := crowdsecRules(t, redisAddr)
	if len(after) != 4 {
		t.Errorf("CrowdSec rules after the outage: %v, want the 3 before and 192.0.2.8's", after)
	}
	for id, exp := range rulesBefore {
		if after[id] != exp {
			t.Errorf("rule %s: expires %s after the outage, %s before: rewritten", id, after[id], exp)
		}
	}
	if n := scrape(t, metrics, `sluice_crowdsec_rules_updated_total{region="local"}`); n != 0 {
		t.Errorf("rules rewritten: %v, want 0", n)
	}
	if n := scrape(t, metrics, `sluice_crowdsec_rules_applied_total{region="local"}`); n != 4 {
		t.Errorf("rules applied: %v, want 4 (one write each)", n)
	}

	// Deleted decisions are no longer denied.
	cscli("decisions", "delete", "--ip", "192.0.2.7")
	cscli("decisions", "delete", "--range", "198.51.100.0/24")
	t.Logf("192.0.2.7 allowed again after %v", c.within(10*time.Second, "192.0.2.7", "OK"))
	c.within(10*time.Second, "198.51.100.77", "OK")
	if got, _ := c.code("192.0.2.8"); got != "OVER_LIMIT" {
		t.Errorf("192.0.2.8, whose decision stays: %s", got)
	}
}

// crowdsecRules returns the bouncer's rules in the Redis at addr: id →
// expiry.
func crowdsecRules(t *testing.T, addr string) map[string]string {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	ds, err := store.NewStore(rdb).Dynamic(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, d := range ds {
		if strings.HasPrefix(d.Origin, "crowdsec/") {
			out[d.ID] = d.ExpiresAt.Format(time.RFC3339Nano)
		}
	}
	return out
}

// TestCrowdSecAlertsFromReplay (issue 37's must-show): the heavy hitter of
// sluice replay's generated scenario, pushed with --crowdsec-alerts as
// machine "sluice", is in cscli alerts list (with -a: CrowdSec 1.4 lists
// alerts without a decision only so), with its scenario, source and count.
func TestCrowdSecAlertsFromReplay(t *testing.T) {
	t.Parallel()
	lapi := crowdsectest.New(t)
	pw := secretFile(t, lapi.AddMachine("sluice"))
	log := new(syncbuf.Buffer)
	root := newRoot()
	root.SetArgs([]string{"replay", "--duration", "2m", "--crowdsec-alerts", lapi.URL(), "--crowdsec-password-file", pw})
	root.SetErr(log)
	var out strings.Builder
	root.SetOut(&out)
	if err := root.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("replay: %v\n%s", err, log)
	}
	if !strings.Contains(out.String(), "dyn-hh-d029a61f2644c417 (detector/heavy-hitter)") || !strings.Contains(log.String(), "sent=1 dropped=0 refused=0") {
		t.Fatalf("the replay's heavy hitter was not pushed:\n%s\n%s", out.String(), log)
	}
	human, err := lapi.Cscli("alerts", "list", "-a")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`Ip:198\.51\.100\.250\s*\|\s*sluice/heavy-hitter`).MatchString(human) {
		t.Errorf("cscli alerts list -a:\n%s", human)
	}
	js, err := lapi.Cscli("alerts", "list", "-a", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var as []struct {
		Scenario    string `json:"scenario"`
		MachineID   string `json:"machine_id"`
		EventsCount int    `json:"events_count"`
		Simulated   bool   `json:"simulated"`
		Source      struct{ Scope, Value string }
	}
	if err := json.Unmarshal([]byte(js), &as); err != nil {
		t.Fatalf("%v: %s", err, js)
	}
	if len(as) != 1 || as[0].Scenario != "sluice/heavy-hitter" || as[0].MachineID != "sluice" || as[0].EventsCount != 76 ||
		!as[0].Simulated || as[0].Source.Scope != "Ip" || as[0].Source.Value != "198.51.100.250" {
		t.Errorf("alerts: %+v", as)
	}
}

// TestCrowdSecFlags: a credential comes from its file, trimmed, else from
// the environment; an empty or missing file is an error that names the
// file, not its content; flags that cannot work are refused with the fix.
func TestCrowdSecFlags(t *testing.T) {
	t.Setenv("CROWDSEC_API_KEY", " from-env \n")
	if s, err := secret("", "--api-key-file", "CROWDSEC_API_KEY"); s != "from-env" || err != nil {
		t.Errorf("from the environment: %q %v", s, err)
	}
	if s, err := secret(secretFile(t, "from-file"), "--api-key-file", "CROWDSEC_API_KEY"); s != "from-file" || err != nil {
		t.Errorf("from a file: %q %v", s, err)
	}
	empty := secretFile(t, "  ")
	if _, err := secret(empty, "--api-key-file", "CROWDSEC_API_KEY"); err == nil || !strings.Contains(err.Error(), empty) {
		t.Errorf("an empty file: %v", err)
	}
	if _, err := secret("/nonexistent/key", "--api-key-file", "CROWDSEC_API_KEY"); err == nil {
		t.Error("a missing file: no error")
	}
	// Flags the command refuses, before it contacts anything.
	t.Setenv("CROWDSEC_API_KEY", "")
	base := []string{"crowdsec", "--lapi", "http://127.0.0.1:1", "--region", "r=127.0.0.1:1"}
	key := secretFile(t, "k")
	for _, c := range []struct {
		args []string
		want string
	}{
		{base, "--api-key-file FILE or $CROWDSEC_API_KEY"},
		{[]string{"crowdsec", "--region", "r=127.0.0.1:1"}, "--lapi is required"},
		{[]string{"crowdsec", "--lapi", "http://127.0.0.1:1", "--api-key-file", key}, "--region is required"},
		{append(base, "--api-key-file", key, "--region", "r=127.0.0.1:2"), "--region r is given twice"},
		{append(base, "--api-key-file", key, "--region", "127.0.0.1:2"), "want NAME=HOST:PORT"},
		{append(base, "--api-key-file", key, "--limit", "ban=1/1m"), "a ban denies"},
		{append(base, "--api-key-file", key, "--limit", "captcha=0/1m"), "N >= 1"},
		{append(base, "--api-key-file", key, "--limit", "captcha"), "want TYPE=N/PERIOD"},
		{append(base, "--api-key-file", key, "--default-limit", "10/0s"), "--default-limit"},
		{append(base, "--api-key-file", key, "--ipv6-prefix", "129"), "--ipv6-prefix 129"},
		{append(base, "--api-key-file", key, "--max-rules", "0"), "--max-rules 0"},
		{[]string{"crowdsec", "--lapi", "http://user:hunter2@127.0.0.1:1", "--region", "r=127.0.0.1:1", "--api-key-file", key, "--metrics", ""}, "carries a user or password"},
	} {
		root := newRoot()
		root.SetArgs(c.args)
		root.SetErr(io.Discard)
		err := root.Execute()
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%v: %v, want an error with %q", c.args[1:], err, c.want)
		}
	}
}
