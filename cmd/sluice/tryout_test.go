package main

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestTryOutBudget: `sluice serve` with no Redis (the README's try-out)
// says at start that it gives the in-process Redis a budget of a second,
// and the README's check answers 429 from Redis after the example rule's
// burst of 20, also while the machine is busy (goroutines spinning on every
// core here), where the sidecar's 10 ms budget let most checks fall to the
// failure mode (fail-open: 200, never 429). --budget still wins.
func TestTryOutBudget(t *testing.T) {
	unsetenv(t, "REDIS_ADDR")
	log := runCommand(t, []string{"serve", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--admin-http", "127.0.0.1:0", "--drain-delay", "0s"}, "sluice sidecar stopped")
	var addr string
	for deadline := time.Now().Add(30 * time.Second); addr == ""; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("serve did not start within 30 s:\n%s", log)
		}
		if m := regexp.MustCompile(`http=(127\.0\.0\.1:\d+)`).FindStringSubmatch(log.String()); m != nil {
			addr = m[1]
		}
	}
	if !strings.Contains(log.String(), "in-process Redis") || !strings.Contains(log.String(), "budget of 1s") {
		t.Errorf("the start does not say the try-out's budget:\n%s", log)
	}
	// Found by a fresh user: /readyz said "redis: ok" with no word of the
	// in-process Redis, which counts for this sidecar alone.
	if r, err := http.Get("http://" + addr + "/readyz"); err != nil {
		t.Error(err)
	} else {
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if !strings.Contains(string(b), "redis: ok, in-process") {
			t.Errorf("/readyz does not say the Redis is in-process:\n%s", b)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for ctx.Err() == nil {
			}
		})
	}
	// 60 checks of one address at once: the burst of 20 and what refills
	// meanwhile (10 a second) pass, the rest are denied; every answer is
	// Redis's (a degraded one has no RateLimit header).
	var mu sync.Mutex
	var allowed, denied, degraded int
	var checks sync.WaitGroup
	for range 60 {
		checks.Go(func() {
			r, err := http.Post("http://"+addr+"/v1/check", "application/json", strings.NewReader(
				`{"domain":"sluice","descriptors":[{"entries":[{"key":"remote_address","value":"192.0.2.1"}]}]}`))
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, r.Body)
			r.Body.Close()
			mu.Lock()
			defer mu.Unlock()
			switch {
			case r.Header.Get("Ratelimit") == "":
				degraded++
			case r.StatusCode == http.StatusTooManyRequests:
				denied++
			default:
				allowed++
			}
		})
	}
	checks.Wait()
	cancel()
	wg.Wait()
	if degraded > 0 || allowed < 20 || denied == 0 {
		t.Errorf("60 checks of one address at once on a busy machine: %d allowed, %d denied by Redis, %d degraded; want none degraded, the burst of 20 allowed and the rest denied",
			allowed, denied, degraded)
	}

	log = runCommand(t, []string{"serve", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--admin-http", "127.0.0.1:0", "--drain-delay", "0s", "--budget", "50ms"}, "sluice sidecar stopped")
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(log.String(), "in-process Redis"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("serve did not start within 30 s:\n%s", log)
		}
	}
	if !strings.Contains(log.String(), "budget of 50ms") {
		t.Errorf("--budget 50ms is not the budget said at start:\n%s", log)
	}
}

// TestEmptyRedisAddressRefused: found by a fresh user. An address given
// empty (--redis ”, REDIS_ADDR="": a template's unset variable) started
// serve on an in-process Redis, each pod counting alone, with one warning.
// It is refused, as an address of blanks was.
func TestEmptyRedisAddressRefused(t *testing.T) {
	for _, c := range []struct {
		name, env string
		args      []string
		want      string
	}{
		{"--redis ''", "unset", []string{"--redis", ""}, "--redis is empty"},
		{"REDIS_ADDR=''", "", nil, "REDIS_ADDR is set but empty"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.env == "unset" {
				unsetenv(t, "REDIS_ADDR")
			} else {
				t.Setenv("REDIS_ADDR", c.env)
			}
			root := newRoot()
			root.SetArgs(append([]string{"serve", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--admin-http", ""}, c.args...))
			root.SetOut(io.Discard)
			root.SetErr(io.Discard)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := root.ExecuteContext(ctx); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("serve %v with REDIS_ADDR %q: %v, want an error saying %q", c.args, c.env, err, c.want)
			}
		})
	}
}
