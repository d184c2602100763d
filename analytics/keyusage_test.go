package analytics

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/rules"
)

// hostileKey is the fixture's API key: a quote and a backslash, which the
// queries must bind, not paste.
const hostileKey = `k'1\`

// keyFixture is one key's traffic over two hours, beside two other keys'
// (one a prefix of it), for key_usage and KeyDenials; times from t0
// (10:00 UTC), now = t0+2h (12:00). "-" is a record without a request id
// (the sink derives one from its Kafka offset).
//
//	id   at     key      matched                     outcome          denying       shadow
//	k12  09:30  K        per-key                     denied           per-key       (before the report's range)
//	k01  10:05  K        per-key,per-account         allowed
//	k02  10:10  K        per-key,per-account         denied           per-key
//	k03  10:20  K        per-key,per-account         denied           per-account
//	k04  10:50  K        per-key                     denied           per-key
//	-    11:05  K        per-key                     denied           per-key
//	k05  11:10  K        per-key,per-account,search  denied           search
//	k10  11:15  k'1      per-key                     denied           per-key       (another key)
//	k11  11:15  other    per-key                     denied           per-key       (another key)
//	k06  11:20  K        per-key,search              shadow_denied                  search
//	k07  11:30  K        per-key                     degraded_closed  per-key
//	k08  11:40  K        per-key                     degraded_open
//	k09  11:50  K        (none)                      allowed
//	k13  12:00  K        per-key                     denied           per-key       (at now: outside [from, to))
func keyFixture() []decision.Record {
	type row struct {
		id, at, key, matched string
		outcome              decision.Outcome
		denying, shadow      string
	}
	A, D, S, DO, DC := decision.Allowed, decision.Denied, decision.ShadowDenied, decision.DegradedOpen, decision.DegradedClosed
	K := hostileKey
	rows := []row{
		{"k12", "-30m", K, "per-key", D, "per-key", ""},
		{"k01", "5m", K, "per-key,per-account", A, "", ""},
		{"k02", "10m", K, "per-key,per-account", D, "per-key", ""},
		{"k03", "20m", K, "per-key,per-account", D, "per-account", ""},
		{"k04", "50m", K, "per-key", D, "per-key", ""},
		{"", "65m", K, "per-key", D, "per-key", ""},
		{"k05", "70m", K, "per-key,per-account,search", D, "search", ""},
		{"k10", "75m", `k'1`, "per-key", D, "per-key", ""},
		{"k11", "75m", "other", "per-key", D, "per-key", ""},
		{"k06", "80m", K, "per-key,search", S, "", "search"},
		{"k07", "90m", K, "per-key", DC, "per-key", ""},
		{"k08", "100m", K, "per-key", DO, "", ""},
		{"k09", "110m", K, "", A, "", ""},
		{"k13", "120m", K, "per-key", D, "per-key", ""},
	}
	recs := make([]decision.Record, len(rows))
	for i, r := range rows {
		at, err := time.ParseDuration(r.at)
		if err != nil {
			panic(err)
		}
		var d rules.Descriptors
		d[rules.KeyAPIKey] = r.key
		var matched []string
		if r.matched != "" {
			matched = strings.Split(r.matched, ",")
		}
		recs[i] = decision.Record{Time: t0.Add(at), Region: "eu", Instance: "gw", RequestID: r.id, Domain: "sluice",
			Descriptors: d, Matched: matched, Outcome: r.outcome, DenyingRule: r.denying, ShadowRule: r.shadow,
			Path: decision.PathRedis, Cost: 1}
	}
	return recs
}

// wantKeyUsage is key_usage over [10:00, 12:00) for K, by hand from the
// table: each record counts in its hour's (all) row and in each matched
// rule's row; denied in a rule's row only where that rule denied.
//
//	10:00  (all) k01 k02 k03 k04: allowed k01; denied k02 k03 k04
//	       per-account k01 k02 k03: allowed k01; denied k03
//	       per-key k01-k04: allowed k01; denied k02 k04
//	11:00  (all) - k05 k06 k07 k08 k09: allowed k06 k08 k09; denied - k05; unavailable k07
//	       (none) k09; per-account k05 (denied by search, not by it)
//	       per-key - k05 k06 k07 k08: allowed k06 k08; denied -; unavailable k07
//	       search k05 k06: allowed k06; denied k05
const wantKeyUsage = `
hour                 rule         requests  allowed  denied  unavailable
2026-11-02 10:00:00  (all)        4         1        3       0
2026-11-02 10:00:00  per-account  3         1        1       0
2026-11-02 10:00:00  per-key      4         1        2       0
2026-11-02 11:00:00  (all)        6         3        2       1
2026-11-02 11:00:00  (none)       1         1        0       0
2026-11-02 11:00:00  per-account  1         0        0       0
2026-11-02 11:00:00  per-key      5         2        1       1
2026-11-02 11:00:00  search       2         1        1       0
`

// wantKeyDenials is KeyDenials at 12:00 for K: outcome denied only (k07 is
// degraded_closed), by denying rule. Last hour [11:00, 12:00): - (per-key),
// k05 (search). Last day: k12 k02 k04 - (per-key), k03 (per-account), k05
// (search); k13 is at now, outside.
var wantKeyDenials = map[string]KeyDenial{
	"per-key":     {LastHour: 1, LastDay: 4},
	"per-account": {LastHour: 0, LastDay: 1},
	"search":      {LastHour: 1, LastDay: 1},
}

// TestKeyUsageMatchesTheFixture is must-show 3: key_usage and KeyDenials
// (the /v1/usage denial counts) over the fixture, written by the sink from
// Kafka, match the hand-computed tables; then every record is redelivered
// (a second sink group reads the topic again, merges stopped so that every
// duplicate stays on disk) and they still match.
func TestKeyUsageMatchesTheFixture(t *testing.T) {
	conn, _ := migrated(t, shared(t))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, tb := range []string{"decisions", "decisions_per_minute"} {
		if err := conn.Exec(ctx, "SYSTEM STOP MERGES "+tb); err != nil {
			t.Fatal(err)
		}
	}
	brokers := newKafka(t)
	recs := keyFixture()
	produce(t, brokers, recs)
	written := func(s *Sink) func() (bool, string) {
		return func() (bool, string) {
			st := s.Stats()
			return st.Rows[TableDecisions] == int64(len(recs)) && s.Lag() == 0, fmt.Sprintf("stats %+v, lag %d", st, s.Lag())
		}
	}
	first := runSink(t, brokers, "sink-first", conn, func(o *SinkOptions) { o.NoOutput = true })
	waitFor(t, time.Minute, written(first))
	checkKeyUsage(t, conn)

	second := runSink(t, brokers, "sink-redelivery", conn, func(o *SinkOptions) { o.NoOutput = true })
	waitFor(t, time.Minute, written(second))
	if raw, final := count(t, conn, "SELECT count() FROM decisions"), count(t, conn, "SELECT count() FROM decisions FINAL"); raw != uint64(2*len(recs)) || final != uint64(len(recs)) {
		t.Errorf("decisions: %d rows on disk and %d after FINAL: want every row twice, and once", raw, final)
	}
	checkKeyUsage(t, conn)
}

func checkKeyUsage(t *testing.T, conn driver.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tb, err := RunReport(ctx, conn, "key-usage", ReportParams{From: t0, To: t0.Add(2 * time.Hour), APIKey: hostileKey})
	if err != nil {
		t.Fatal(err)
	}
	if got := table(t, tb); normalise(got) != normalise(wantKeyUsage) {
		t.Errorf("key_usage:\n%s\nwant\n%s", got, wantKeyUsage)
	}
	got, err := KeyDenials(ctx, conn, hostileKey, t0.Add(2*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(wantKeyDenials) {
		t.Errorf("KeyDenials: %v, want %v", got, wantKeyDenials)
	}
	// Another key sees only its own; a key nobody used, nothing.
	if other, err := KeyDenials(ctx, conn, `k'1`, t0.Add(2*time.Hour)); err != nil || fmt.Sprint(other) != fmt.Sprint(map[string]KeyDenial{"per-key": {1, 1}}) {
		t.Errorf("KeyDenials of k'1: %v %v", other, err)
	}
	if none, err := KeyDenials(ctx, conn, "' OR 1=1 --", t0.Add(2*time.Hour)); err != nil || len(none) != 0 {
		t.Errorf("KeyDenials of an injection: %v %v", none, err)
	}
	if _, err := RunReport(ctx, conn, "key_usage", ReportParams{From: t0, To: t0.Add(time.Hour)}); !errors.Is(err, ErrNoAPIKey) {
		t.Errorf("key_usage without a key: %v, want ErrNoAPIKey", err)
	}
}
