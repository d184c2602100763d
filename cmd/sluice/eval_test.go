package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/detector/enrich"
	"github.com/sluice-rl/sluice/replay"
)

// `sluice eval` rejects bad flags before any replay, and with --json prints
// the result: here one attack alone over a real log (SecRepo 2022, 1 700
// lines) with its --abusive-file, both detected. The generated background
// (93 000 requests, 30 s without the race detector and over 3 min under it)
// is replay.TestEvalInjectedScenarios's.
func TestEvalCommand(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, args := range [][]string{
		{"eval", "--scenarios", "nope"},
		{"eval", "--orders", "0"},
		{"eval", "--abusive", "client_ip"},
		{"eval", "--abusive", "nosuchkey=1"},
		{"eval", "--abusive", "client_ip=10.0.0.0/33"},
		{"eval", "--abusive", "client_ip=999.1.1.1"},
		{"eval", "--abusive", "asn=AS-one"},
		{"eval", "--abusive", "user_agent=curl"},
		{"eval", "--abusive", "client_ip=192.0.2.1,client_ip=192.0.2.2"},
		{"eval", "--abusive", ":client_ip=192.0.2.1"},
		{"eval", "--orders", "1000000000"},
		{"eval", "--redis-db", "2"},
		{"eval", "--redis", "127.0.0.1"},
		{"eval", "--redis", "127.0.0.1:notaport"},
		{"eval", "--scenarios", ""},
		{"eval", "--data", "/no/such/data"},
		{"eval", "--abusive-file", "/no/such.abusive"},
		{"eval", "--background", "/no/such.log"},
		{"eval", "--background", os.TempDir()},
		{"eval", "--abusive", "client_ip=0.0.0.0/0"},
		{"eval", "--abusive", "client_ip=::/0"},
	} {
		root := newRoot()
		root.SetArgs(args)
		root.SetOut(&bytes.Buffer{})
		root.SetErr(&bytes.Buffer{})
		err := root.ExecuteContext(ctx)
		if err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(args[1], "--")) {
			t.Errorf("%v: error %v, want one naming %s", args, err, args[1])
		}
	}

	data, err := enrich.FindData(".")
	if err != nil {
		t.Skipf("../shared/data absent (%v): the eval's background is a real log kept there", err)
	}
	var out, errOut bytes.Buffer
	root := newRoot()
	root.SetArgs([]string{"eval", "--scenarios", "uri-scan", "--orders", "1", "--json",
		"--background", filepath.Join(data, "access-logs", "secrepo-2022-12-22.log"),
		"--abusive-file", "../../testdata/eval/secrepo-2022-12-22.abusive"})
	root.SetOut(&out)
	root.SetErr(&errOut)
	if err := root.ExecuteContext(ctx); err != nil {
		t.Fatalf("eval: %v\n%s", err, errOut.String())
	}
	var res replay.EvalResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("--json: %v\n%s", err, out.String())
	}
	var names []string
	for _, sc := range res.Scenarios {
		names = append(names, sc.Scenario)
		if sc.Missed != 0 {
			t.Errorf("%s missed", sc.Scenario)
		}
	}
	if len(res.Runs) != 1 || !slices.Contains(names, "uri-scan") || !slices.Contains(names, "background rotating-prober") ||
		res.Recall < 1 || res.Precision < 1 || res.Collateral != 0 || len(res.Unmatched) != 0 {
		t.Errorf("one run detecting uri-scan and the rotating prober without a false positive, want; got %s", out.String())
	}
}

// The real logs' --abusive-files parse; a bad line is an error naming the
// file and line, and names group values into one attacker.
func TestAbusiveFiles(t *testing.T) {
	for _, f := range []string{"secrepo-2018-12-15", "secrepo-2022-12-22", "elastic-apache_logs"} {
		vals, err := readAbusiveFile("../../testdata/eval/" + f + ".abusive")
		if err != nil || len(vals) == 0 {
			t.Errorf("%s: %d values, %v", f, len(vals), err)
		}
	}
	ba, err := parseAbusive("prober: client_ip=198.51.100.0/24")
	if err != nil || ba.Name != "background prober" || ba.Scope["client_ip"] != "198.51.100.0/24" {
		t.Errorf("parseAbusive: %q %v %v", ba.Name, ba.Scope, err)
	}
	bad := t.TempDir() + "/bad.abusive"
	if err := os.WriteFile(bad, []byte("# ok\nclient_ip=192.0.2.1\nclient_ip\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readAbusiveFile(bad); err == nil || !strings.Contains(err.Error(), "bad.abusive:3") {
		t.Errorf("bad line 3: %v", err)
	}
}
