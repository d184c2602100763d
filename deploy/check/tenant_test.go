package check

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	chschema "github.com/sluice-rl/sluice/deploy/clickhouse"
)

const tenantDashboardFile = "../grafana/sluice-tenant.json"

// tenantDashboard is what TestTenantDashboard reads of
// deploy/grafana/sluice-tenant.json.
type tenantDashboard struct {
	Title      string `json:"title"`
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Query      any    `json:"query"`
			Datasource struct {
				Type string `json:"type"`
			} `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID         int    `json:"id"`
		Type       string `json:"type"`
		Title      string `json:"title"`
		Datasource struct {
			Type string `json:"type"`
		} `json:"datasource"`
		GridPos gridPos `json:"gridPos"`
		Targets []struct {
			RefID  string `json:"refId"`
			Expr   string `json:"expr"`
			RawSQL string `json:"rawSql"`
		} `json:"targets"`
	} `json:"panels"`
}

const (
	promType       = "prometheus"
	clickhouseType = "grafana-clickhouse-datasource"
	keyFilter      = "api_key = ${api_key:sqlstring}"
)

// TestTenantDashboard checks deploy/grafana/sluice-tenant.json as
// TestDashboard checks sluice.json (JSON with a title and uid, unique panel
// ids, no overlaps, PromQL that parses and names registered metrics), and
// its ClickHouse side: it has an api_key variable, every ClickHouse query
// filters on it, and every query (panels and variables) runs on a real
// clickhouse-server with the schema's migrations, with Grafana's macros
// expanded as the ClickHouse plugin expands them (time buckets are written
// with $__interval_ms, as 18.16 has no toStartOfInterval), over rows of two keys
// (each written twice, as a redelivery writes them): the key's panels
// count its own rows once and never show the other key's.
func TestTenantDashboard(t *testing.T) {
	b, err := os.ReadFile(tenantDashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d tenantDashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", tenantDashboardFile, err)
	}
	if d.Title == "" || d.UID == "" || d.UID == "sluice-overview" || len(d.Panels) == 0 {
		t.Fatalf("%s: want a title, a uid of its own and panels", tenantDashboardFile)
	}
	var sqls []string // every ClickHouse query: variables', then panels'
	hasKey := false
	for _, v := range d.Templating.List {
		if v.Name == "api_key" && v.Type == "textbox" {
			hasKey = true
		}
		if q, ok := v.Query.(string); ok && v.Datasource.Type == clickhouseType {
			sqls = append(sqls, q)
		}
	}
	if !hasKey {
		t.Error("no api_key textbox variable: the dashboard is one key's")
	}
	names, _ := registeredMetrics(t)
	var layout panelLayout
	for _, p := range d.Panels {
		layout.check(t, p.ID, p.Type, p.Title, len(p.Targets), p.GridPos)
		for _, tg := range p.Targets {
			switch p.Datasource.Type {
			case promType:
				expr, err := promqlParser.ParseExpr(strings.NewReplacer("$__rate_interval", "5m", "$rule", "per-key").Replace(tg.Expr))
				if err != nil {
					t.Errorf("panel %q target %s: %v", p.Title, tg.RefID, err)
					continue
				}
				for _, name := range metricsIn(expr) {
					if !checkMetric(names, name) {
						t.Errorf("panel %q: metric %s is not registered by any sluice process", p.Title, name)
					}
				}
			case clickhouseType:
				sqls = append(sqls, tg.RawSQL)
			default:
				t.Errorf("panel %q: datasource %q, want %s or %s", p.Title, p.Datasource.Type, promType, clickhouseType)
			}
		}
	}
	for _, q := range sqls {
		if !strings.Contains(q, keyFilter) {
			t.Errorf("a ClickHouse query does not filter on the key (%s):\n%s", keyFilter, q)
		}
	}

	ch := startClickHouse(t)
	for _, name := range migrations(t) {
		b, err := fs.ReadFile(chschema.Files, name)
		if err != nil {
			t.Fatal(err)
		}
		ch.run(t, string(b))
	}
	t0 := time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)
	// Key k'1 (a quote: sqlstring must escape it): two denials by per-key,
	// one by per-account, an allowed request; key other: denials by
	// other-only. Every row twice: a redelivered batch.
	type row struct {
		at           time.Duration
		key, outcome string
		matched      []string
		deny, id     string
		remaining    int
	}
	rows := []row{
		{1 * time.Minute, "k'1", "allowed", []string{"per-key", "per-account"}, "", "a1", 5},
		{2 * time.Minute, "k'1", "denied", []string{"per-key", "per-account"}, "per-key", "a2", 0},
		{3 * time.Minute, "k'1", "denied", []string{"per-key"}, "per-key", "a3", 0},
		{4 * time.Minute, "k'1", "denied", []string{"per-key", "per-account"}, "per-account", "a4", 0},
		{5 * time.Minute, "other", "denied", []string{"other-only"}, "other-only", "b1", 0},
	}
	var vals []string
	for _, r := range rows {
		quoted := make([]string, len(r.matched))
		for i, m := range r.matched {
			quoted[i] = "'" + m + "'"
		}
		vals = append(vals, fmt.Sprintf("(toDateTime(%d), %d, '%s', %s, '%s', [%s], '%s', %d)",
			t0.Add(r.at).Unix(), t0.Add(r.at).UnixMilli(), r.id, sqlString(r.key), r.outcome, strings.Join(quoted, ","), r.deny, r.remaining))
	}
	insert := "INSERT INTO decisions (event_time, event_time_ms, request_id, api_key, outcome, matched_rules, denying_rule, remaining) VALUES " + strings.Join(vals, ", ")
	ch.run(t, "SYSTEM STOP MERGES decisions")
	ch.run(t, insert)
	ch.run(t, insert)

	macros := strings.NewReplacer(
		"${api_key:sqlstring}", sqlString("k'1"),
		"$__timeFilter(event_time)", fmt.Sprintf("event_time >= toDateTime(%d) AND event_time <= toDateTime(%d)", t0.Unix(), t0.Add(time.Hour).Unix()),
		"$__interval_ms", "60000",
	)
	outs := map[string]string{}
	for _, q := range sqls {
		out := ch.run(t, macros.Replace(q))
		outs[q] = out
		if strings.Contains(out, "other-only") {
			t.Errorf("a query for key k'1 shows key other's rule:\n%s\n%s", q, out)
		}
	}
	// The denials table: per-key 2, per-account 1, each once.
	for q, out := range outs {
		if strings.Contains(q, "count() AS denied, min(event_time)") {
			want := "per-key\t2\t2026-11-02 10:02:00\t2026-11-02 10:03:00\nper-account\t1\t2026-11-02 10:04:00\t2026-11-02 10:04:00\n"
			if out != want {
				t.Errorf("denials by rule:\n%q\nwant\n%q", out, want)
			}
		}
		if strings.Contains(q, "arrayJoin(matched_rules)") && out != "per-account\nper-key\n" {
			t.Errorf("the rule variable: %q, want per-account and per-key", out)
		}
	}
}

// sqlString quotes s as Grafana's sqlstring format does: ' doubled, in
// single quotes.
func sqlString(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// migrations lists the schema's migrations in order.
func migrations(t *testing.T) []string {
	t.Helper()
	names, err := fs.Glob(chschema.Files, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	return names
}

// clickhouse is a clickhouse-server for one test, on a loopback port.
type clickhouse struct {
	client string
	port   int
}

// startClickHouse starts a clickhouse-server with the schema package's
// server.xml, stopped at cleanup; skipped (failed under CI) without one.
func startClickHouse(t *testing.T) *clickhouse {
	t.Helper()
	bin, err := exec.LookPath("clickhouse-server")
	if err != nil {
		bin = "/usr/sbin/clickhouse-server"
	}
	client, cerr := exec.LookPath("clickhouse-client")
	if _, err := os.Stat(bin); err != nil || cerr != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("clickhouse-server or clickhouse-client not found: .ci/run must install them (deploy/ci/deps.sh)")
		}
		t.Skip("no clickhouse-server and clickhouse-client: run `make test`, which installs them")
	}
	dir := t.TempDir()
	for _, sub := range []string{"data", "tmp", "user_files", "format_schemas"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cfg := strings.NewReplacer("{dir}", dir, "{port}", strconv.Itoa(port)).Replace(chschema.ServerConfig)
	if err := os.WriteFile(filepath.Join(dir, "config.xml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config-file="+filepath.Join(dir, "config.xml"))
	cmd.Dir = dir
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	c := &clickhouse{client: client, port: port}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := c.query("SELECT 1"); err == nil {
			return c
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "server.err.log"))
			t.Fatalf("clickhouse-server exited; its error log:\n%s", log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("clickhouse-server did not answer within 60 s")
		}
	}
}

func (c *clickhouse) query(q string) (string, error) {
	cmd := exec.Command(c.client, "--host", "127.0.0.1", "--port", strconv.Itoa(c.port), "--multiquery", "--query", q)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%w: %s", err, out)
	}
	return string(out), nil
}

// run runs q (statements separated by ';'), failing t on an error, and
// returns its output (TabSeparated).
func (c *clickhouse) run(t *testing.T, q string) string {
	t.Helper()
	out, err := c.query(q)
	if err != nil {
		t.Fatalf("%v\n%s", err, q)
	}
	return out
}
