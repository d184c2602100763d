package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// deploy/local/up starts a two-region stack on loopback; checks sent to a
// region's enforcer are decided (one API key's bucket is its global limit's
// static split: 20 allowed at once, then one every 100 ms; checkTokenBucket
// bounds the refill by the answers' times), logged to Kafka, consumed by the
// pipeline and written to the stack's ClickHouse, whose report names the
// denied key;
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

	// Bursts of checks of a fresh API key (and client address) to the
	// first region's enforcer, until 5 are denied. A burst with a degraded
	// answer (the failure modes decided: Redis missed the 10 ms budget, as
	// it may on a loaded machine; docs/enforcement.md) counts nothing
	// exact, so another key's burst is sent, at most twice.
	var key string
	var answers []checkAnswer
	sent, degraded := 0, 0
	for attempt := 1; ; attempt++ {
		key = "k" + strconv.Itoa(attempt)
		answers = checkUntilDenied(t, fmt.Sprintf("http://127.0.0.1:%d/v1/check", base+200), key, fmt.Sprintf("192.0.2.%d", attempt), 5)
		sent += len(answers)
		n := 0
		for _, a := range answers {
			if a.degraded() {
				n++
			}
		}
		degraded += n
		if n == 0 {
			break
		}
		if attempt == 3 {
			t.Fatalf("every burst had degraded answers: the last, %d of %d", n, len(answers))
		}
		t.Logf("%d of api_key=%s's %d answers were degraded: another key", n, key, len(answers))
	}
	// Every degraded answer, and no other decision, is counted as one.
	if body, want := get(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", base+400)), fmt.Sprintf("\nsluice_enforcer_degraded_decisions_total %d\n", degraded); !strings.Contains(body, want) {
		t.Errorf("the enforcer's metrics have no %q:\n%s", strings.TrimSpace(want), grepLines(body, "sluice_enforcer_degraded"))
	}
	// per-api-key: limit 20/s and burst 40 globally, 1/2 of each per
	// region without a share (the static split): a bucket of 20 tokens
	// that gains one every 100 ms.
	for i, a := range answers {
		if !a.degraded() && (a.rule != "per-api-key" || a.perUnit != 10 || a.unit != "SECOND") {
			t.Errorf("answer %d binds %s at %d per %s, want per-api-key at 10 per SECOND (the static split)", i+1, a.rule, a.perUnit, a.unit)
		}
	}
	checkTokenBucket(t, answers, 20, 100*time.Millisecond)
	deadline := time.Now().Add(30 * time.Second)
	for metric := fmt.Sprintf(`sluice_pipeline_records_in_total{stage="decode"} %d`+"\n", sent); ; {
		body := get(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", base+1))
		if strings.Contains(body, metric) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pipeline did not decode the %d decision records within 30 s", sent)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The decisions reach ClickHouse: the report names the key denied 5
	// times, in one region.
	row := regexp.MustCompile(`(?m)^api_key=` + key + `\s+per-api-key\s+5\s+1\s`)
	deadline = time.Now().Add(60 * time.Second)
	for {
		out, err := runErr(filepath.Join(dir, "sluice"), "report", "top_denied_keys", "--clickhouse", "127.0.0.1:"+strconv.Itoa(base+2))
		if err == nil && row.MatchString(out) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no report of api_key=%s denied 5 times from the stack's ClickHouse within 60 s: %v\n%s", key, err, out)
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

// checkAnswer is one answer of an enforcer's /v1/check: its status code,
// when it was sent and received, and the binding limit its first status
// names (rule "" when the answer carries no counts: degraded).
type checkAnswer struct {
	code       int
	sent, got  time.Time
	rule, unit string
	perUnit    uint32
}

// degraded reports whether the failure modes decided the answer: a
// degraded decision has no counts, so its status names no current limit.
func (a checkAnswer) degraded() bool { return a.rule == "" }

// checkUntilDenied posts checks of API key key from client address ip to
// url, one after the other, until denials of them are denied (at most 100
// checks), and returns the answers in order.
func checkUntilDenied(t *testing.T, url, key, ip string, denials int) []checkAnswer {
	t.Helper()
	body := fmt.Sprintf(`{"domain":"replay","descriptors":[{"entries":[{"key":"api_key","value":%q},{"key":"client_ip","value":%q}]}]}`, key, ip)
	var answers []checkAnswer
	for denied := 0; denied < denials; {
		if len(answers) == 100 {
			t.Fatalf("%d of 100 checks of api_key=%s denied, want %d", denied, key, denials)
		}
		a := checkAnswer{sent: time.Now()}
		resp, err := http.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		a.got, a.code = time.Now(), resp.StatusCode
		if err != nil {
			t.Fatal(err)
		}
		var r struct {
			Statuses []struct {
				CurrentLimit *struct {
					Name            string `json:"name"`
					RequestsPerUnit uint32 `json:"requestsPerUnit"`
					Unit            string `json:"unit"`
				} `json:"currentLimit"`
			} `json:"statuses"`
		}
		if err := json.Unmarshal(b, &r); err != nil || len(r.Statuses) != 1 {
			t.Fatalf("answer %d: %d %s: %v", len(answers)+1, a.code, b, err)
		}
		if l := r.Statuses[0].CurrentLimit; l != nil {
			a.rule, a.perUnit, a.unit = l.Name, l.RequestsPerUnit, l.Unit
		}
		switch a.code {
		case http.StatusOK:
		case http.StatusTooManyRequests:
			denied++
		default:
			t.Fatalf("answer %d: %d %s", len(answers)+1, a.code, b)
		}
		answers = append(answers, a)
	}
	return answers
}

// checkTokenBucket checks answers, in the order sent, against a token
// bucket that starts full, with burst whole tokens, at the first decision
// (a fresh key) and gains one every per, lazily, by Redis's clock (whole ms:
// enforcer/decide.lua). A decision was made between its answer's sent and
// got, so by the i-th answer the bucket gained at most (got_i − sent_1)/per
// tokens, and the i-th was allowed only if the allowed answers so far are
// at most burst plus that. A denial means less than a token was left: the
// allowed answers before it are at least burst, plus the tokens gained by
// then, at least (sent_i − got_1)/per, as long as the bucket cannot have
// refilled to full since the first decision (it would then have dropped
// the excess). Each bound has 2 ms of slack: Redis's clock in whole ms,
// and the test's against Redis's. On a quiet machine, whose answers come
// within per of the first, the bounds are exact: the first burst allowed,
// every later one denied.
func checkTokenBucket(t testing.TB, answers []checkAnswer, burst int, per time.Duration) {
	t.Helper()
	const slack = 2 * time.Millisecond
	first := answers[0]
	allowed, full := 0, false
	for i, a := range answers {
		most := time.Duration(allowed) * per // the gain that refills the bucket to full
		if i > 0 && a.got.Sub(first.sent)+slack >= most {
			full = true
		}
		if a.code == http.StatusOK {
			allowed++
			if hi := burst + int((a.got.Sub(first.sent)+slack)/per); allowed > hi {
				t.Errorf("answer %d, %v after the first was sent: %d allowed, want at most %d (a burst of %d, one more every %v)",
					i+1, a.got.Sub(first.sent), allowed, hi, burst, per)
			}
			continue
		}
		lo := burst // since the bucket was last full, burst were taken
		if !full {
			lo += int(max(0, a.sent.Sub(first.got)-slack) / per)
		}
		if allowed < lo {
			t.Errorf("answer %d, sent %v after the first came: denied after %d allowed, want at least %d (a burst of %d, one more every %v)",
				i+1, a.sent.Sub(first.got), allowed, lo, burst, per)
		}
	}
	t.Logf("%d of %d answers allowed in %v (a burst of %d, one more every %v)", allowed, len(answers), answers[len(answers)-1].got.Sub(first.sent), burst, per)
}

// errRecorder is a testing.TB that keeps its Errorf messages.
type errRecorder struct {
	testing.TB
	errs []string
}

func (r *errRecorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// checkTokenBucket fails answers that allow more than the bucket holds, or
// deny while it still holds a token, and passes a refill it bounds.
func TestCheckTokenBucket(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	// answers: codes sent every gap, each answered 1 ms later; codes: n
	// codes, the first allowedAt of them 200, the others 429.
	answers := func(gap time.Duration, cs ...int) []checkAnswer {
		var as []checkAnswer
		for i, c := range cs {
			s := t0.Add(time.Duration(i) * gap)
			as = append(as, checkAnswer{code: c, sent: s, got: s.Add(time.Millisecond), rule: "r"})
		}
		return as
	}
	codes := func(n, allowedAt int) []int {
		cs := make([]int, n)
		for i := range cs {
			cs[i] = http.StatusTooManyRequests
			if i < allowedAt {
				cs[i] = http.StatusOK
			}
		}
		return cs
	}
	for _, c := range []struct {
		name  string
		as    []checkAnswer
		fails bool
	}{
		{"quiet: 20 allowed, 5 denied", answers(2*time.Millisecond, codes(25, 20)...), false},
		{"quiet: a 21st allowed", answers(2*time.Millisecond, codes(25, 21)...), true},
		{"quiet: the 20th denied", answers(2*time.Millisecond, codes(25, 19)...), true},
		{"a 21st allowed 100 ms on", answers(5*time.Millisecond, codes(25, 21)...), false},
		{"a 22nd allowed before 200 ms", answers(5*time.Millisecond, codes(25, 22)...), true},
		{"denied 250 ms on after 20", append(answers(2*time.Millisecond, codes(20, 20)...),
			checkAnswer{code: http.StatusTooManyRequests, sent: t0.Add(250 * time.Millisecond), got: t0.Add(251 * time.Millisecond)}), true},
	} {
		r := &errRecorder{TB: t}
		checkTokenBucket(r, c.as, 20, 100*time.Millisecond)
		if fails := len(r.errs) > 0; fails != c.fails {
			t.Errorf("%s: errors %q, want failing %v", c.name, r.errs, c.fails)
		}
	}
}
