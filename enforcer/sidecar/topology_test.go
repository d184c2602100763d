package sidecar_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/enforcer/sidecar"
	"github.com/sluice-rl/sluice/internal/redistest"
)

// TestMovedMakesTheSidecarUnready (issue 20, item 3; kgateway #6577): a
// node of a 3-master Cluster given to the limiter as a single node answers
// MOVED for the other masters' slots. The first MOVED makes the sidecar
// unready (/readyz names the flag, gRPC health NOT_SERVING), also without
// RequireRedis, and every one is counted. Before, /readyz said "redis: ok"
// while 2/3 of the decisions degraded for ever.
func TestMovedMakesTheSidecarUnready(t *testing.T) {
	node := redistest.ClusterAddrs(t)[0]
	rdb := redis.NewClient(&redis.Options{Addr: node, MaxRetries: -1, ContextTimeoutEnabled: true, DialerRetries: 1})
	t.Cleanup(func() { rdb.Close() })
	e := newEnv(t, rdb, testRules, sidecar.Options{Redis: rdb})
	if err := e.srv.Ready(context.Background()); err != nil {
		t.Fatalf("ready before any check: %v", err)
	}
	for i := range 30 {
		e.check(t, rlReq("t", desc("user", fmt.Sprint("u", i))))
	}
	moved := counter(t, e.reg, "sluice_enforcer_redis_moved_total")
	if moved < 5 {
		t.Fatalf("sluice_enforcer_redis_moved_total %v after 30 users' checks on one of 3 masters, want most of the 2/3 elsewhere counted", moved)
	}
	if err := e.srv.Ready(context.Background()); !errors.Is(err, enforcer.ErrMisrouted) {
		t.Errorf("Ready after MOVED replies: %v, want ErrMisrouted", err)
	}
	r, err := http.Get(e.http.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if r.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), "--redis-cluster") {
		t.Errorf("readyz after MOVED: %d %q, want 503 naming --redis-cluster", r.StatusCode, b)
	}
}
