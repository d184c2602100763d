package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluice-rl/sluice/internal/redistest"
)

// startServe runs runServe with c until the test ends and returns its HTTP
// address, or the error it returned before listening.
func startServe(t *testing.T, c serveConfig) (string, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	a, done, err := serveAsync(t, ctx, c)
	if err != nil {
		cancel()
		return "", err
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("runServe: %v", err)
		}
	})
	return a[1].String(), nil
}

// TestServeChecksWhatRedisIs (issue 20, items 3 and 11; kgateway #6577): at
// start every --redis address is asked what it is, and a mismatch with the
// flags is refused with the flag that fixes it: a Cluster node without
// --redis-cluster, a single node with it, a Sentinel or a replica as a plain
// address, a non-Sentinel with --redis-sentinel, a Sentinel without that
// master. Before, each started and said "redis: ok" while decisions degraded.
func TestServeChecksWhatRedisIs(t *testing.T) {
	node := redistest.ClusterAddrs(t)[0]
	single := redistest.Addr(t)
	g := redistest.NewSentinelGroup(t)
	for _, c := range []struct {
		name string
		cfg  serveConfig
		want string // in the error; "" starts
	}{
		{"cluster node as a single node", serveConfig{Redis: []string{node}}, "add --redis-cluster"},
		{"cluster node with --redis-cluster", serveConfig{Redis: []string{node}, RedisCluster: true}, ""},
		{"single node with --redis-cluster", serveConfig{Redis: []string{single}, RedisCluster: true}, "without --redis-cluster"},
		{"sentinel as a single node", serveConfig{Redis: []string{g.Sentinel}}, "add --redis-sentinel MASTER (it monitors [\"sluice\"])"},
		{"replica as a single node", serveConfig{Redis: []string{g.Replica}}, "is a replica (of " + g.Master + ")"},
		{"single node with --redis-sentinel", serveConfig{Redis: []string{single}, RedisSentinel: "sluice"}, "is not a Redis Sentinel"},
		{"another master's name", serveConfig{Redis: []string{g.Sentinel}, RedisSentinel: "other"}, "--redis-sentinel other: the Sentinel at " + g.Sentinel + " does not monitor that master"},
		{"--redis-sentinel with --redis-cluster", serveConfig{Redis: []string{g.Sentinel}, RedisSentinel: "sluice", RedisCluster: true}, "no --redis-cluster"},
		{"sentinel with --redis-sentinel", serveConfig{Redis: []string{g.Sentinel}, RedisSentinel: "sluice"}, ""},
		{"single node", serveConfig{Redis: []string{single}}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := startServe(t, c.cfg)
			switch {
			case c.want == "" && err != nil:
				t.Errorf("runServe: %v, want it to start", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Errorf("runServe: %v, want an error with %q", err, c.want)
			}
		})
	}
}

// TestServeSentinelFailover (issue 20, item 11): `sluice serve --redis
// <sentinel> --redis-sentinel sluice` follows a Sentinel failover: within
// 5 s of its start, checks are decided by Redis again, exactly (each
// Redis-decided check takes one from the same counter, which the promoted
// replica holds), and none is degraded after that (no READONLY from the
// demoted master).
func TestServeSentinelFailover(t *testing.T) {
	g := redistest.NewSentinelGroup(t)
	dir := t.TempDir()
	path := dir + "/rules.yaml"
	if err := os.WriteFile(path, []byte("domain: s\nrules: [{id: per-user, match: [{key: user}], limit: 100000, period: 1h, algorithm: fixed_window}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := serveConfig{Redis: []string{g.Sentinel}, RedisSentinel: "sluice", RulesFile: path}
	c.Limiter.Budget = 50 * time.Millisecond
	httpAddr, err := startServe(t, c)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: 5 * time.Second}
	// remaining returns the check's remaining count, or -1 when the failure
	// mode decided it (no current_limit).
	remaining := func() int64 {
		r, err := hc.Post("http://"+httpAddr+"/v1/check", "application/json",
			strings.NewReader(`{"domain":"s","descriptors":[{"entries":[{"key":"user","value":"u"}]}]}`))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		var resp struct {
			Statuses []struct {
				CurrentLimit   *struct{} `json:"currentLimit"`
				LimitRemaining int64     `json:"limitRemaining"`
			} `json:"statuses"`
		}
		if err := json.NewDecoder(r.Body).Decode(&resp); err != nil || len(resp.Statuses) != 1 {
			t.Fatalf("check: %d %v %v", r.StatusCode, resp, err)
		}
		if resp.Statuses[0].CurrentLimit == nil {
			return -1
		}
		return resp.Statuses[0].LimitRemaining
	}
	last := int64(100000)
	// exact reports whether Redis decided the check; with strict, it must
	// have taken one from the counter the previous one left.
	exact := func(when string, strict bool) bool {
		got := remaining()
		if got < 0 {
			return false
		}
		if strict && got != last-1 {
			t.Errorf("%s: remaining %d after %d: not exact", when, got, last)
		}
		last = got
		return true
	}
	for range 20 {
		if !exact("before the failover", true) {
			t.Fatal("a check degraded before the failover")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	failed := make(chan error, 1)
	go func() { failed <- g.Failover(ctx) }()
	// Checks go on during the failover. Between the promotion and the old
	// master's demotion both take writes (SENTINEL FAILOVER does not stop the
	// old one), so a check there may count on the master being left: not
	// asserted.
	var promoted, lastDegraded time.Duration
	degraded := 0
	for time.Since(start) < 5*time.Second {
		if !exact("during the switch", false) {
			degraded++
			lastDegraded = time.Since(start)
		}
		if promoted == 0 {
			select {
			case err := <-failed:
				if err != nil {
					t.Fatal(err)
				}
				promoted = time.Since(start)
			default:
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	if promoted == 0 {
		t.Fatal("the failover did not end within 5 s")
	}
	t.Logf("the failover took %v; %d checks degraded in the 5 s after its start, the last %v after it; remaining %d", promoted, degraded, lastDegraded, last)
	for range 200 {
		if !exact("5 s after the failover began", true) {
			t.Fatal("a check degraded more than 5 s after the failover began (READONLY from the old master?)")
		}
	}
}

// TestMaxClientsSaid: found by a fresh user. A Redis at its maxclients
// answers a new connection with "ERR max number of clients reached" and
// closes it; serve logged, and /readyz showed, only the write that met the
// closed socket ("write: broken pipe", cause unreachable).
func TestMaxClientsSaid(t *testing.T) {
	addr := redistest.Addr(t)
	hold := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1, MaxRetries: -1})
	t.Cleanup(func() { hold.Close() })
	// maxclients 1: the connection that sets it is the only one Redis keeps.
	if err := hold.ConfigSet(context.Background(), "maxclients", "1").Err(); err != nil {
		t.Fatal(err)
	}
	_, httpAddr, log := serve(t, "--redis", addr)
	const said = "ERR max number of clients reached"
	if !strings.Contains(log.String(), said) {
		t.Errorf("serve's log does not say %q:\n%s", said, log)
	}
	resp, err := http.Get("http://" + httpAddr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), "redis closes new connections: "+said) {
		t.Errorf("/readyz does not say %q: %d %s", said, resp.StatusCode, body)
	}
}
