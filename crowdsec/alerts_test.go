package crowdsec

import (
	"context"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/internal/crowdsectest"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
)

// hhRule is a heavy-hitter rule as the detector emits it.
func hhRule(ip string, version int64) rules.Rule {
	return rules.Rule{ID: "dyn-hh-" + strings.ReplaceAll(ip, ".", ""), Match: []rules.Match{{Key: rules.KeyClientIP, Value: ip}},
		Limit: 10, Burst: 10, Period: 10 * time.Second, Mode: rules.Shadow, Origin: "detector/heavy-hitter",
		Reason:    "client_ip " + ip + " sent 76 requests in the 10s window",
		Evidence:  map[string]string{"count": "76", "window_start": "2026-01-01T00:01:00Z", "window_end": "2026-01-01T00:01:10Z"},
		ExpiresAt: time.Date(2026, 1, 1, 0, 11, 10, 0, time.UTC), Version: version}
}

// TestAlertsFor: each kind of detector rule becomes alerts about its
// source, with its evidence; an API key never leaves as it is.
func TestAlertsFor(t *testing.T) {
	hh := hhRule("198.51.100.250", 1)
	as := AlertsFor(&hh, false, "v1")
	if len(as) != 1 {
		t.Fatalf("%d alerts", len(as))
	}
	a := as[0]
	if a.Scenario != "sluice/heavy-hitter" || a.Source != (Source{Scope: "Ip", Value: "198.51.100.250", IP: "198.51.100.250"}) ||
		a.EventsCount != 76 || !a.Simulated || a.Remediation || a.StartAt != "2026-01-01T00:01:00Z" || a.StopAt != "2026-01-01T00:01:10Z" ||
		a.ScenarioVersion != "v1" || a.Leakspeed != "10s" || len(a.Events) != 1 || a.Decisions == nil {
		t.Errorf("heavy hitter: %+v", a)
	}
	b, _ := json.Marshal(a)
	if !strings.Contains(string(b), `"key":"count","value":"76"`) || !strings.Contains(string(b), `"decisions":[]`) {
		t.Errorf("JSON: %s", b)
	}
	cluster := rules.Rule{ID: "c", Match: []rules.Match{{Key: rules.KeyASN, Value: "64500"}, {Key: rules.KeyRoute, Value: "/v1/search"}},
		Limit: 5, Period: time.Second, Mode: rules.Enforce, Origin: "detector/asn-concentration"}
	if as := AlertsFor(&cluster, true, ""); len(as) != 1 || as[0].Source.Scope != "AS" || as[0].Source.AsNumber != "64500" ||
		as[0].Simulated || !as[0].Remediation || as[0].EventsCount != 1 || as[0].Scenario != "sluice/asn-concentration" {
		t.Errorf("asn and route: %+v", as)
	}
	nets := rules.Rule{ID: "n", Match: []rules.Match{{Key: rules.KeyClientIP, CIDR: []netip.Prefix{
		netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("192.0.2.9/32")}}}, Limit: 1, Period: time.Second, Origin: "detector/content"}
	if as := AlertsFor(&nets, false, ""); len(as) != 2 || as[0].Source.Scope != "Range" || as[0].Source.Range != "203.0.113.0/24" ||
		as[1].Source.Scope != "Ip" || as[1].Source.IP != "192.0.2.9" {
		t.Errorf("networks: %+v", as)
	}
	key := rules.Rule{ID: "k", Match: []rules.Match{{Key: rules.KeyAPIKey, Value: "sk_live_secret"}}, Limit: 1, Period: time.Second, Origin: "detector/x"}
	as = AlertsFor(&key, false, "")
	b, _ = json.Marshal(as)
	if len(as) != 1 || strings.Contains(string(b), "sk_live_secret") || !strings.HasPrefix(as[0].Source.Value, "sha256:") {
		t.Errorf("an API key leaves as it is: %s", b)
	}
}

// TestAlertPusher: against a real Local API, the detector's rules become
// alerts that cscli alerts list shows, other origins and repeated versions
// do not; while the Local API is down alerts wait, and go once it is back.
func TestAlertPusher(t *testing.T) {
	lapi := crowdsectest.New(t)
	pw := lapi.AddMachine("sluice-detector")
	cl, err := NewClient(ClientOptions{URL: lapi.URL(), MachineID: "sluice-detector", Password: pw, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	p, err := NewAlertPusher(AlertOptions{Client: cl, Registerer: reg, RetryMax: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Run(context.Background()) }()
	t.Cleanup(func() { p.Close(); <-done })
	op := hhRule("192.0.2.1", 1)
	op.Origin = "operator/alice"
	out := stage.Output{Rules: []rules.Rule{hhRule("198.51.100.250", 1), op}}
	_ = p.Write(context.Background(), out)
	_ = p.Write(context.Background(), out) // the same version again: not pushed twice
	flush := func(d time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		return p.Flush(ctx)
	}
	if err := flush(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	list := func() []map[string]any {
		t.Helper()
		js, err := lapi.Cscli("alerts", "list", "-a", "-o", "json")
		if err != nil {
			t.Fatal(err)
		}
		var as []map[string]any
		if err := json.Unmarshal([]byte(js), &as); err != nil {
			t.Fatalf("cscli alerts list -o json: %v: %s", err, js)
		}
		return as
	}
	as := list()
	if len(as) != 1 || as[0]["scenario"] != "sluice/heavy-hitter" || as[0]["source"].(map[string]any)["value"] != "198.51.100.250" ||
		as[0]["events_count"] != float64(76) || as[0]["machine_id"] != "sluice-detector" {
		t.Fatalf("alerts: %v", as)
	}

	lapi.Stop()
	_ = p.Write(context.Background(), stage.Output{Rules: []rules.Rule{hhRule("198.51.100.251", 2)}})
	if err := flush(time.Second); err == nil || p.Pending() != 1 {
		t.Fatalf("flush while the Local API is down: %v, pending %d", err, p.Pending())
	}
	if err := lapi.Start(); err != nil {
		t.Fatal(err)
	}
	if err := flush(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	if as := list(); len(as) != 2 {
		t.Errorf("after the Local API is back: %d alerts, want 2", len(as))
	}
}
