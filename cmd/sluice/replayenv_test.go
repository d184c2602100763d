package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/redistest"
)

// TestReplayNeedsRedisOnTheCommandLine: found by a fresh user. With
// REDIS_ADDR exported for sluice serve (the README's production section),
// the quick start's `sluice replay` flushed that Redis: its keys, its rule
// set. A replay and an eval now refuse a Redis named by the environment
// alone, naming the variable and what to do, and touch nothing; --redis on
// the command line confirms it.
func TestReplayNeedsRedisOnTheCommandLine(t *testing.T) {
	rdb := redistest.Server(t)
	ctx := context.Background()
	if err := rdb.Set(ctx, "important", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	addr := rdb.Options().Addr
	t.Setenv("REDIS_ADDR", addr)
	for _, args := range [][]string{{"replay", "--duration", "1m"}, {"eval", "--orders", "1", "--scenarios", "botnet"}} {
		var errOut strings.Builder
		root := newRoot()
		root.SetArgs(args)
		root.SetOut(io.Discard)
		root.SetErr(&errOut)
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		err := root.ExecuteContext(cctx)
		cancel()
		if err == nil || !strings.Contains(err.Error(), "REDIS_ADDR") || !strings.Contains(err.Error(), "--redis") {
			t.Errorf("%v with REDIS_ADDR=%s only: %v, want a refusal naming REDIS_ADDR and --redis", args, addr, err)
		}
		if n, err := rdb.Exists(ctx, "important").Result(); err != nil || n != 1 {
			t.Fatalf("%v: the key in REDIS_ADDR's Redis is gone (%v): it was flushed", args, err)
		}
	}
}
