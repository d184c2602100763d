package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestReplayBackendFlags: `sluice replay --backend-degrade 0.4` simulates a
// backend whose error rate rises for two minutes, and the report shows the
// adaptive factor and the sheds over time; without the flags it has no such
// section.
func TestReplayBackendFlags(t *testing.T) {
	file := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(file, []byte(`
domain: replay
rules:
  - {id: per-route, match: [{key: route}], limit: 200, period: 1s, burst: 400, adaptive: {floor: 0.2}}
shedding:
  routes: {/v1/search: sheddable, /v1/items: sheddable, /v1/login: critical, /v1/orders: critical}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	page := filepath.Join(t.TempDir(), "report.html")
	run := func(args ...string) string {
		var out, errOut bytes.Buffer
		root := newRoot()
		root.SetArgs(append([]string{"replay", "--duration", "4m", "--rules", file, "--html", page}, args...))
		root.SetOut(&out)
		root.SetErr(&errOut)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := root.ExecuteContext(ctx); err != nil {
			t.Fatalf("replay %v: %v\n%s", args, err, errOut.String())
		}
		return out.String()
	}
	out := run("--backend-degrade", "0.4", "--backend-degrade-at", "1m", "--backend-degrade-for", "2m")
	if !strings.Contains(out, "Backend health, adaptive factor and load shedding") || !strings.Contains(out, "     70s   0.") {
		t.Errorf("no adaptive section with a cut factor at 70 s:\n%s", out)
	}
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`<h2 id="adaptive">`, "adaptive factor and the backend&#39;s 5xx share", "requests refused by load shedding, by priority", "sheddable"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("the page has no %q", want)
		}
	}
	if out := run(); strings.Contains(out, "Backend health") {
		t.Errorf("an adaptive section without --backend flags:\n%s", out)
	}
	if b, _ := os.ReadFile(page); strings.Contains(string(b), `<h2 id="adaptive">`) {
		t.Error("an adaptive chart section without --backend flags")
	}
}
