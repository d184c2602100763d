package enforcer_test

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

const usageRules = `domain: d
rules:
  - id: tb
    description: ten, then one a second
    match: [{key: api_key}]
    limit: 1
    period: 1s
    burst: 10
  - id: sw
    match: [{key: api_key}]
    algorithm: sliding_window
    limit: 12
    period: 1m
  - id: fw
    match: [{key: api_key}]
    algorithm: fixed_window
    limit: 15
    period: 1h
  - id: cc
    match: [{key: api_key}]
    algorithm: concurrency
    limit: 20
    lease: 30s
  - id: blocked
    match: [{key: api_key, value: banned}]
    limit: 0
    period: 1s
`

// snapshot returns every key in rdb with its value and TTL: what a read
// must leave as it was (TTLs only fall while nothing writes: see same).
func snapshot(t *testing.T, rdb redis.UniversalClient) []string {
	t.Helper()
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(keys)
	var out []string
	for _, k := range keys {
		var v any
		var err error
		switch typ := rdb.Type(ctx, k).Val(); typ {
		case "string":
			v, err = rdb.Get(ctx, k).Result()
		case "hash":
			v, err = rdb.HGetAll(ctx, k).Result()
		case "zset":
			v, err = rdb.ZRangeWithScores(ctx, k, 0, -1).Result()
		default:
			t.Fatalf("%s: type %s", k, typ)
		}
		if err != nil {
			t.Fatal(err)
		}
		ttl, err := rdb.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s %v\t%d", k, v, ttl.Milliseconds()))
	}
	return out
}

// same reports whether two snapshots hold the same keys and values, and no
// TTL grew (a write would have set it anew).
func same(before, after []string) bool {
	if len(before) != len(after) {
		return false
	}
	for i := range before {
		b, bt, _ := strings.Cut(before[i], "\t")
		a, at, _ := strings.Cut(after[i], "\t")
		bn, _ := strconv.ParseInt(bt, 10, 64)
		an, _ := strconv.ParseInt(at, 10, 64)
		if a != b || an > bn {
			return false
		}
	}
	return true
}

// TestUsageReadsWithoutCharging spends 7 units of every rule of one key on
// the caller's clock, then reads the key's usage 100 times: every rule
// reports what the last decision reported, and Redis holds the same keys,
// values and TTLs as before the reads (the script runs with EVALSHA_RO).
func TestUsageReadsWithoutCharging(t *testing.T) {
	backends(t, func(t *testing.T, rdb redis.UniversalClient) {
		l := newLimiter(t, rdb, usageRules)
		ctx := context.Background()
		now := at(500)
		key := rules.Descriptors{rules.KeyAPIKey: "k1"}
		var d enforcer.Decision
		for range 7 {
			if err := l.Decide(ctx, &enforcer.Request{Descriptors: key, Now: now}, &d); err != nil {
				t.Fatal(err)
			}
			if d.Outcome != decision.Allowed {
				t.Fatalf("%v: %+v", d.Outcome, d)
			}
			if err := l.Release(ctx, &d); err != nil { // each request's concurrency slot, at its end
				t.Fatal(err)
			}
		}
		want := map[string][2]int64{}
		for _, st := range d.Statuses {
			want[st.Rule.ID] = [2]int64{st.Remaining, st.Reset.Milliseconds()}
		}
		before := snapshot(t, rdb)
		var u *enforcer.Usage
		for range 100 {
			var err error
			if u, err = l.Usage(ctx, key, now); err != nil {
				t.Fatal(err)
			}
		}
		if after := snapshot(t, rdb); !same(before, after) {
			t.Errorf("Redis changed under 100 reads:\nbefore %q\nafter  %q", before, after)
		}
		got := map[string][2]int64{}
		for _, ru := range u.Rules {
			if ru.Err != nil {
				t.Fatalf("%s: %v", ru.Rule.ID, ru.Err)
			}
			got[ru.Rule.ID] = [2]int64{ru.Remaining, ru.Reset.Milliseconds()}
		}
		// The token bucket: 10 - 7 = 3 left, full again in 7 s; the sliding
		// window 12 - 7; the fixed window 15 - 7, reset at the hour's end;
		// concurrency: the last decision held one slot (19 left), released since.
		if want["cc"] != [2]int64{19, 0} {
			t.Errorf("the last decision's cc: %v", want["cc"])
		}
		want["cc"] = [2]int64{20, 0}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("usage %v, want the last decision's %v", got, want)
		}
		if got["tb"] != [2]int64{3, 7000} {
			t.Errorf("tb: %v, want 3 left and full in 7 s", got["tb"])
		}
		if u.Rules[0].Rule.Description != "ten, then one a second" || u.Rules[0].Limit != 10 || u.Rules[0].Window != 10*time.Second {
			t.Errorf("tb: %+v", u.Rules[0])
		}
		// A key never seen: full capacity, and nothing written for it.
		fresh, err := l.Usage(ctx, rules.Descriptors{rules.KeyAPIKey: "never-seen"}, now)
		if err != nil {
			t.Fatal(err)
		}
		for _, ru := range fresh.Rules {
			if ru.Remaining != ru.Limit || ru.Reset != 0 && ru.Rule.Algorithm != rules.FixedWindow {
				t.Errorf("unseen key, %s: remaining %d of %d, reset %v", ru.Rule.ID, ru.Remaining, ru.Limit, ru.Reset)
			}
		}
		if after := snapshot(t, rdb); !same(before, after) {
			t.Errorf("reading an unseen key wrote to Redis:\nbefore %q\nafter  %q", before, after)
		}
		// A blocking rule reports 0 without Redis.
		b, err := l.Usage(ctx, rules.Descriptors{rules.KeyAPIKey: "banned"}, now)
		if err != nil {
			t.Fatal(err)
		}
		if last := b.Rules[len(b.Rules)-1]; last.Rule.ID != "blocked" || last.Remaining != 0 || last.Limit != 0 {
			t.Errorf("blocked: %+v", last)
		}
	})
}

// TestUsageOnRedisTime reads with Redis's clock, as the sidecar does: the
// token bucket's remaining and reset after 7 of 10.
func TestUsageOnRedisTime(t *testing.T) {
	backends(t, func(t *testing.T, rdb redis.UniversalClient) {
		l := newLimiter(t, rdb, usageRules)
		ctx := context.Background()
		key := rules.Descriptors{rules.KeyAPIKey: "k2"}
		for range 7 {
			if _, err := l.Check(ctx, &enforcer.Request{Descriptors: key, Cost: 1}); err != nil {
				t.Fatal(err)
			}
		}
		u, err := l.Usage(ctx, key, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		tb := u.Rules[0]
		if tb.Err != nil {
			t.Fatal(tb.Err)
		}
		// Refilled by the time since the decisions: 3 whole tokens, and
		// less than 7 s to full, more than 6 s unless the test stalled a second.
		if tb.Remaining != 3 || tb.Reset > 7*time.Second || tb.Reset <= 5*time.Second {
			t.Errorf("tb: remaining %d, reset %v: want 3 and just under 7 s", tb.Remaining, tb.Reset)
		}
		if d := time.Since(u.Now); d > time.Minute || d < -time.Minute {
			t.Errorf("Now %v is not Redis's time", u.Now)
		}
	})
}

// TestUsageOnACluster reads usage on a 3-master Redis Cluster, where the
// rules' keys live in different slots: one pipeline, routed per key, and
// the figures of a single node.
func TestUsageOnACluster(t *testing.T) {
	rdb := redistest.Cluster(t)
	l, err := enforcer.New(rdb, mustSet(t, usageRules), enforcer.Options{Budget: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	now := at(500)
	for _, key := range []string{"c1", "c2", "c3"} {
		for range 4 {
			d, err := l.Check(ctx, &enforcer.Request{Descriptors: rules.Descriptors{rules.KeyAPIKey: key}, Now: now})
			if err != nil || d.Outcome != decision.Allowed {
				t.Fatalf("%v %+v", err, d)
			}
			_ = l.Release(ctx, &d)
		}
	}
	for _, key := range []string{"c1", "c2", "c3"} {
		u, err := l.Usage(ctx, rules.Descriptors{rules.KeyAPIKey: key}, now)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int64{}
		for _, ru := range u.Rules {
			if ru.Err != nil {
				t.Fatalf("%s %s: %v", key, ru.Rule.ID, ru.Err)
			}
			got[ru.Rule.ID] = ru.Remaining
		}
		if want := map[string]int64{"tb": 6, "sw": 8, "fw": 11, "cc": 20}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: %v, want %v", key, got, want)
		}
	}
}
