package sidecar_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/enforcer/sidecar"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// TestReadyNeedsTheDecisionPath (issue 32): a Redis that answers PING but
// refuses the decision script (an ACL user without EVALSHA) is not "redis:
// ok": /readyz names the cause and the refused command, and with
// RequireRedis the sidecar is unready (ErrDecisionPath); the memory policy
// read on connect is shown too.
func TestReadyNeedsTheDecisionPath(t *testing.T) {
	pw := redistest.Password(t)
	s := redistest.WithACL(t, []string{"noeval on >" + pw + " ~* &* +@all -evalsha"}, "--maxmemory-policy", "volatile-lru")
	quiet := slog.New(slog.DiscardHandler)
	mem, err := enforcer.NewMemoryPolicy(enforcer.MemoryPolicyOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, Username: "noeval", Password: pw, MaxRetries: -1, ContextTimeoutEnabled: true, OnConnect: mem.OnConnect})
	t.Cleanup(func() { rdb.Close() })
	set, err := rules.Parse("t.yaml", []byte(testRules))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := enforcer.New(rdb, set, enforcer.Options{Budget: time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	probe, err := enforcer.NewProbe(rdb, enforcer.ProbeOptions{Memory: mem, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	strict, err := sidecar.New(lim, sidecar.Options{Redis: rdb, RequireRedis: true, Probe: probe, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	lenient, err := sidecar.New(lim, sidecar.Options{Redis: rdb, Probe: probe, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := strict.Ready(ctx); err != nil {
		t.Fatalf("ready before any probe: %v", err)
	}
	if err := probe.Check(ctx); enforcer.ClassifyRedisError(err) != enforcer.CauseNoPerm {
		t.Fatalf("probe without EVALSHA: %v, want NOPERM", err)
	}
	if err := strict.Ready(ctx); !errors.Is(err, sidecar.ErrDecisionPath) || !strings.Contains(err.Error(), "(noperm)") {
		t.Errorf("ready with RequireRedis and the script refused: %v, want ErrDecisionPath (noperm)", err)
	}
	if err := lenient.Ready(ctx); err != nil {
		t.Errorf("ready without RequireRedis: %v", err)
	}
	for _, c := range []struct {
		srv  *sidecar.Server
		code int
	}{{strict, http.StatusServiceUnavailable}, {lenient, http.StatusOK}} {
		rec := httptest.NewRecorder()
		c.srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		body, _ := io.ReadAll(rec.Body)
		if rec.Code != c.code {
			t.Errorf("/readyz: %d, want %d\n%s", rec.Code, c.code, body)
		}
		for _, want := range []string{
			"redis: the decision script fails (cause noperm): NOPERM this user has no permissions to run the 'evalsha' command; sluice's ACL user lacks a permission",
			"redis maxmemory-policy: volatile-lru: can evict live counters and reset limits: run noeviction\n",
		} {
			if !strings.Contains(string(body), want) {
				t.Errorf("/readyz lacks %q:\n%s", want, body)
			}
		}
		if strings.Contains(string(body), pw) {
			t.Errorf("/readyz holds the password:\n%s", body)
		}
	}
}

// TestPprofHidesTheCommandLine: with Pprof on, the profiles are served but
// not /debug/pprof/cmdline, which would print a password given on the
// command line (sluice serve --redis redis://user:PASSWORD@host).
func TestPprofHidesTheCommandLine(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(t)})
	t.Cleanup(func() { rdb.Close() })
	set, err := rules.Parse("t.yaml", []byte(testRules))
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	lim, err := enforcer.New(rdb, set, enforcer.Options{Budget: time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := sidecar.New(lim, sidecar.Options{Redis: rdb, Pprof: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	const secret = "hunter2-in-argv"
	defer func(args []string) { os.Args = args }(os.Args)
	os.Args = append(slices.Clone(os.Args), "--redis=redis://u:"+secret+"@127.0.0.1:6379")
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := get("/debug/pprof/cmdline"); code == http.StatusOK || strings.Contains(body, secret) {
		t.Errorf("/debug/pprof/cmdline: %d %q", code, body)
	}
	if code, _ := get("/debug/pprof/goroutine?debug=1"); code != http.StatusOK {
		t.Errorf("/debug/pprof/goroutine: %d, want the profile", code)
	}
	if code, body := get("/debug/pprof/symbol"); code != http.StatusOK || strings.Contains(body, secret) {
		t.Errorf("/debug/pprof/symbol: %d", code)
	}
}

// TestReadyzDoesNotWaitForRedis: found by a fresh user. While Redis was
// frozen, /readyz pinged it twice in a row (500 ms each) and concurrent
// probes queued behind each other: 1 to 2.5 s, past Kubernetes' default
// 1 s probe timeout, for a sidecar that stays ready by design. /readyz now
// answers from the kept answers and renews a stale one in the background;
// Ready, which the health update calls every --refresh, waits for it.
func TestReadyzDoesNotWaitForRedis(t *testing.T) {
	// Frozen: connections open, nothing answered.
	srv := sidecarWithBreakerOpen(t, redistest.Blackhole, sidecar.Options{})
	time.Sleep(150 * time.Millisecond) // the kept PING answer is stale now
	// Four probes at once, twice: waiting on a PING of the frozen Redis
	// would take its 500 ms timeout, twice in a row, and queue the others.
	for round := range 2 {
		took := make(chan time.Duration, 4)
		for range 4 {
			go func() {
				start := time.Now()
				rec := httptest.NewRecorder()
				srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
				took <- time.Since(start)
			}()
		}
		for range 4 {
			if d := <-took; d > 450*time.Millisecond {
				t.Errorf("round %d: /readyz took %v with Redis frozen, want it answered from the kept state (a PING waits 500 ms)", round, d)
			}
		}
	}
	// The health update waits for the renewed answer, which names the fault.
	if err := srv.Ready(context.Background()); err != nil {
		t.Errorf("ready without RequireRedis: %v, want ready", err)
	}
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if body := rec.Body.String(); rec.Code != http.StatusOK || !strings.Contains(body, "redis does not answer") {
		t.Errorf("/readyz after a renewed PING: %d, want 200 naming the silent Redis\n%s", rec.Code, body)
	}
}
