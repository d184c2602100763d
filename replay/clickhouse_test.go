package replay_test

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/analytics"
	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/internal/clickhousetest"
	"github.com/sluice-rl/sluice/replay"
)

// TestReplayClickHouseDown replays the generated scenario with --clickhouse
// and kills ClickHouse (SIGKILL) for 30 s as soon as the replay has
// migrated its schema, so that the whole replay runs while ClickHouse is
// down. The replay's decisions, dynamic rules and shares are those of a
// replay without ClickHouse (the enforcers, the detector and the
// aggregator did not wait for it), and once ClickHouse is back every
// decision, rule version and share is in it exactly once.
//
// About 40 s; it runs without the race detector (make test), since a
// replay under it takes five to ten times longer and the sink's code runs
// under it in package analytics' TestClickHouseDown.
func TestReplayClickHouseDown(t *testing.T) {
	// Beside the evaluation's replays (make test's test-norace-replay): for
	// 30 of its 40 s ClickHouse is down and the sink only waits, and what it
	// checks (the same outcomes as a run without ClickHouse, every row once
	// after) does not depend on the cores it gets.
	t.Parallel()
	srv := clickhousetest.New(t)
	ref := runGenerated(t, nil)

	co := analytics.ConnOptions{Addr: srv.Addr(), Database: "replay_down"}
	ctx, cancel := hangGuard(t)
	defer cancel()
	ms, err := analytics.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := analytics.Open(co)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	killed, restarted := make(chan time.Time, 1), make(chan error, 1)
	go func() {
		// Kill ClickHouse once the replay has migrated the schema (the
		// database exists only then: queries fail before).
		for ctx.Err() == nil {
			if v, err := analytics.SchemaVersion(ctx, conn); err == nil && v == ms[len(ms)-1].Version {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		srv.Kill()
		killed <- time.Now()
		time.Sleep(30 * time.Second)
		restarted <- srv.Restart()
	}()
	rep, err := replay.Run(ctx, replay.Options{ClickHouse: &co},
		replay.Generate(replay.Scenario{Duration: 4 * time.Minute, Clients: 200}))
	if err != nil {
		t.Fatal(err)
	}
	var down time.Time
	select {
	case down = <-killed:
	default:
		t.Fatal("the replay ended before ClickHouse was killed")
	}
	if err := <-restarted; err != nil {
		t.Fatal(err)
	}
	t.Logf("ClickHouse down for 30 s from %v after the replay's start; the sink: %+v", down.Sub(time.Now().Add(-rep.Elapsed)).Round(time.Millisecond), *rep.Sink)

	if len(rep.Problems) > 0 {
		t.Errorf("problems: %q", rep.Problems)
	}
	a := summary{ref.Outcomes, ref.DynamicRules, ref.ShareLog, ref.DeniedKeys("per-api-key")}
	b := summary{rep.Outcomes, rep.DynamicRules, rep.ShareLog, rep.DeniedKeys("per-api-key")}
	if !reflect.DeepEqual(a, b) {
		t.Errorf("the replay with ClickHouse down differs from the one without:\n%+v\n%+v", a.Outcomes, b.Outcomes)
	}
	if rep.Sink == nil || rep.Sink.InsertFailures == 0 {
		t.Errorf("sink stats %+v: want failed inserts while ClickHouse was down", rep.Sink)
	}

	// Every decision, rule version and share once.
	shares := map[string]bool{}
	for _, s := range rep.ShareLog {
		shares[fmt.Sprint(s.RuleID, "|", s.Key, "|", s.Region, "|", s.Version)] = true
	}
	versions := map[string]bool{}
	for _, r := range rep.DynamicRules {
		versions[fmt.Sprint(r.ID, "|", r.Version)] = true
	}
	for q, want := range map[string]int64{
		"SELECT count() FROM decisions FINAL":                     rep.Producer.Produced,
		"SELECT uniqExact(request_id) FROM decisions":             rep.Producer.Produced,
		"SELECT count() FROM dynamic_rules FINAL":                 int64(len(versions)),
		"SELECT count() FROM shares FINAL":                        int64(len(shares)),
		"SELECT countIf(outcome = 'denied') FROM decisions FINAL": int64(ref.Outcomes[decision.Denied]),
	} {
		var n uint64
		if err := conn.QueryRow(ctx, q).Scan(&n); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		if int64(n) != want {
			t.Errorf("%s: %d, want %d", q, n, want)
		}
	}
	if rep.Producer.Produced != int64(rep.Requests) || rep.Requests == 0 {
		t.Errorf("%d decisions produced of %d requests", rep.Producer.Produced, rep.Requests)
	}
}
