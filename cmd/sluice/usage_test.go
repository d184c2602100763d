package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/analytics"
	"github.com/sluice-rl/sluice/enforcer/sidecar"
	"github.com/sluice-rl/sluice/internal/clickhousetest"
	"github.com/sluice-rl/sluice/internal/redistest"
)

// TestServeUsageWithClickHouse runs sluice serve (the example rules) with
// --usage-clickhouse over a decisions table that holds, for key k1, a
// per-api-key denial ten minutes ago (written twice: a redelivery) and one
// three hours ago, and another key's: GET /v1/usage with k1 says 1 in the
// last hour and 2 in the last day for per-api-key, 0 for per-ip. With
// --no-usage the path is not served.
func TestServeUsageWithClickHouse(t *testing.T) {
	ch := clickhousetest.New(t)
	o := analytics.ConnOptions{Addr: ch.Addr(), Database: ch.Database(t)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := analytics.Migrate(ctx, o); err != nil {
		t.Fatal(err)
	}
	conn, err := analytics.Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.Exec(ctx, "SYSTEM STOP MERGES decisions"); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for range 2 { // every row twice: a redelivered batch
		b, err := conn.PrepareBatch(ctx, "INSERT INTO decisions (event_time, event_time_ms, request_id, api_key, outcome, matched_rules, denying_rule)")
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range []struct {
			ago     time.Duration
			id, key string
		}{{10 * time.Minute, "r1", "k1"}, {3 * time.Hour, "r2", "k1"}, {5 * time.Minute, "r3", "k2"}} {
			at := now.Add(-r.ago).Truncate(time.Second)
			if err := b.Append(at, at.UnixMilli(), r.id, r.key, "denied", []string{"per-api-key"}, "per-api-key"); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Send(); err != nil {
			t.Fatal(err)
		}
	}

	addr, err := startServe(t, serveConfig{Redis: []string{redistest.Addr(t)}, UsageClickHouse: usageClickHouse{Addr: o.Addr, Database: o.Database, Password: o.Password}})
	if err != nil {
		t.Fatal(err)
	}
	code, body := getUsage(t, addr, "k1")
	if code != http.StatusOK {
		t.Fatalf("/v1/usage: %d %s", code, body)
	}
	var u sidecar.UsageResponse
	if err := json.Unmarshal([]byte(body), &u); err != nil {
		t.Fatal(err)
	}
	got := map[string][2]int64{}
	for _, r := range u.Rules {
		if r.DeniedLastHour == nil || r.DeniedLastDay == nil {
			t.Fatalf("rule %s has no denial counts:\n%s", r.ID, body)
		}
		got[r.ID] = [2]int64{*r.DeniedLastHour, *r.DeniedLastDay}
	}
	if want := map[string][2]int64{"per-api-key": {1, 2}}; u.Denials != "clickhouse" || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("denials %s %v, want clickhouse %v:\n%s", u.Denials, got, want, body)
	}

	off, err := startServe(t, serveConfig{Redis: []string{redistest.Addr(t)}, Server: sidecar.Options{Usage: sidecar.UsageOptions{Off: true}}})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + off + "/v1/usage")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("with --no-usage: %d, want 404", resp.StatusCode)
	}
}
